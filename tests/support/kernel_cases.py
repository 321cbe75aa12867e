"""Paged-attention cases for the kernel tests: sequences' pages scattered over a pool, every slot nobody
owns poisoned with NaN, so a kernel that reads a wrong page fails loudly."""

import math
from dataclasses import dataclass

import torch


@dataclass
class Case:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    cu_q_lens: torch.Tensor
    kv_lens: torch.Tensor
    scale: float

    def args(self) -> tuple:
        return self.q, self.k_cache, self.v_cache, self.block_tables, self.cu_q_lens, self.kv_lens, self.scale


def make_case(q_lens: list[int], kv_lens: list[int], page_tokens: int, n_heads: int, n_kv: int,
              head_dim: int, seed: int, spare_pages: int = 3) -> Case:
    """Scatter each sequence's pages randomly over a pool and poison every slot nobody owns."""
    gen = torch.Generator().manual_seed(seed)
    pages = [math.ceil(n / page_tokens) for n in kv_lens]
    n_pool = sum(pages) + spare_pages
    order = torch.randperm(n_pool, generator=gen)
    tables = torch.full((len(kv_lens), max(pages, default=0) + 1), -1, dtype=torch.int32)
    k_cache = torch.full((n_pool, page_tokens, n_kv, head_dim), float("nan"))
    v_cache = torch.full_like(k_cache, float("nan"))
    used = 0
    for s, (n_pages, kv_len) in enumerate(zip(pages, kv_lens, strict=True)):
        ids = order[used:used + n_pages]
        used += n_pages
        tables[s, :n_pages] = ids.to(torch.int32)
        pos = torch.arange(kv_len)
        k_cache[ids[pos // page_tokens], pos % page_tokens] = torch.randn(kv_len, n_kv, head_dim, generator=gen)
        v_cache[ids[pos // page_tokens], pos % page_tokens] = torch.randn(kv_len, n_kv, head_dim, generator=gen)
    q = torch.randn(sum(q_lens), n_heads, head_dim, generator=gen)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    return Case(q, k_cache, v_cache, tables, cu, torch.tensor(kv_lens, dtype=torch.int32), head_dim ** -0.5)


def random_lengths(kind: str, n_seqs: int, seed: int) -> tuple[list[int], list[int]]:
    """(q_lens, kv_lens) for all decodes, all prefill shards (some with no cached context) or a mix."""
    gen = torch.Generator().manual_seed(seed)

    def rand(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (1,), generator=gen))

    q_lens, kv_lens = [], []
    for i in range(n_seqs):
        decode = kind == "decode" or (kind == "mixed" and i % 2 == 0)
        q_len = 1 if decode else rand(2, 40)
        context = rand(0, 70) if decode or i % 3 else 0
        q_lens.append(q_len)
        kv_lens.append(context + q_len)
    return q_lens, kv_lens
