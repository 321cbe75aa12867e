"""Int8 weights for a model's linear layers, on fbgemm's int8 kernel, at the quality of int8 weights alone.

Decode at small batches is bound by reading the weights, so int8 weights (a quarter of float32's bytes)
make every step cheaper. fbgemm's int8 linear is the fast int8 kernel on x86 CPUs, but it multiplies int8
activations too, and that is where the quality goes: on SmolLM2-135M, int8 weights alone cost 0.6% of
perplexity, 8-bit per-token activations 3% more, and the per-tensor activations of `quantize_dynamic`
tripled perplexity. So each row is scaled to [-1, 1] by its own maximum and fed to the kernel
twice: once as its 8-bit value and once as what that value missed, rescaled to full range. The two
integer products add up to the weights times a 15-bit activation, which is as good as float32 here, and
the second pass reads weights the first one just brought into cache. Weights get one scale per output
channel.

The replacement works on any module tree (transformers' models and our own) and never touches an
embedding, so a tied output head is quantized as a copy while the input embedding stays float32.
"""

import fnmatch
import warnings
from collections.abc import Iterable

import torch
from torch import nn

from scheduler.config import Precision

# The kernel's fixed input grid: zero point 128 and 127 steps per unit hold any value in [-1, 1].
_STEP = 1 / 127
_ZERO = 128


class Int8Linear(nn.Module):
    """A float32-in, float32-out linear layer whose weight is int8 with one scale per output channel."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight = linear.weight.detach().float()
        if weight.device.type != "cpu":
            raise ValueError("int8 linear layers run on fbgemm, a CPU kernel; the model is on " + weight.device.type)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        scales = (weight.abs().amax(dim=1) / 127).clamp(min=torch.finfo(torch.float32).tiny).double()
        zero_points = torch.zeros(self.out_features, dtype=torch.long)
        with warnings.catch_warnings():  # quantized tensors are deprecated, but are the only way into fbgemm
            warnings.simplefilter("ignore")
            qweight = torch.quantize_per_channel(weight, scales, zero_points, 0, torch.qint8)
        self._packed = torch.ops.quantized.linear_prepack(qweight, None)
        bias = None if linear.bias is None else linear.bias.detach().float().clone()
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        tiny = torch.finfo(torch.float32).tiny
        row_max = rows.abs().amax(dim=1, keepdim=True).clamp(min=tiny)
        coarse = rows / row_max
        fine = coarse - torch.round(coarse / _STEP) * _STEP  # what the 8-bit grid misses, within half a step
        fine_max = fine.abs().amax(dim=1, keepdim=True).clamp(min=tiny)
        out = self._int8_matmul(coarse)
        out += self._int8_matmul(fine / fine_max) * fine_max
        out *= row_max
        if self.bias is not None:
            out += self.bias
        return out.reshape(*x.shape[:-1], self.out_features)

    def _int8_matmul(self, unit_rows: torch.Tensor) -> torch.Tensor:
        """Weights times rows in [-1, 1], each rounded to the grid, in float32."""
        return torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(unit_rows, _STEP, _ZERO,
                                                                                 self._packed)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def quantize_linears(module: nn.Module, precision: Precision = "int8", skip: Iterable[str] = ()) -> nn.Module:
    """Replace every `nn.Linear` under `module` with an `Int8Linear`, in place; returns `module` (or its
    replacement, when `module` is itself a linear layer).

    `skip` holds glob patterns of qualified module names (e.g. "*.down_proj", "lm_head") to leave in
    float32. "fp32" changes nothing, so callers can pass a configured precision straight through.
    """
    if precision == "fp32":
        return module
    if precision != "int8":
        raise ValueError(f"unknown precision {precision!r}; expected 'fp32' or 'int8'")
    patterns = list(skip)
    if isinstance(module, nn.Linear):
        return Int8Linear(module)
    targets = [(name, child) for name, child in module.named_modules(remove_duplicate=False)
               if isinstance(child, nn.Linear) and not any(fnmatch.fnmatchcase(name, p) for p in patterns)]
    made: dict[int, Int8Linear] = {}  # a layer reached by two paths is quantized once
    for name, linear in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        if id(linear) not in made:
            made[id(linear)] = Int8Linear(linear)
        setattr(parent, attr, made[id(linear)])
    return module
