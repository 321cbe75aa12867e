"""The weight layout the C++ quantized linear kernels read (`kernels/cpu/quant_linear.cpp`), and their calls
(`kernels.native` must have found the library).

Output columns are grouped in panels of PANEL; inside a panel the weights are k-major (for each input index,
the panel's PANEL weights side by side), so a panel streams from memory in order and one load feeds every
vector of accumulators. Columns past the layer's width are zero padding, never written out. int4 codes
go two to a byte, with one float16 scale and minimum per group of k and column; inside a panel, each run of 8
k's is 8 blocks of 8 columns, 4 bytes a column (byte i: k + i low, k + 4 + i high), so that four codes of a
column fill the 32-bit lane of an integer dot product.
"""

import torch

from kernels import native

PANEL = 64


def _padded(t: torch.Tensor) -> torch.Tensor:
    """[N, X] rows -> [ceil(N / PANEL), PANEL, X], zero-padded."""
    n = t.shape[0]
    padded = torch.zeros(-(-n // PANEL) * PANEL, *t.shape[1:], dtype=t.dtype)
    padded[:n] = t
    return padded.view(-1, PANEL, *t.shape[1:])


def _panels(t: torch.Tensor) -> torch.Tensor:
    """[N, X] rows -> [ceil(N / PANEL), X, PANEL], zero-padded."""
    return _padded(t).transpose(1, 2).contiguous()


def pack_int8(codes: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 codes [N, K] and a scale per row [N] as the int8 kernel reads them."""
    padded = torch.zeros(-(-len(scale) // PANEL) * PANEL, dtype=torch.float32)
    padded[:len(scale)] = scale
    return _panels(codes.to(torch.int8)), padded


def pack_int4(codes: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Codes 0..15 [N, K] with a scale and a minimum per group [N, K / group] (float16 values) as the int4
    kernel reads them."""
    k = codes.shape[1]
    # panel, block of 8 columns, column, run of 8 k's, low or high nibble, 4 k's
    c = _padded(codes.to(torch.uint8)).view(-1, PANEL // 8, 8, k // 8, 2, 4)
    pairs = c[..., 0, :] | (c[..., 1, :] << 4)
    runs = pairs.permute(0, 3, 1, 2, 4).reshape(-1, k // 2, PANEL)
    return runs.contiguous(), _panels(scales.half()), _panels(mins.half())


def int8_linear(x: torch.Tensor, panels: torch.Tensor, scale: torch.Tensor, n: int,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [.., K] float32 times the packed int8 weights: [.., n]."""
    return native.lib().int8_linear(x, panels, scale, n, bias)


def int4_linear(x: torch.Tensor, panels: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, group: int, n: int,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [.., K] float32 times the packed int4 weights: [.., n]."""
    return native.lib().int4_linear(x, panels, scales, mins, group, n, bias)
