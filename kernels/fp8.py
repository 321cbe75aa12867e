"""fp8 (e4m3) KV pages with one float32 scale per page and kv head.

Why per page: a page is written token by token, so its scale grows with what it holds, and one outlier
token costs precision only in its own page. A stored value is x / scale in fp8, read back as fp8 * scale.

Writes come in position order, so a write that reaches a page's first slot starts that page afresh: its
scale restarts from the new tokens and whatever a previous owner left there is cleared. A write into a
page already holding tokens keeps the scale unless a new token needs a larger one; then the page's values
are rescaled to the new scale. Scales are powers of two, so that rescaling only shifts exponents and
rounds nothing (but values it pushes below fp8's smallest normal): a page written token by token keeps
each value within one rounding of what was written, however often its scale grows. The price is at most
one bit of range: a page's largest value lands between half of fp8's maximum and its maximum.

CPU torch has no fp8 index_copy, so writes go through a uint8 view of the same bytes.
"""

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max
_TINY = torch.finfo(torch.float32).tiny


def quantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x / scale in fp8 (saturating at fp8's largest value); scale broadcasts against x."""
    return (x.float() / scale).clamp_(-FP8_MAX, FP8_MAX).to(FP8)


def dequantize(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """fp8 values times their scale, in `dtype`."""
    return (x.float() * scale).to(dtype)


def write_kv_fp8(cache: torch.Tensor, scale: torch.Tensor, x: torch.Tensor, slots: torch.Tensor) -> None:
    """Store rows x [T, Hkv, D] at flat slots of an fp8 cache [P, page_tokens, Hkv, D] with scales [P, Hkv]."""
    page_tokens, n_kv, head_dim = cache.shape[1:]
    pages = slots // page_tokens
    touched, inverse = pages.unique(return_inverse=True)
    fresh = torch.zeros(len(touched), dtype=torch.bool, device=x.device)
    fresh[inverse[slots % page_tokens == 0]] = True
    row_max = x.detach().abs().amax(-1).float()  # [T, Hkv]
    new_max = torch.zeros(len(touched), n_kv, device=x.device).scatter_reduce_(
        0, inverse[:, None].expand(-1, n_kv), row_max, "amax")
    old = torch.where(fresh[:, None], 0.0, scale[touched])
    new = torch.maximum(old, new_max / FP8_MAX).clamp_min_(_TINY).log2_().ceil_().exp2_()
    # Keep what the page holds at the new scale: a power-of-two ratio shifts fp8 values exactly, and a
    # ratio of 0 (a fresh page) clears them.
    ratio = (old / new)[:, None, :, None]
    cache[touched] = quantize(cache[touched].float() * ratio, 1.0)
    scale[touched] = new
    rows = quantize(x, new[inverse][:, :, None])
    cache.view(torch.uint8).view(-1, n_kv, head_dim).index_copy_(0, slots, rows.view(torch.uint8))


def gather_dequantized(cache: torch.Tensor, scale: torch.Tensor, slots: torch.Tensor,
                       dtype: torch.dtype) -> torch.Tensor:
    """The rows [N, Hkv, D] at flat slots of an fp8 cache, dequantized to `dtype`."""
    page_tokens = cache.shape[1]
    rows = cache.flatten(0, 1).index_select(0, slots)
    return dequantize(rows, scale.index_select(0, slots // page_tokens)[:, :, None], dtype)
