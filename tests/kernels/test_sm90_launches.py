"""The runtime's one-row FP8 GEMV launches (kernels/fp8_dispatch.FP8_SMALL_M, and the qkv entry's rope
fold) compiled for sm_90 here, with the ptxas and cuobjdump that Triton ships (e2e/sm90_asm.py): none
spills registers to local memory, and each streams its weights with 16-byte loads. A table entry
that breaks either would cost bandwidth on the H200 that no CPU test of the results would show.
The FP8-cache decode attention, as W1 launches it, reads its tiles from shared memory with no
byte-wide loads (V_PAIRS; with the byte-wide V read the same launch has 128 a thread a tile). Each
gemm_glu candidate runs on wgmma with a cp.async (or TMA) pipeline, without spills, in an H100's shared memory."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_launches_compile_without_spills_and_with_wide_loads():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, str(ROOT / "e2e" / "sm90_asm.py")], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [line for line in out.stdout.splitlines() if " regs " in line and not line.startswith(("decode", "gemm_glu"))]
    assert len(lines) >= 6, out.stdout  # every 1-row gemv entry and the rope fold
    for line in lines:
        fields = line.split()
        spill = int(fields[fields.index("spill") + 2])
        wide = int(fields[fields.index("16-byte") + 2])
        assert spill == 0 and wide > 0, line
    decode = {line.split()[2]: line for line in out.stdout.splitlines() if line.startswith("decode fp8")}
    pairs, bytewise = decode["v_pairs=True"].split(), decode["v_pairs=False"].split()
    assert int(pairs[pairs.index("spill") + 2]) == 0
    assert int(pairs[-1]) == 0, decode["v_pairs=True"]
    assert int(bytewise[-1]) > 0, decode["v_pairs=False"]  # the check sees byte loads where they are
    # every gemm_glu candidate: tensor cores through wgmma, a cp.async pipeline, no spills, and
    # shared memory within an H100's 227 KB a block (a launch over it fails on the device)
    glu = [line.split() for line in out.stdout.splitlines() if line.startswith("gemm_glu")]
    assert len(glu) >= 6, out.stdout
    for f in glu:
        assert int(f[f.index("spill") + 2]) == 0 and int(f[f.index("wgmma") + 1]) > 0, f
        loads = int(f[f.index("cp.async") + 1]) + int(f[-1])  # cp.async, then TMA, loads: the line's last field
        assert loads > 0 and int(f[f.index("shared") + 2]) <= 227 * 1024, f  # pipelined loads, in a block's memory
