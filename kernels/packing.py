"""The weight layout the C++ quantized linear kernels read (`kernels/cpu/quant_linear.cpp`), and their calls
(`kernels.native` must have found the library).

Output columns are grouped in panels of PANEL; inside a panel the weights are k-major (for each input index,
the panel's PANEL weights side by side), so a panel streams from memory in order and one load feeds every
vector of accumulators. Columns past the layer's width are zero padding, never written out. int4 codes
go two to a byte (k even low, k + 1 high), with one float16 scale and minimum per group of k and column.
"""

import torch

from kernels import native

PANEL = 64


def _panels(t: torch.Tensor) -> torch.Tensor:
    """[N, X] rows -> [ceil(N / PANEL), X, PANEL], zero-padded."""
    n = t.shape[0]
    padded = torch.zeros(-(-n // PANEL) * PANEL, *t.shape[1:], dtype=t.dtype)
    padded[:n] = t
    return padded.view(-1, PANEL, *t.shape[1:]).transpose(1, 2).contiguous()


def pack_int8(codes: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 codes [N, K] and a scale per row [N] as the int8 kernel reads them."""
    padded = torch.zeros(-(-len(scale) // PANEL) * PANEL, dtype=torch.float32)
    padded[:len(scale)] = scale
    return _panels(codes.to(torch.int8)), padded


def pack_int4(codes: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Codes 0..15 [N, K] with a scale and a minimum per group [N, K / group] (float16 values) as the int4
    kernel reads them."""
    codes = codes.to(torch.uint8)
    pairs = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return _panels(pairs), _panels(scales.half()), _panels(mins.half())


def int8_linear(x: torch.Tensor, panels: torch.Tensor, scale: torch.Tensor, n: int,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [.., K] float32 times the packed int8 weights: [.., n]."""
    return native.lib().int8_linear(x, panels, scale, n, bias)


def int4_linear(x: torch.Tensor, panels: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, group: int, n: int,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [.., K] float32 times the packed int4 weights: [.., n]."""
    return native.lib().int4_linear(x, panels, scales, mins, group, n, bias)
