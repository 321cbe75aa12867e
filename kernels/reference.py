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

from dataclasses import dataclass

import torch


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slots: torch.Tensor) -> None:
    """Store keys and values [T, Hkv, D] at flat slots (page * page_tokens + offset)."""
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v)


@dataclass(frozen=True, slots=True)
class PagedLayout:
    """Where each sequence's queries and keys sit in a step: the same for every layer, so computed once."""

    pages: torch.Tensor  # [S, n_pages] page ids covering each sequence's keys
    max_kv: int
    kv_valid: torch.Tensor  # [S, max_kv]
    mask: torch.Tensor  # [S, 1, max_q, max_kv], True where a query may attend
    q_index: torch.Tensor  # [S, max_q] packed row of each padded query (clamped)
    row_valid: torch.Tensor  # [S, max_q]


def paged_layout(block_tables: torch.Tensor, cu_q_lens: torch.Tensor, kv_lens: torch.Tensor, page_tokens: int,
                 max_q_len: int | None = None) -> PagedLayout:
    q_lens = (cu_q_lens[1:] - cu_q_lens[:-1]).long()
    kv_lens = kv_lens.long()
    max_q = int(max_q_len) if max_q_len is not None else int(q_lens.max())
    max_kv = int(kv_lens.max())
    n_pages = (max_kv + page_tokens - 1) // page_tokens
    rows = torch.arange(max_q, device=kv_lens.device)
    row_valid = rows[None, :] < q_lens[:, None]
    q_pos = kv_lens[:, None] - q_lens[:, None] + rows[None, :]
    kv_pos = torch.arange(max_kv, device=kv_lens.device)
    kv_valid = kv_pos[None, :] < kv_lens[:, None]
    mask = (kv_pos[None, None, :] <= q_pos[:, :, None]) & kv_valid[:, None, :] & row_valid[:, :, None]
    last_row = max(int(cu_q_lens[-1]) - 1, 0)
    q_index = (cu_q_lens[:-1].long()[:, None] + rows[None, :]).clamp(max=last_row)
    return PagedLayout(block_tables[:, :n_pages].long().clamp(min=0), max_kv, kv_valid, mask[:, None], q_index,
                       row_valid)


def paged_attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                              block_tables: torch.Tensor, cu_q_lens: torch.Tensor, kv_lens: torch.Tensor,
                              scale: float, max_q_len: int | None = None,
                              layout: PagedLayout | None = None) -> torch.Tensor:
    """Gather each sequence's pages into a padded batch and run masked attention in one call.

    Padding every query to the longest one of the step is cheap next to the projections when a step mixes
    one shard with many decodes, and it keeps the reference a single vectorised expression. A caller running
    many layers over one step passes the `layout` it computed once.
    """
    if layout is None:
        layout = paged_layout(block_tables, cu_q_lens, kv_lens, k_cache.shape[1], max_q_len)
    n_seqs, n_heads = layout.pages.shape[0], q.shape[1]
    n_kv, head_dim = k_cache.shape[2], k_cache.shape[3]
    shape = (n_seqs, -1, n_kv, head_dim)
    # Slots past kv_len (unwritten page tails, other sequences' pages) may hold anything, NaN included, and
    # a NaN score or a zero probability times a NaN value stays NaN through any mask: zero them instead.
    invalid = ~layout.kv_valid[:, :, None, None]
    keys = k_cache[layout.pages].reshape(shape)[:, :layout.max_kv].masked_fill(invalid, 0.0)
    values = v_cache[layout.pages].reshape(shape)[:, :layout.max_kv].masked_fill(invalid, 0.0)
    q_pad = q[layout.q_index].transpose(1, 2)  # [S, H, max_q, D]
    # Grouped-query attention without copying keys per head; rows of padding come out as NaN and are dropped.
    out = torch.nn.functional.scaled_dot_product_attention(
        q_pad, keys.transpose(1, 2), values.transpose(1, 2), attn_mask=layout.mask, scale=scale,
        enable_gqa=n_heads != n_kv)
    return out.transpose(1, 2)[layout.row_valid]
