"""The KV cache's element type, and what a page costs in bytes.

The pool is sized in bytes (a slab is `slab_bytes` of one layer's keys and values), so the dtype decides
how many tokens it holds: fp8 pages take half the bytes of bf16 ones and the same slabs hold about twice
the tokens. fp8 pages also carry one float32 scale per page, kv head and K or V (`kernels.fp8`), counted in
the page's bytes so that the comparison stays honest.
"""

import torch

from scheduler.config import EngineConfig

KV_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp8_e4m3": torch.float8_e4m3fn}
SCALE_DTYPE = torch.float32


def kv_torch_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """The cache's dtype: `auto` follows the model's weights (float32 on a CPU), else the named one."""
    if name == "auto":
        return model_dtype
    if name not in KV_DTYPES:
        raise ValueError(f"unknown KV dtype {name!r} (choose from auto, {', '.join(KV_DTYPES)})")
    return KV_DTYPES[name]


def is_scaled(dtype: torch.dtype) -> bool:
    """Whether pages of this dtype are stored with per-page scales."""
    return dtype == torch.float8_e4m3fn


def page_bytes(page_tokens: int, n_kv: int, head_dim: int, dtype: torch.dtype) -> int:
    """Bytes of one page of one layer: its keys and values, plus their scales when the dtype has them."""
    values = 2 * page_tokens * n_kv * head_dim * dtype.itemsize
    scales = 2 * n_kv * SCALE_DTYPE.itemsize if is_scaled(dtype) else 0
    return values + scales


def pages_per_slab(slab_bytes: int, page_tokens: int, n_kv: int, head_dim: int, dtype: torch.dtype) -> int:
    """How many pages of a layer one slab holds (at least one, whatever the model's size)."""
    return max(1, slab_bytes // page_bytes(page_tokens, n_kv, head_dim, dtype))


def num_slabs(config: EngineConfig, n_layers: int) -> int:
    """How many slabs a layer's pool has: `num_slabs`, or as many as `kv_bytes` holds over all layers."""
    return config.num_slabs if config.kv_bytes is None else max(1, config.kv_bytes // (config.slab_bytes * n_layers))
