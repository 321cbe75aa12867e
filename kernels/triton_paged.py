"""One Triton kernel for paged attention over a mixed step: prefill shards and decodes together.

The layout is the one of `kernels.reference` (packed varlen queries, a paged cache, block tables).

Grid: (query blocks, kv heads). A program owns up to BLOCK_Q query rows of one sequence and all the query
heads that share one kv head, packed into BLOCK_M = BLOCK_Q * GROUP (+ padding) rows of a single tile.
Packing the GQA group into rows keeps a decode (one query row) from wasting almost all of a tile that the
matrix units need to be at least 16 rows tall, and reads each KV tile once per kv head, not once per head.

Query blocks are numbered without a host sync: sequence s owns blocks starting at
cu_q_lens[s] // BLOCK_Q + s, so T // BLOCK_Q + S programs always suffice, and each program finds its
sequence by a binary search over cu_q_lens. Surplus programs, and those of empty sequences, exit at once.

The program walks the KV positions up to the last one its rows may see, BLOCK_N keys at a time, with an
online softmax (running max and sum, in base 2). Each key looks up its page in the block table, so a tile
may span several pages and pages need not be contiguous or ordered. Keys past that bound are masked on
load (never read), so stale or uninitialised cache slots cannot leak into the output.

An fp8 cache comes with per-page scales (`kernels.fp8`): each key and value tile is multiplied by its
pages' scales as it is loaded and goes on in the queries' dtype.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # `import kernels` must work where triton is absent; only this module needs it.
    triton = None
    tl = None

_LOG2E = 1.4426950408889634


if triton is not None:

    @triton.jit
    def _paged_attention_kernel(
        q_ptr, k_ptr, v_ptr, out_ptr, tables_ptr, cu_q_ptr, kv_lens_ptr, k_scale_ptr, v_scale_ptr,
        scale_log2, n_seqs,
        stride_qt, stride_qh, stride_qd,
        stride_kp, stride_kt, stride_kh, stride_kd,
        stride_vp, stride_vt, stride_vh, stride_vd,
        stride_ot, stride_oh, stride_od,
        stride_bs, stride_sp, stride_sh,
        SCALED: tl.constexpr,
        PAGE: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
    ):
        pid = tl.program_id(0)
        kv_head = tl.program_id(1)

        # Largest s whose first block is <= pid (tensors from the start: loop-carried types must not change).
        lo = pid * 0
        hi = pid * 0 + n_seqs - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            first = tl.load(cu_q_ptr + mid) // BLOCK_Q + mid
            lo = tl.where(first <= pid, mid, lo)
            hi = tl.where(first <= pid, hi, mid - 1)
        seq = lo

        q_start = tl.load(cu_q_ptr + seq)
        q_len = tl.load(cu_q_ptr + seq + 1) - q_start
        block = pid - (q_start // BLOCK_Q + seq)
        if block * BLOCK_Q >= q_len:
            return
        kv_len = tl.load(kv_lens_ptr + seq)

        rows = tl.arange(0, BLOCK_M)
        tok = block * BLOCK_Q + rows // GROUP
        head = kv_head * GROUP + rows % GROUP
        row_ok = (rows < BLOCK_Q * GROUP) & (tok < q_len)
        q_pos = kv_len - q_len + tok
        dims = tl.arange(0, HEAD_DIM_PAD)
        dim_ok = dims < HEAD_DIM

        q_rows = (q_start + tok).to(tl.int64)
        q = tl.load(q_ptr + q_rows[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :] * stride_qd,
                    mask=row_ok[:, None] & dim_ok[None, :], other=0.0)

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)

        # Keys beyond the last row's position are causally invisible to the whole block.
        kv_hi = kv_len - q_len + tl.minimum(block * BLOCK_Q + BLOCK_Q, q_len)
        cols = tl.arange(0, BLOCK_N)
        for start in range(0, kv_hi, BLOCK_N):
            kv_pos = start + cols
            kv_ok = kv_pos < kv_hi
            page = tl.load(tables_ptr + seq * stride_bs + kv_pos // PAGE, mask=kv_ok, other=0).to(tl.int64)
            slot = kv_pos % PAGE

            k_off = page[None, :] * stride_kp + slot[None, :] * stride_kt + dims[:, None] * stride_kd
            k = tl.load(k_ptr + kv_head * stride_kh + k_off, mask=dim_ok[:, None] & kv_ok[None, :], other=0.0)
            if SCALED:
                k_scale = tl.load(k_scale_ptr + page * stride_sp + kv_head * stride_sh, mask=kv_ok, other=0.0)
                k = k.to(tl.float32) * k_scale[None, :]
            k = k.to(q.dtype)  # a cache in another dtype than the queries' computes in theirs
            s = tl.dot(q, k, input_precision=PRECISION) * scale_log2
            visible = (kv_pos[None, :] <= q_pos[:, None]) & kv_ok[None, :]
            s = tl.where(visible, s, float("-inf"))

            m_new = tl.maximum(m_i, tl.max(s, 1))
            # A row that has seen no visible key yet keeps m = -inf; shift by 0 so exp2 gives 0, not NaN.
            m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_shift)
            p = tl.exp2(s - m_shift[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)

            v_off = page[:, None] * stride_vp + slot[:, None] * stride_vt + dims[None, :] * stride_vd
            v = tl.load(v_ptr + kv_head * stride_vh + v_off, mask=kv_ok[:, None] & dim_ok[None, :], other=0.0)
            if SCALED:
                v_scale = tl.load(v_scale_ptr + page * stride_sp + kv_head * stride_sh, mask=kv_ok, other=0.0)
                v = v.to(tl.float32) * v_scale[:, None]
            v = v.to(q.dtype)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m_i = m_new

        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(out_ptr + q_rows[:, None] * stride_ot + head[:, None] * stride_oh + dims[None, :] * stride_od,
                 out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])


def _block_sizes(n_rows: int, n_seqs: int, group: int, page_tokens: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_Q, BLOCK_N): short tiles when the step is all decodes, taller ones for prefill."""
    group_pad = triton.next_power_of_2(group)
    block_m = max(16 if n_rows <= n_seqs else 64, group_pad)
    block_n = max(triton.next_power_of_2(page_tokens), 32)
    return block_m, block_m // group, block_n


def paged_attention_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, cu_q_lens: torch.Tensor, kv_lens: torch.Tensor,
                           scale: float, scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Attention of packed queries [T, H, D] over a paged cache; same contract as the reference."""
    if triton is None:
        raise ImportError("paged_attention_triton needs the `triton` package")
    n_rows, n_heads, head_dim = q.shape
    _, page_tokens, n_kv, cache_dim = k_cache.shape
    if cache_dim != head_dim or v_cache.shape != k_cache.shape:
        raise ValueError(f"cache shape {tuple(k_cache.shape)} does not fit queries {tuple(q.shape)}")
    if n_heads % n_kv:
        raise ValueError(f"{n_heads} query heads are not a multiple of {n_kv} kv heads")
    n_seqs = kv_lens.shape[0]
    out = torch.empty((n_rows, n_heads, head_dim), dtype=q.dtype, device=q.device)
    if n_rows == 0 or n_seqs == 0:
        return out

    group = n_heads // n_kv
    block_m, block_q, block_n = _block_sizes(n_rows, n_seqs, group, page_tokens)
    grid = (n_rows // block_q + n_seqs, n_kv)
    # fp32 inputs would otherwise go through tf32 on the GPU and drift from the reference.
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    k_scale, v_scale = scales if scales is not None else (kv_lens, kv_lens)  # unread unless SCALED
    if scales is not None and not (k_scale.shape == v_scale.shape == (k_cache.shape[0], n_kv)
                                   and k_scale.stride() == v_scale.stride()):
        raise ValueError(f"scales {tuple(k_scale.shape)} do not fit the cache {tuple(k_cache.shape)}")
    _paged_attention_kernel[grid](
        q, k_cache, v_cache, out, block_tables, cu_q_lens, kv_lens, k_scale, v_scale,
        float(scale) * _LOG2E, n_seqs,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *out.stride(),
        block_tables.stride(0), *(k_scale.stride() if scales is not None else (0, 0)),
        SCALED=scales is not None, PAGE=page_tokens, GROUP=group, HEAD_DIM=head_dim,
        HEAD_DIM_PAD=triton.next_power_of_2(head_dim),
        BLOCK_M=block_m, BLOCK_Q=block_q, BLOCK_N=block_n, PRECISION=precision,
    )
    return out
