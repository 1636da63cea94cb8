"""The one-row decode GEMVs compiled for sm_90 on this CPU machine (no GPU): registers, spills and
the SASS instruction mix of each launch the runtime takes at one FP8 row, before a device call.
The gate|up GEMM with the activation in its epilogue (kernels/gemm_glu.py), each candidate launch:
wgmma, cp.async pipelining, spills and shared memory. Also the paged decode attention over an FP8 cache at its launch (paged_attention_decode.choose_tile):
its byte-wide shared-memory loads (LDS.U8), which V_PAIRS exists to remove.

    .venv/bin/python e2e/sm90_asm.py [--sass-top 12]

For each 1-row gemv.py entry of kernels/fp8_dispatch.FP8_SMALL_M (and the qkv entry's rope fold,
kernels/gemv_rope.py) it compiles the kernel as a launch specializes it (pointers and the
shape's ints tagged 16-divisible, as Triton's JIT tags them at run time; without those tags the
weight loads come out as single bytes), then reads the cubin with the cuobjdump that Triton ships.
A launch that spills (STACK > 0) or loads less than 16 bytes a thread is worth fixing before it
costs device time; the per-weight counts say what the loop issues for each weight it streams.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

DIVISIBLE = ("N", "K", "inter", "k_per_split", "stride_xm", "stride_wn", "stride_om", "stride_rm", "stride_hm",
             "stride_qt", "stride_qh", "stride_cb", "stride_cs", "stride_ch", "stride_bt", "stride_ot", "stride_oh")


def compile_sm90(kernel, pointers: dict, consts: dict, num_warps: int, num_stages: int = 1):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {}
    for name in kernel.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = pointers.get(name, "*bf16")
        elif name in ("eps", "k_scale", "v_scale", "qk_scale", "cap_log2"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(kernel.arg_names)
             if n.endswith("_ptr") or n in DIVISIBLE}
    return triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=consts, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "num_stages": num_stages})


def inspect_cubin(cubin: bytes) -> dict:
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
    regs = int(re.search(r"REG:(\d+)", usage).group(1))
    stack = int(re.search(r"STACK:(\d+)", usage).group(1))
    ops = collections.Counter(m.group(1) for m in re.finditer(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\d+\s+)?([A-Z0-9_]+)", sass))
    wide_loads = len(re.findall(r"LDG\.E\.(?:EF\.)?(?:EL\.)?(?:LTC\w+\.)?128", sass))
    byte_lds = len(re.findall(r"\bLDS\.U8\b", sass))
    return dict(regs=regs, stack=stack, ops=ops, ldg_128=wide_loads, lds_u8=byte_lds)


def decode_fp8_launch(v_pairs: bool = True):
    """The FP8-cache decode kernel as W1's decode launches it (bf16 queries, Llama's 4-head groups,
    head_dim 128, 16-token blocks, one split, the tile choose_tile gives an FP8 cache)."""
    from pagoda.kernels import paged_attention_decode as decode

    block_n, warps, stages = decode.FAT_TILE
    pointers = {"q_ptr": "*bf16", "k_cache_ptr": "*fp8e4nv", "v_cache_ptr": "*fp8e4nv", "block_tables_ptr": "*i32",
                "seq_lens_ptr": "*i32", "query_start_loc_ptr": "*i32", "out_ptr": "*bf16", "part_out_ptr": "*fp32",
                "part_lse_ptr": "*fp32", "counters_ptr": "*i32"}
    consts = dict(NUM_SPLITS=1, GROUP=4, BLOCK_G=16, HEAD_DIM=128, BLOCK_D=128, BLOCK_SIZE=16, BLOCK_N=block_n,
                  SOFTCAP=False, PRECISION="tf32", FP8_AS_F16=True, V_PAIRS=v_pairs, PDL=True, FUSED=False, MERGE_G=4)
    return compile_sm90(decode._decode_kernel, pointers, consts, warps, stages)


def gemm_glu_launch(cfg):
    """kernels/gemm_glu.py's launch for one config, as the engine runs it (bf16, SiLU; M unspecialised;
    the TMA form's x and weight as host tensor descriptors of the config's boxes)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from pagoda.kernels.gemm_glu import _gemm_glu_kernel, _gemm_glu_tma_kernel

    consts = dict(ACTIVATION="silu", PRECISION="tf32", BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                  BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m)
    if not cfg.tma:
        return compile_sm90(_gemm_glu_kernel, {}, consts, cfg.num_warps, cfg.num_stages)
    kernel, consts = _gemm_glu_tma_kernel, dict(consts, NUM_STAGES=cfg.num_stages)
    sig = {"x_desc": f"tensordesc<bf16[{cfg.block_m}, {cfg.block_k}]>",
           "w_desc": f"tensordesc<bf16[{cfg.block_n}, {cfg.block_k}]>",
           "out_ptr": "*bf16", "M": "i32", "inter": "i32", "K": "i32", "stride_om": "i32"}
    sig |= {name: "constexpr" for name in consts}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(kernel.arg_names) if n in sig and n != "M"
             and not n.endswith("_desc") and sig[n] != "constexpr"}
    return triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=consts, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options={"num_warps": cfg.num_warps})


def launches():
    """(label, kernel, pointer types, constexprs, num_warps, weights a thread loads per loop chunk)."""
    from pagoda.kernels import fp8_dispatch
    from pagoda.kernels.gemv import _gemv_kernel
    from pagoda.kernels.gemv_rope import _gemv_rope_kv_kernel

    base = dict(M=1, HAS_SCALE=True, SCALE_PER_ROW=True, HAS_BIAS=False, SILU_MUL=False, PARTIAL=False, NORM=False,
                RESIDUAL=False, GLU_OUT=False, SUMSQ_IN=False, SUMSQ_OUT=False, BLOCK_P=1, PDL=True)
    pointers = {"w_ptr": "*fp8e4nv", "scale_ptr": "*fp32", "sq_ptr": "*fp32"}
    for (rows, n, k, act), launch in fp8_dispatch.FP8_SMALL_M.items():
        if rows != 1 or launch.path != "gemv":
            continue
        c = launch.config
        consts = dict(base, SILU_MUL=act == "silu_mul", GLU_OUT=act == "silu_mul_out", EVEN_K=k % c.block_k == 0,
                      PARTIAL=c.split_k > 1, BLOCK_N=c.block_n, BLOCK_K=c.block_k, FOLD=min(c.fold, c.block_k))
        # the first chunk is peeled (loaded before the PDL wait), so the SASS holds the chunk's code twice
        copies = 1 if c.block_k >= k else 2
        per_thread = copies * c.block_n * c.block_k * (2 if act == "silu_mul_out" else 1) // (32 * c.num_warps)
        yield f"gemv {n}x{k} {act or ''}".strip(), _gemv_kernel, pointers, consts, c.num_warps, per_thread
        if act is None and n == 6144:
            rope = dict(HALF=64, HAS_SCALE=True, SCALE_PER_ROW=True, HAS_BIAS=False, EVEN_K=k % c.block_k == 0,
                        BLOCK_N=c.block_n, BLOCK_K=c.block_k, FOLD=min(c.fold, c.block_k), FP8=False,
                        ROUND_FIRST=False, PDL=True)
            rope_ptrs = dict(pointers, cos_sin_ptr="*fp32", pos_ptr="*i64", slot_ptr="*i64")
            yield (f"gemv_rope {n}x{k}", _gemv_rope_kv_kernel, rope_ptrs, rope, c.num_warps,
                   2 * copies * c.block_n * c.block_k // (32 * c.num_warps))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sass-top", type=int, default=8, help="the most frequent SASS instructions to list")
    args = p.parse_args(argv)
    for label, kernel, pointers, consts, warps, per_thread in launches():
        info = inspect_cubin(compile_sm90(kernel, pointers, consts, warps).asm["cubin"])
        ops = info["ops"]
        # per weight a thread streams (each chunk's code counted once)
        per_weight = {op: round(ops[op] / per_thread, 2) for op in ("F2FP", "HADD2", "FFMA") if ops[op]}
        top = ", ".join(f"{op} {c}" for op, c in ops.most_common(args.sass_top))
        print(f"{label:28s} regs {info['regs']:3d}  spill bytes {info['stack']:4d}  16-byte loads {info['ldg_128']:3d}  "
              f"per weight {per_weight}\n    {top}")
    for v_pairs in (True, False):
        info = inspect_cubin(decode_fp8_launch(v_pairs).asm["cubin"])
        print(f"{'decode fp8 v_pairs=' + str(v_pairs):28s} regs {info['regs']:3d}  spill bytes {info['stack']:4d}  "
              f"byte-wide shared loads {info['lds_u8']}")
    from pagoda.kernels.gemm_glu import CANDIDATES

    for cfg in CANDIDATES:
        kernel = gemm_glu_launch(cfg)
        info = inspect_cubin(kernel.asm["cubin"])
        label = (f"gemm_glu {cfg.block_m}x{cfg.block_n}x{cfg.block_k} w{cfg.num_warps} s{cfg.num_stages}"
                 + (" tma" if cfg.tma else ""))
        print(f"{label:28s} regs {info['regs']:3d}  spill bytes {info['stack']:4d}  shared bytes "
              f"{kernel.metadata.shared}  wgmma {info['ops']['HGMMA']}  cp.async {info['ops']['LDGSTS']}  "
              f"tma {info['ops']['UTMALDG']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
