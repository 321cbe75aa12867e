"""Paged attention in plain PyTorch: the reference every other kernel is tested against.

Layout (shared with the Triton kernels):
- q: [T, H, D], the queries of all sequences of a step packed one after another;
- k_cache, v_cache: [P, page_tokens, Hkv, D], one layer's pages;
- block_tables: [S, max_pages] int32, page ids of each sequence in order (unused slots are ignored);
- cu_q_lens: [S + 1] int32, sequence s owns query rows cu_q_lens[s]:cu_q_lens[s+1];
- kv_lens: [S] int32, the tokens in the cache for s, this step's included.
Query i of sequence s sits at position kv_lens[s] - q_len(s) + i and attends causally to positions <= it.
A decode is a one-row query; a prefill shard attends to the cached pages before it and causally within.
"""

import torch


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slots: torch.Tensor) -> None:
    """Store keys and values [T, Hkv, D] at flat slots (page * page_tokens + offset)."""
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v)


def paged_attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                              block_tables: torch.Tensor, cu_q_lens: torch.Tensor, kv_lens: torch.Tensor,
                              scale: float, max_q_len: int | None = None) -> torch.Tensor:
    """Gather each sequence's pages into a padded batch and run masked attention in one call.

    Padding every query to the longest one of the step is cheap next to the projections when a step mixes
    one shard with many decodes, and it keeps the reference a single vectorised expression.
    """
    n_seqs = kv_lens.shape[0]
    n_heads, head_dim = q.shape[1], q.shape[2]
    page_tokens, n_kv = k_cache.shape[1], k_cache.shape[2]
    q_lens = (cu_q_lens[1:] - cu_q_lens[:-1]).long()
    kv_lens = kv_lens.long()
    max_q = int(max_q_len) if max_q_len is not None else int(q_lens.max())
    max_kv = int(kv_lens.max())
    n_pages = (max_kv + page_tokens - 1) // page_tokens

    tables = block_tables[:, :n_pages].long().clamp(min=0)
    keys = k_cache[tables].reshape(n_seqs, n_pages * page_tokens, n_kv, head_dim)[:, :max_kv]
    values = v_cache[tables].reshape(n_seqs, n_pages * page_tokens, n_kv, head_dim)[:, :max_kv]

    # Row r of sequence s is query index r; its position and whether it is real.
    rows = torch.arange(max_q, device=q.device)
    row_valid = rows[None, :] < q_lens[:, None]  # [S, max_q]
    q_pos = kv_lens[:, None] - q_lens[:, None] + rows[None, :]  # [S, max_q]
    kv_pos = torch.arange(max_kv, device=q.device)
    kv_valid = kv_pos[None, :] < kv_lens[:, None]  # [S, max_kv]
    # Slots past kv_len (unwritten page tails, other sequences' pages) may hold anything, NaN included, and
    # a NaN score or a zero probability times a NaN value stays NaN through any mask: zero them instead.
    keys = keys.masked_fill(~kv_valid[:, :, None, None], 0.0)
    values = values.masked_fill(~kv_valid[:, :, None, None], 0.0)
    mask = (kv_pos[None, None, :] <= q_pos[:, :, None]) & kv_valid[:, None, :]
    mask &= row_valid[:, :, None]

    flat_index = (cu_q_lens[:-1].long()[:, None] + rows[None, :]).clamp(max=q.shape[0] - 1)
    q_pad = q[flat_index].transpose(1, 2)  # [S, H, max_q, D]
    # Grouped-query attention without copying keys per head; rows of padding come out as NaN and are dropped.
    out = torch.nn.functional.scaled_dot_product_attention(
        q_pad, keys.transpose(1, 2), values.transpose(1, 2), attn_mask=mask[:, None], scale=scale,
        enable_gqa=n_heads != n_kv)
    return out.transpose(1, 2)[row_valid]
