"""Triton paged-attention decode: one new query token per sequence, over its paged KV cache.

Launch shape. The grid is (num_seqs, num_kv_heads, num_splits). One program owns every query head
of one KV head (GQA-aware), so each K/V row is read from HBM once per group and the group's scores
come out of one small tl.dot ([BLOCK_G, D] x [D, BLOCK_N]). The KV positions are walked in tiles
of BLOCK_N, which may span several cache blocks: every position finds its physical block through
the block table, so any power-of-two block size up to 128 works with the same kernel.

Split-KV. When seqs * kv_heads is too few programs to fill the GPU (small batches, long contexts),
the context is cut into num_splits slices. Each slice writes a partial output and its log-sum-exp.
The slice length is computed on the device from each sequence's own seq_len, so the launch depends
only on host-side hints: no host sync, and a launch captured in a CUDA graph stays correct for any
context length. With one split the kernel writes the output directly and no merge is needed.

Fused merge. Splits happen only at few rows (decode's single stream: one sequence, 8 KV heads),
where every kernel boundary of the 32-layer chain costs a few microseconds; so the merge is done
in the same launch by the last slice of each (seq, kv_head) to finish (the split-K semaphore
pattern). Each program stores its partials, then counts itself in on that pair's int32 arrival
counter (an acq_rel atomic); the one that arrives last merges the group's heads as _merge_kernel
would, bit for bit, and zeroes the counter again for the next launch or graph replay. The
counters are one persistent buffer per device; FUSED_MERGE = False, more pairs than it holds, more
than FUSED_MAX_SPLITS slices, or a first use inside a CUDA-graph capture take the two launches
(decode, then _merge_kernel).

Tile. Few programs per SM (small batches) cannot keep enough loads in flight with a thin tile, so
below FAT_TILE_BELOW programs per SM each program walks wider tiles, more stages deep; and the
context is split only below PROGRAMS_PER_SM programs per SM, since a fat-tiled launch of 4 per SM
already streams near the bandwidth limit and a split costs a merge. Heads of 64 or less move half the
bytes per position, and take the fat tile at every program count.
"""

import functools

import torch
import triton
import triton.language as tl

from pagoda.kernels import pdl
from pagoda.kernels.attention_dot import NO_WINDOW, _dot, _scores, dot_precision, fp8_as_f16, score_scales

# Launch knobs for 2-byte caches, from e2e/kernels_gpu.py --sweep on the H200 (c928b0e): the best
# worst case over batch 64-256 and context 512-8k, and no worse than the old 64/4/3 at any point.
BLOCK_N = 32
NUM_WARPS = 2
NUM_STAGES = 2
# A launch of fewer than FAT_TILE_BELOW programs per SM leaves too few loads in flight with the thin
# tile: each program then walks 64-position tiles, three stages deep. Measured on the H200
# (e2e/results/decode-rules-080f2dd): batch 64 at 512 tokens 3.38 -> 3.77 TB/s as one slice; batch
# 1-32 gain 3-50%; at 768 programs (batch 48, two slices) the thin tile is still ahead.
FAT_TILE = (64, 2, 3)  # block_n, num_warps, num_stages
FAT_TILE_BELOW = 5
# Heads this wide or narrower take FAT_TILE at every program count (choose_tile says why).
NARROW_HEAD_DIM = 64
MIN_TOKENS_PER_SPLIT = 256  # below this a slice costs more in merging than it gains in parallelism
MAX_SPLITS = 32
# Split the context only below 3 programs per SM: with the fat tile, 4 per SM already stream at
# 88-106% of 4.25 TB/s, and a split adds a merge launch.
PROGRAMS_PER_SM = 3
# An FP8 cache's V is read as pairs of values (_e4m3_pairs_as_f16); False keeps the byte-wide
# read, so a benchmark can compare the two.
V_PAIRS = True
FUSED_MERGE = True  # False keeps the two launches (decode, then _merge_kernel), so a benchmark can compare them
# (seq, kv_head) pairs the arrival counters hold: splits need seqs * kv_heads under PROGRAMS_PER_SM
# programs per SM (choose_num_splits), far below this on any GPU.
COUNTER_CAPACITY = 4096
# Past 16 slices the last program's merge (2 warps over GROUP heads x NUM_SPLITS partials) outlasts
# a merge launch of num_heads programs: one sequence, 8 KV heads, group 4, bf16 on the H200, per
# layer in a graph, two launches -> fused, without / with PDL: 2 slices 9.08 -> 8.71 / 8.51 -> 8.15 us,
# 8: 9.53 -> 9.30 / 9.51 -> 9.21, 16 (8k): 16.79 -> 16.46 / 20.70 -> 20.44, 32: 12.36 -> 12.59 / 13.90 -> 14.71.
# (A scratch run on 2026-12-04 whose script was not kept: no result in e2e/results/ yet; the limit
# errs toward the two launches, which were the only path before.)
FUSED_MAX_SPLITS = 16
# device -> int32 [COUNTER_CAPACITY], all zeros between launches. Shared by every launch on the
# device, so two decode launches must not run at once on two streams (the engine runs one).
_COUNTERS: dict = {}


@triton.jit
def _decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
    out_ptr, part_out_ptr, part_lse_ptr, counters_ptr,
    qk_scale, cap_log2, window, v_scale,
    stride_qt, stride_qh, stride_cb, stride_cs, stride_ch, stride_bt, stride_ot, stride_oh,
    NUM_SPLITS: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
    SOFTCAP: tl.constexpr, PRECISION: tl.constexpr, FP8_AS_F16: tl.constexpr, V_PAIRS: tl.constexpr,
    PDL: tl.constexpr,
    FUSED: tl.constexpr, MERGE_G: tl.constexpr,
):
    pdl.launch_dependents(PDL)
    pdl.wait(PDL)  # before the counter's atomic too: it is a write
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    q_row = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_row
    # The only early out. It is the same for every split of a (seq, kv_head), so with the fused
    # merge either all of them arrive at the pair's counter or none touches it: it stays zero.
    if q_len > 0:
        seq_len = tl.load(seq_lens_ptr + seq)
        # A sliding window shows the query only its last `window` positions: the slices cut those,
        # and the blocks before them are never read (they may already be freed).
        kv_start = tl.maximum(seq_len - window, 0)
        per_split = tl.cdiv(tl.cdiv(seq_len - kv_start, NUM_SPLITS), BLOCK_N) * BLOCK_N
        start = kv_start + split * per_split
        end = tl.minimum(seq_len, start + per_split)

        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, BLOCK_D)
        heads = kv_head * GROUP + g
        gmask = g < GROUP
        dmask = d < HEAD_DIM
        q = tl.load(q_ptr + q_row.to(tl.int64) * stride_qt + heads[:, None] * stride_qh + d[None, :],
                    mask=gmask[:, None] & dmask[None, :], other=0.0)
        if FP8_AS_F16:  # attention_dot.fp8_as_f16 says why
            q = q.to(tl.float16)

        m = tl.full([BLOCK_G], float("-inf"), tl.float32)
        denom = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        acc_lo = tl.zeros([BLOCK_G, BLOCK_D // 2], tl.float32)  # V_PAIRS: the even and the odd dims
        acc_hi = tl.zeros([BLOCK_G, BLOCK_D // 2], tl.float32)
        table = block_tables_ptr + seq.to(tl.int64) * stride_bt
        v_pairs_ptr = v_cache_ptr.to(tl.pointer_type(tl.int16), bitcast=True)
        dp = tl.arange(0, BLOCK_D // 2)
        for n0 in range(start, end, BLOCK_N):
            pos = n0 + tl.arange(0, BLOCK_N)
            pmask = pos < end
            block = tl.load(table + pos // BLOCK_SIZE, mask=pmask, other=0).to(tl.int64)
            row = block * stride_cb + (pos % BLOCK_SIZE) * stride_cs + kv_head * stride_ch
            kv_mask = pmask[:, None] & dmask[None, :]
            # an FP8 cache widens to q's dtype (fp16 then) exactly; its k_scale is in qk_scale, v_scale at the end
            k = tl.load(k_cache_ptr + row[:, None] + d[None, :], mask=kv_mask, other=0.0).to(q.dtype)
            s = _scores(q, tl.trans(k), qk_scale, cap_log2, SOFTCAP, PRECISION)
            s = tl.where(pmask[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))
            alpha = tl.exp2(m - m_new)
            p = tl.exp2(s - m_new[:, None])
            denom = denom * alpha + tl.sum(p, axis=1)
            if V_PAIRS:
                # p v reduces over positions, the cache's strided dim: the dot wants V transposed,
                # which sm_90 does in hardware for 16-bit elements (ldmatrix.trans) but not for
                # bytes, where Triton read the widened tile back one byte a time (128 LDS.U8 a
                # thread a tile). So V is read as 16-bit words, two adjacent dims in each, and
                # widened with integer ops that Triton keeps 16 bits wide.
                pairs = tl.load(v_pairs_ptr + (row // 2)[:, None] + dp[None, :], mask=pmask[:, None], other=0)
                v_lo, v_hi = _e4m3_pairs_as_f16(pairs.to(tl.int32))
                p16 = p.to(tl.float16)
                acc_lo = acc_lo * alpha[:, None] + _dot(p16, v_lo, PRECISION)
                acc_hi = acc_hi * alpha[:, None] + _dot(p16, v_hi, PRECISION)
            else:
                v = tl.load(v_cache_ptr + row[:, None] + d[None, :], mask=kv_mask, other=0.0).to(q.dtype)
                acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, PRECISION)
            m = m_new
        if V_PAIRS:  # the dims interleaved again, and the pairs' 2^-8 undone (exact)
            acc = tl.reshape(tl.join(acc_lo, acc_hi), [BLOCK_G, BLOCK_D]) * 256.0
        acc = acc * v_scale

        omask = gmask[:, None] & dmask[None, :]
        if NUM_SPLITS == 1:
            out = acc / tl.where(denom == 0.0, 1.0, denom)[:, None]
            tl.store(out_ptr + q_row.to(tl.int64) * stride_ot + heads[:, None] * stride_oh + d[None, :],
                     out.to(out_ptr.dtype.element_ty), mask=omask)
        else:
            # partials are [num_seqs, num_heads, NUM_SPLITS, HEAD_DIM] and [.., NUM_SPLITS], contiguous
            part = (seq.to(tl.int64) * GROUP * tl.num_programs(1) + heads) * NUM_SPLITS + split
            tl.store(part_out_ptr + part[:, None] * HEAD_DIM + d[None, :],
                     acc / tl.where(denom == 0.0, 1.0, denom)[:, None], mask=omask)
            lse = tl.where(denom == 0.0, float("-inf"), m + tl.log2(tl.where(denom == 0.0, 1.0, denom)))
            tl.store(part_lse_ptr + part, lse, mask=gmask)
            if FUSED:
                # Every thread's stores come before the arrival; the atomic's release publishes
                # them at GPU scope and its acquire, in the last program, makes all the others'
                # visible to it.
                tl.debug_barrier()
                counter = counters_ptr + seq * tl.num_programs(1) + kv_head
                if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == NUM_SPLITS - 1:
                    # The whole group at once: one round of loads, not one per head. ".cg": the
                    # partials were written by other programs, perhaps on other SMs, and an earlier
                    # launch's merge may have left the same addresses in this SM's L1, which is not
                    # coherent; .cg reads them from L2, which is.
                    _merge(part_out_ptr, part_lse_ptr, out_ptr, q_row, stride_ot, stride_oh,
                           seq * tl.num_programs(1) * GROUP + kv_head * GROUP, kv_head * GROUP,
                           GROUP, MERGE_G, NUM_SPLITS, HEAD_DIM, BLOCK_D, ".cg")
                    # All NUM_SPLITS have arrived, so nothing else touches it in this launch; the
                    # kernel's end publishes the zero to the next launch (or replay).
                    tl.store(counter, 0)


@triton.jit
def _e4m3_pairs_as_f16(w):
    """w: int32 holding two e4m3 values in its low 16 bits, the lower address's in the low byte.
    Both as fp16, each exactly 2^-8 times its e4m3 value: e4m3's sign, exponent and mantissa bits
    go into fp16's fields, whose exponent bias is 8 more (15 against 7); e4m3's subnormals land on
    fp16's the same way. NaN (0x7f, 0xff) is never written into a cache."""
    lo = ((w & 0x80) << 8) | ((w & 0x7F) << 7)
    hi = (w & 0x8000) | ((w >> 1) & 0x3F80)
    return lo.to(tl.int16).to(tl.float16, bitcast=True), hi.to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def _merge(part_out_ptr, part_lse_ptr, out_ptr, q_row, stride_ot, stride_oh, seq_head, head,
           HEADS: tl.constexpr, BLOCK_H: tl.constexpr, NUM_SPLITS: tl.constexpr, HEAD_DIM: tl.constexpr,
           BLOCK_D: tl.constexpr, CACHE: tl.constexpr):
    """Merge the partials of HEADS heads of one sequence (seq_head = seq * num_heads + head, the
    first of them) into their output rows. The sums run split by split, elementwise, rather than as
    tl.sum reductions, whose order follows the layout (the tensor's shape and num_warps): so the
    fused merge (a group, the decode kernel's warps) and _merge_kernel (one head, its own warps)
    give the same bits. CACHE is the partials' load cache modifier."""
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    hmask = h < HEADS
    part = (seq_head + h).to(tl.int64) * NUM_SPLITS  # [num_seqs, num_heads, NUM_SPLITS] rows
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    for sp in tl.static_range(NUM_SPLITS):  # a maximum is exact in any order
        m = tl.maximum(m, tl.load(part_lse_ptr + part + sp, mask=hmask, other=float("-inf"),
                                  cache_modifier=CACHE))
    m = tl.where(m == float("-inf"), 0.0, m)
    total = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    omask = hmask[:, None] & (d[None, :] < HEAD_DIM)
    for sp in tl.static_range(NUM_SPLITS):
        w = tl.exp2(tl.load(part_lse_ptr + part + sp, mask=hmask, other=float("-inf"),
                            cache_modifier=CACHE) - m)  # empty slices weigh 0
        o = tl.load(part_out_ptr + (part + sp)[:, None] * HEAD_DIM + d[None, :], mask=omask, other=0.0,
                    cache_modifier=CACHE)
        total += w
        acc += w[:, None] * o
    out = acc / tl.where(total == 0.0, 1.0, total)[:, None]
    tl.store(out_ptr + q_row.to(tl.int64) * stride_ot + (head + h)[:, None] * stride_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=omask)


@triton.jit
def _merge_kernel(
    part_out_ptr, part_lse_ptr, query_start_loc_ptr, out_ptr, stride_ot, stride_oh,
    NUM_SPLITS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr,
):
    pdl.launch_dependents(PDL)
    pdl.wait(PDL)
    seq = tl.program_id(0)
    head = tl.program_id(1)
    q_row = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_row
    if q_len > 0:
        _merge(part_out_ptr, part_lse_ptr, out_ptr, q_row, stride_ot, stride_oh,
               seq * tl.num_programs(1) + head, head, 1, 1, NUM_SPLITS, HEAD_DIM, BLOCK_D, "")


@functools.cache
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the CPU interpreter: small, so tests still exercise the split path
    return torch.cuda.get_device_properties(device).multi_processor_count


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, device: torch.device) -> int:
    """Enough slices to keep PROGRAMS_PER_SM programs on every SM, but none shorter than
    MIN_TOKENS_PER_SPLIT tokens of the longest sequence, rounded down to a power of two. Host
    arithmetic only."""
    wanted = triton.cdiv(_num_sms(device) * PROGRAMS_PER_SM, max(1, num_seqs * num_kv_heads))
    by_length = triton.cdiv(max(1, max_seq_len), MIN_TOKENS_PER_SPLIT)
    # A power of two: NUM_SPLITS is a constexpr, so each count is a kernel of its own, and six of
    # them (1-32) can all be built at start-up (runtime/core/warmup.py), where 32 could not.
    return 1 << (max(1, min(wanted, by_length, MAX_SPLITS)).bit_length() - 1)


def choose_tile(num_programs: int, element_size: int, device: torch.device, head_dim: int = 128) -> tuple:
    """(block_n, num_warps, num_stages) for a launch of num_programs programs."""
    if element_size > 2:  # fp32 caches take half the tile to fit shared memory
        return 32, NUM_WARPS, 2
    if element_size == 1:
        # An FP8 cache is bound by widening its values, not by HBM (2.0-2.5 TB/s where bf16 streams
        # 4.4): the fat tile was the best of 36 launches on every shape of e2e/decode_fp8_sweep.py
        # (e2e/results/decode-fp8-29c5312/), 1.2x the thin one at W1's 256 x 768.
        return FAT_TILE
    if head_dim <= NARROW_HEAD_DIM:
        # A 64-wide head moves half the bytes per position, so the thin tile's 32 positions keep
        # half its loads in flight: 64 positions, three stages, at any program count. H100, W4's
        # 14 heads over 2 (e2e/results/decode-tiles-c51f612/): worst of four batch x context points
        # 2.61 -> 2.73 TB/s, 1,024 seqs x 704 tokens 2.61 -> 2.87; Llama-3.2-1B's 32 over 8: worst
        # 2.66 -> 2.90. W4 end to end 96.1-96.5k -> 100.3-100.4k tok/s (with four stages, which the
        # sweep puts level with three).
        return FAT_TILE
    if num_programs < FAT_TILE_BELOW * _num_sms(device):
        # Gemma's head_dim 256 doubles each K and V tile: two stages keep them in shared memory
        return FAT_TILE if head_dim <= 128 else (*FAT_TILE[:2], 2)
    return BLOCK_N, NUM_WARPS, NUM_STAGES


def _arrival_counters(device: torch.device) -> torch.Tensor | None:
    """The device's zeroed arrival counters, allocated on first use; None (take the two launches)
    if that first use is inside a CUDA-graph capture. There torch.zeros would only record its
    fill, leaving the buffer unzeroed until a replay, and in the graph's private pool; the engine
    warms up eagerly before it captures, so the fused merge is in its graphs all the same."""
    counters = _COUNTERS.get(device)
    if counters is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        counters = _COUNTERS[device] = torch.zeros(COUNTER_CAPACITY, dtype=torch.int32, device=device)
    return counters


def paged_attention_decode(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]; one row per sequence (decode)
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32, including the new token
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32
    scale: float,
    *,
    sliding_window: int | None = None,
    softcap: float | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Every sequence must have at most one query row (q_len 0 rows are skipped).

    max_seq_len is only a launch hint (an upper bound is fine, as under CUDA graphs); without it
    the split count is chosen from seq_lens, which syncs with the host. sliding_window, softcap
    and the FP8 cache's k_scale and v_scale as in paged_attention_ref.
    """
    num_seqs = seq_lens.shape[0]
    num_heads, head_dim = query.shape[1], query.shape[2]
    _, block_size, num_kv_heads, _ = k_cache.shape
    assert num_heads % num_kv_heads == 0 and block_size & (block_size - 1) == 0 and block_size <= 128
    assert query.stride(-1) == 1 and k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
    group = num_heads // num_kv_heads
    if out is None:
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    if num_seqs == 0:
        return out
    if num_splits is None:
        if max_seq_len is None:
            max_seq_len = int(seq_lens.max())
        if sliding_window:  # a window caps what one sequence reads
            max_seq_len = min(max_seq_len, sliding_window)
        num_splits = choose_num_splits(num_seqs, num_kv_heads, max_seq_len, query.device)
    block_g = max(16, triton.next_power_of_2(group))  # tl.dot wants M >= 16
    block_d = max(16, triton.next_power_of_2(head_dim))
    default_n, default_warps, default_stages = choose_tile(
        num_seqs * num_kv_heads * num_splits, k_cache.element_size(), query.device, head_dim)
    counters = None
    if num_splits > 1:
        part_out = torch.empty(num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32,
                               device=query.device)
        part_lse = torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32, device=query.device)
        if FUSED_MERGE and num_splits <= FUSED_MAX_SPLITS and num_seqs * num_kv_heads <= COUNTER_CAPACITY:
            counters = _arrival_counters(query.device)
    else:
        part_out = part_lse = out  # unused
    _decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        query, k_cache, v_cache, block_tables, seq_lens, query_start_loc,
        out, part_out, part_lse, out if counters is None else counters,  # out: unused
        *score_scales(scale * k_scale, softcap), sliding_window or NO_WINDOW, float(v_scale),
        query.stride(0), query.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
        NUM_SPLITS=num_splits, GROUP=group, BLOCK_G=block_g, HEAD_DIM=head_dim, BLOCK_D=block_d,
        BLOCK_SIZE=block_size, BLOCK_N=block_n or default_n,
        SOFTCAP=bool(softcap), PRECISION=dot_precision(query), FP8_AS_F16=(f16 := fp8_as_f16(query, k_cache)),
        V_PAIRS=V_PAIRS and f16 and block_d == head_dim,
        PDL=(on := pdl.flag(query, num_seqs)), FUSED=counters is not None,
        MERGE_G=triton.next_power_of_2(group),  # BLOCK_G's padding to 16 is for tl.dot alone
        num_warps=num_warps or default_warps, num_stages=num_stages or default_stages, **pdl.options(on),
    )
    if num_splits > 1 and counters is None:
        _merge_kernel[(num_seqs, num_heads)](
            part_out, part_lse, query_start_loc, out, out.stride(0), out.stride(1),
            NUM_SPLITS=num_splits, HEAD_DIM=head_dim, BLOCK_D=block_d, PDL=on,
            num_warps=4 if head_dim >= 128 else 2, **pdl.options(on),
        )
    return out
