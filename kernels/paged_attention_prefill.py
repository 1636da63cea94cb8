"""Triton varlen causal attention over the paged KV cache: prefill, chunked prefill, prefix extension.

FlashAttention-2 style. The grid is (query tiles, num_seqs, num_heads); a program holds BLOCK_M
query rows of one head of one sequence and streams that sequence's keys and values from the cache
through its block table in tiles of BLOCK_N, with an online softmax. The new tokens were written to
the cache before the call, so a cached prefix and the fresh chunk are read the same way.

Query row i of a sequence with q_len new tokens sits at position seq_len - q_len + i. The key loop
has up to three phases: tiles that lie wholly at or before the tile's first query position, and
within every row's sliding window if the layer has one, need no mask; only the tiles along the
diagonal, and along the window's lower edge, pay for a mask. Tiles wholly below every row's
window are skipped. Query tiles are issued longest first so the causal triangle does not leave a
straggler at the end of the grid. Scores may be soft-capped (Gemma 2): see attention_dot._scores.
"""

import torch
import triton
import triton.language as tl

from pagoda.kernels.attention_dot import NO_WINDOW, _dot, _scores, dot_precision, fp8_as_f16, score_scales


@triton.jit
def _load_rows(ptrs, pmask, dmask, MASKED: tl.constexpr, EVEN_D: tl.constexpr):
    """K or V rows; the mask-free load is the common case (interior tiles, head_dim a power of 2)."""
    if MASKED:
        return tl.load(ptrs, mask=pmask[:, None] & dmask[None, :], other=0.0)
    elif EVEN_D:
        return tl.load(ptrs)
    else:
        return tl.load(ptrs, mask=dmask[None, :], other=0.0)


@triton.jit
def _tile(q, k_cache_ptr, v_cache_ptr, table, kv_off, n0, d, dmask, q_pos, kv_lo, seq_len, m, denom, acc,
          qk_scale, cap_log2, window, stride_cb, stride_cs,
          BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, EVEN_D: tl.constexpr,
          SOFTCAP: tl.constexpr, PRECISION: tl.constexpr):
    pos = n0 + tl.arange(0, BLOCK_N)
    # Positions before kv_lo are outside every row's window: not even loaded, as their blocks may
    # be freed and reused (a 0 * NaN would poison the sum).
    pmask = (pos < seq_len) & (pos >= kv_lo)
    if MASKED:
        block = tl.load(table + pos // BLOCK_SIZE, mask=pmask, other=0).to(tl.int64)
    else:
        block = tl.load(table + pos // BLOCK_SIZE).to(tl.int64)
    rows = (block * stride_cb + (pos % BLOCK_SIZE) * stride_cs + kv_off)[:, None] + d[None, :]
    # an FP8 cache widens to q's dtype (fp16 then) exactly; its k_scale is in qk_scale, v_scale at the end
    k = _load_rows(k_cache_ptr + rows, pmask, dmask, MASKED, EVEN_D).to(q.dtype)
    s = _scores(q, tl.trans(k), qk_scale, cap_log2, SOFTCAP, PRECISION)
    if MASKED:
        visible = (pos[None, :] <= q_pos[:, None]) & (pos[None, :] > q_pos[:, None] - window)
        s = tl.where(visible & pmask[None, :], s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    if MASKED:  # a row may see no key in this tile; keep exp2 away from (-inf) - (-inf)
        m_new = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(s - m_new[:, None])
    denom = denom * alpha + tl.sum(p, axis=1)
    v = _load_rows(v_cache_ptr + rows, pmask, dmask, MASKED, EVEN_D).to(q.dtype)
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, PRECISION)
    return m_new, denom, acc


@triton.jit
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, query_start_loc_ptr, out_ptr,
    qk_scale, cap_log2, window, v_scale,
    stride_qt, stride_qh, stride_cb, stride_cs, stride_ch, stride_bt, stride_ot, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SOFTCAP: tl.constexpr, PRECISION: tl.constexpr, FP8_AS_F16: tl.constexpr,
):
    m_tile = tl.num_programs(0) - 1 - tl.program_id(0)  # longest (last) query tiles first
    seq = tl.program_id(1)
    head = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if m_tile * BLOCK_M < q_len:
        seq_len = tl.load(seq_lens_ptr + seq)
        context = seq_len - q_len
        rows = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
        rmask = rows < q_len
        d = tl.arange(0, BLOCK_D)
        dmask = d < HEAD_DIM
        token = (q_start + rows).to(tl.int64)
        q = tl.load(q_ptr + token[:, None] * stride_qt + head * stride_qh + d[None, :],
                    mask=rmask[:, None] & dmask[None, :], other=0.0)
        if FP8_AS_F16:  # attention_dot.fp8_as_f16 says why
            q = q.to(tl.float16)
        q_pos = context + rows

        m = tl.full([BLOCK_M], float("-inf"), tl.float32)
        denom = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        table = block_tables_ptr + seq.to(tl.int64) * stride_bt
        kv_off = (head // GROUP) * stride_ch
        first_pos = context + m_tile * BLOCK_M
        full_end = (first_pos + 1) // BLOCK_N * BLOCK_N  # every key here is at or before every row
        end = tl.minimum(seq_len, context + tl.minimum((m_tile + 1) * BLOCK_M, q_len))
        # With a sliding window, keys before lo are out of every row's sight (never read), and from
        # full_lo on they are within every row's window; without one both are 0.
        kv_lo = tl.maximum(first_pos - window + 1, 0)
        lo = kv_lo // BLOCK_N * BLOCK_N
        full_lo = tl.minimum(tl.cdiv(tl.maximum(first_pos + BLOCK_M - window, 0), BLOCK_N) * BLOCK_N, full_end)
        for n0 in range(lo, full_lo, BLOCK_N):
            m, denom, acc = _tile(q, k_cache_ptr, v_cache_ptr, table, kv_off, n0, d, dmask, q_pos, kv_lo,
                                  seq_len, m, denom, acc, qk_scale, cap_log2, window, stride_cb, stride_cs,
                                  BLOCK_SIZE, BLOCK_N, True, HEAD_DIM == BLOCK_D, SOFTCAP, PRECISION)
        for n0 in range(full_lo, full_end, BLOCK_N):
            m, denom, acc = _tile(q, k_cache_ptr, v_cache_ptr, table, kv_off, n0, d, dmask, q_pos, kv_lo,
                                  seq_len, m, denom, acc, qk_scale, cap_log2, window, stride_cb, stride_cs,
                                  BLOCK_SIZE, BLOCK_N, False, HEAD_DIM == BLOCK_D, SOFTCAP, PRECISION)
        for n0 in range(full_end, end, BLOCK_N):
            m, denom, acc = _tile(q, k_cache_ptr, v_cache_ptr, table, kv_off, n0, d, dmask, q_pos, kv_lo,
                                  seq_len, m, denom, acc, qk_scale, cap_log2, window, stride_cb, stride_cs,
                                  BLOCK_SIZE, BLOCK_N, True, HEAD_DIM == BLOCK_D, SOFTCAP, PRECISION)
        out = acc * v_scale / tl.where(denom == 0.0, 1.0, denom)[:, None]
        tl.store(out_ptr + token[:, None] * stride_ot + head * stride_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=rmask[:, None] & dmask[None, :])


# Heads of 64 take a launch by context length (H100, results/prefill-tiles-9807a9e/ and -f3c3c06/).
# On W4's short prompts (128-1024 tokens) SHORT_TILE runs 168-175 TFLOP/s against LONG_TILE's 152;
# at 4k tokens it gives 260 against 283, and on a 2k chunk of a 16k prompt 241 against 292. Where
# every sequence of the step ends by SHORT_CONTEXT tokens (the max_seq_len hint), SHORT_TILE.
SHORT_TILE_64 = dict(block_m=64, block_n=32, num_warps=4, num_stages=2)
LONG_TILE_64 = dict(block_m=128, block_n=64, num_warps=4, num_stages=3)
SHORT_CONTEXT = 1536


def default_config(head_dim: int, dtype: torch.dtype, device: torch.device, max_seq_len: int | None = None) -> dict:
    """Tile sizes and launch knobs: first guesses for the H200 (e2e/kernels_gpu.py --sweep ranks the
    alternatives there); small tiles under the interpreter keep the CPU tests quick. max_seq_len,
    an upper bound on the step's sequence lengths where known, picks the tile for heads of 64."""
    if device.type != "cuda":
        return dict(block_m=16, block_n=16, num_warps=1, num_stages=1)
    if head_dim > 128:  # Gemma's 256: smaller tiles keep q, K and V within shared memory (not swept)
        if dtype == torch.float32:
            return dict(block_m=32, block_n=32, num_warps=4, num_stages=1)
        return dict(block_m=64, block_n=32, num_warps=8, num_stages=2)
    if dtype == torch.float32:
        return dict(block_m=64, block_n=32, num_warps=4, num_stages=2)
    if head_dim <= 64:
        short = max_seq_len is not None and max_seq_len <= SHORT_CONTEXT
        return dict(SHORT_TILE_64 if short else LONG_TILE_64)
    # swept on the H200 (c928b0e): 377 TFLOP/s at 4k against 324 for 128/64/8/3
    return dict(block_m=128, block_n=32, num_warps=8, num_stages=2)


def launches(head_dim: int, dtype: torch.dtype, device: torch.device) -> list[dict]:
    """Every launch default_config can give this layer, for the warm-up to build each one."""
    found = []
    for hint in (None, 1):
        cfg = default_config(head_dim, dtype, device, hint)
        if cfg not in found:
            found.append(cfg)
    return found


def paged_attention_prefill(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32, including the new tokens
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32
    scale: float,
    *,
    sliding_window: int | None = None,
    softcap: float | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    max_query_len: int | None = None,
    max_seq_len: int | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """max_query_len and max_seq_len are launch hints (upper bounds are fine): without the first the
    grid is sized from query_start_loc, which syncs with the host; the second picks the tile
    (default_config). sliding_window, softcap and the FP8 cache's k_scale
    and v_scale as in paged_attention_ref."""
    num_seqs = seq_lens.shape[0]
    num_heads, head_dim = query.shape[1], query.shape[2]
    _, block_size, num_kv_heads, _ = k_cache.shape
    assert num_heads % num_kv_heads == 0 and block_size & (block_size - 1) == 0 and block_size <= 128
    assert query.stride(-1) == 1 and k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
    if out is None:
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max()) if num_seqs else 0
    if num_seqs == 0 or max_query_len == 0:
        return out
    cfg = default_config(head_dim, query.dtype, query.device, max_seq_len)
    block_m = block_m or cfg["block_m"]
    grid = (triton.cdiv(max_query_len, block_m), num_seqs, num_heads)
    _prefill_kernel[grid](
        query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, out,
        *score_scales(scale * k_scale, softcap), sliding_window or NO_WINDOW, float(v_scale),
        query.stride(0), query.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
        GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)), BLOCK_SIZE=block_size,
        BLOCK_M=block_m, BLOCK_N=block_n or cfg["block_n"],
        SOFTCAP=bool(softcap), PRECISION=dot_precision(query), FP8_AS_F16=fp8_as_f16(query, k_cache),
        num_warps=num_warps or cfg["num_warps"], num_stages=num_stages or cfg["num_stages"],
    )
    return out
