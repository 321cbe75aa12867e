"""Paged attention in plain PyTorch: the reference every other kernel is tested against.

Layout (shared with the Triton kernels):
- q: [T, H, D], the queries of all sequences of a step packed one after another;
- k_cache, v_cache: [P, page_tokens, Hkv, D], one layer's pages;
- block_tables: [S, max_pages] int32, page ids of each sequence in order (unused slots are ignored);
- cu_q_lens: [S + 1] int32, sequence s owns query rows cu_q_lens[s]:cu_q_lens[s+1];
- kv_lens: [S] int32, the tokens in the cache for s, this step's included;
- scales: for fp8 caches only, (k_scale, v_scale), each [P, Hkv] float32 (`kernels.fp8`).
Query i of sequence s sits at position kv_len(s) - q_len(s) + i and attends causally to positions <= it.
A decode is a one-row query; a prefill shard attends to the cached pages before it and causally within.
"""

from dataclasses import dataclass

import torch

from kernels.fp8 import gather_dequantized, write_kv_fp8

Scales = tuple[torch.Tensor, torch.Tensor] | None


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slots: torch.Tensor, scales: Scales = None) -> None:
    """Store keys and values [T, Hkv, D] at flat slots (page * page_tokens + offset)."""
    if scales is not None:
        write_kv_fp8(k_cache, scales[0], k, slots)
        write_kv_fp8(v_cache, scales[1], v, slots)
        return
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k.to(k_cache.dtype))
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v.to(v_cache.dtype))


@dataclass(frozen=True, slots=True)
class QueryGroup:
    """Sequences attended in one padded call: the decodes (one row each), or the prefill shards.

    Decodes and shards are padded apart so that a step mixing many decodes with one 64-token shard does
    not pad every decode to 64 query rows.
    """

    q_index: torch.Tensor  # [S * max_q] packed row of each padded query (clamped to one of its own rows)
    kv_slots: torch.Tensor  # [S * max_kv] flat cache slot of each key; past kv_len, the slot of position 0
    bias: torch.Tensor  # [S, 1, max_q, max_kv] added to the scores: 0 where a query may attend, else -inf
    real: torch.Tensor | None  # indices of the real queries among the S * max_q padded ones; None: all


@dataclass(frozen=True, slots=True)
class PagedLayout:
    """Where each sequence's queries and keys sit in a step: the same for every layer, so computed once."""

    groups: tuple[QueryGroup, ...]
    order: torch.Tensor | None  # packed row of each row of the groups' outputs, concatenated; None: in order


def _query_group(seqs: list[int], starts: list[int], q_lens: list[int], kv_lens: list[int],
                 block_tables: torch.Tensor, page_tokens: int, dtype: torch.dtype) -> QueryGroup:
    device = block_tables.device
    max_q, max_kv = max(q_lens), max(kv_lens)
    start, q_len, kv_len = (torch.tensor(x, device=device)[:, None] for x in (starts, q_lens, kv_lens))
    rows = torch.arange(max_q, device=device)[None, :]
    row_valid = rows < q_len
    q_pos = kv_len - q_len + rows
    kv_pos = torch.arange(max_kv, device=device)[None, :]
    kv_valid = kv_pos < kv_len
    mask = (kv_pos[:, None, :] <= q_pos[:, :, None]) & kv_valid[:, None, :] & row_valid[:, :, None]
    # Every sequence owns position 0, so its slot holds a finite key and value: reading it in place of the
    # slots past kv_len (page tails, pages of others, unused table entries) adds exactly nothing once masked.
    pos = torch.where(kv_valid, kv_pos, 0)
    pages = block_tables[torch.tensor(seqs, device=device)].long().gather(1, pos // page_tokens)
    real = None if min(q_lens) == max_q else row_valid.flatten().nonzero().squeeze(1)
    # Attention would turn a boolean mask into this bias in every layer; the step builds it once.
    bias = torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill_(~mask, float("-inf"))
    return QueryGroup((start + torch.minimum(rows, q_len - 1)).flatten(),
                      (pages * page_tokens + pos % page_tokens).flatten(), bias[:, None], real)


def paged_layout(block_tables: torch.Tensor, cu_q_lens: torch.Tensor, kv_lens: torch.Tensor, page_tokens: int,
                 dtype: torch.dtype) -> PagedLayout:
    """Group the step's sequences into decodes and prefill shards; sequences with no rows drop out."""
    cu, kv = cu_q_lens.tolist(), kv_lens.tolist()
    members: dict[bool, list[int]] = {False: [], True: []}
    for s in range(len(kv)):
        if cu[s + 1] > cu[s]:
            members[cu[s + 1] - cu[s] > 1].append(s)
    groups, rows = [], []
    for seqs in (m for m in members.values() if m):
        starts, q_lens = [cu[s] for s in seqs], [cu[s + 1] - cu[s] for s in seqs]
        groups.append(_query_group(seqs, starts, q_lens, [kv[s] for s in seqs], block_tables, page_tokens,
                                    dtype))
        rows += [r for s in seqs for r in range(cu[s], cu[s + 1])]
    order = None if len(groups) == 1 else torch.tensor(rows, device=cu_q_lens.device)
    return PagedLayout(tuple(groups), order)


def paged_attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                              block_tables: torch.Tensor, cu_q_lens: torch.Tensor, kv_lens: torch.Tensor,
                              scale: float, max_q_len: int | None = None,
                              layout: PagedLayout | None = None, scales: Scales = None) -> torch.Tensor:
    """Gather each group's keys into a padded batch and run masked attention in one call per group.

    `max_q_len` is accepted for the common kernel signature; the reference reads the lengths themselves.
    A caller running many layers over one step passes the `layout` it computed once. An fp8 cache is read
    through its `scales`: the gathered keys and values are dequantized to the queries' dtype.
    """
    if layout is None:
        layout = paged_layout(block_tables, cu_q_lens, kv_lens, k_cache.shape[1], q.dtype)
    n_heads, n_kv = q.shape[1], k_cache.shape[2]
    keys_flat, values_flat = k_cache.flatten(0, 1), v_cache.flatten(0, 1)
    outs = []
    for group in layout.groups:
        n_seqs, _, max_q, max_kv = group.bias.shape
        # index_select with flat indices: several times faster on the CPU than indexing with a 2-d index.
        if scales is None:
            keys = keys_flat.index_select(0, group.kv_slots).to(q.dtype)
            values = values_flat.index_select(0, group.kv_slots).to(q.dtype)
        else:
            keys = gather_dequantized(k_cache, scales[0], group.kv_slots, q.dtype)
            values = gather_dequantized(v_cache, scales[1], group.kv_slots, q.dtype)
        keys = keys.view(n_seqs, max_kv, n_kv, -1).transpose(1, 2)
        values = values.view(n_seqs, max_kv, n_kv, -1).transpose(1, 2)
        q_pad = q.index_select(0, group.q_index).view(n_seqs, max_q, n_heads, -1).transpose(1, 2)
        # Grouped-query attention without copying keys per head; rows of padding come out as NaN, dropped.
        out = torch.nn.functional.scaled_dot_product_attention(
            q_pad, keys, values, attn_mask=group.bias, scale=scale, enable_gqa=n_heads != n_kv)
        out = out.transpose(1, 2).flatten(0, 1)  # [S * max_q, H, D]
        outs.append(out if group.real is None else out[group.real])
    out = outs[0] if len(outs) == 1 else torch.cat(outs)
    return out if layout.order is None else torch.empty_like(out).index_copy_(0, layout.order, out)
