"""Python faces of the C++ decode-step ops (`kernels/cpu/decode_ops.cpp`), for float32 tensors on the CPU.

Each replaces several torch ops of a layer with one call: at batch 1 the calls, not the arithmetic, are
most of a layer's time. `usable` says whether a model's shapes and cache can take them at all.
"""

from typing import Any

import torch

from kernels import native

DecodeLayers = Any  # `native.lib().DecodeLayers`, which exists only once the library is loaded


def usable(kv_dtype: torch.dtype, device: torch.device, head_dim: int, n_heads: int, n_kv: int) -> bool:
    """The library is built and loaded, and the ops cover this cache and these heads."""
    return (device.type == "cpu" and kv_dtype == torch.float32 and head_dim in (64, 128)
            and n_heads % n_kv == 0 and n_heads // n_kv <= 8 and native.lib() is not None)


def rotary_write_kv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                    slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, n_heads: int) -> None:
    """Rotate the query and key heads of qkv [T, (H + 2 Hkv) D] in place (cos and signed sin tables [L, D],
    as `scheduler.model.llama.RotaryTable` holds them) and store keys and values at their flat cache slots."""
    native.lib().rotary_write_kv(qkv, cos, sin, positions, slots, k_cache, v_cache, n_heads)


def decode_attention(qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                     kv_lens: torch.Tensor, n_heads: int, scale: float) -> torch.Tensor:
    """Attention [S, H D] of one query row per sequence (the first H D columns of qkv [S, ..]) over its
    pages (`kernels.reference` describes the layout)."""
    return native.lib().decode_attention(qkv, k_cache, v_cache, block_tables, kv_lens, n_heads, scale)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return native.lib().rms_norm(x, weight, eps)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of gate_up [.., 2 I] holding gate then up."""
    return native.lib().silu_mul(gate_up)


def decode_layers(layers: list[tuple], n_heads: int, eps: float, scale: float) -> DecodeLayers:
    """Every decoder layer of a decode step as one C++ call (`.run`): each layer given as its two norms'
    weights and its packed qkv, o, gate_up and down projections (`QuantizedLinear.packed`)."""
    lib = native.lib()
    return lib.DecodeLayers([lib.DecodeLayer(*layer) for layer in layers], n_heads, eps, scale)
