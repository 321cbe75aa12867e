"""Quantized linear layers: int8 weights with a scale per output channel (float32 activations), or int4
weights in groups of 32 inputs with a scale and a minimum each (activations quantized to int8 in runs of 16).

Decode at small batches is bound by reading the weights, so fewer bytes per weight make every step cheaper:
int8 reads a quarter of float32's bytes, int4 (with its group scales) about a sixth. The products run in the
C++ kernels of `kernels.packing`. int8 widens its codes to float32 inside the dot product, so its activations
are never rounded. int4 multiplies its 4-bit codes by int8 activations as integer dot products (32 byte
products an instruction), each run of 16 activations with its own scale, so that an outlier rounds only its
own run: per-tensor int8 activations had tripled SmolLM2-135M's perplexity, these cost int4 0.8% of it.
Where the kernels were not built, each layer keeps its dequantized weights as a float32 matrix instead: the
same weights, activations unrounded, at float32's speed.

int4's groups follow the default model's own GGUF file (Q4_1: 32 weights, a scale and a minimum): its
decoder layers come back exactly. Its output head was stored with 8 bits (Q8_0), and int4 there cost 8%
perplexity, so under int4 the head is int8; measured on the public-domain text, int4 so made is 0.8% above
float32's perplexity, int8 0.6% (docs/decode.md).

The replacement works on any module tree (transformers' models and our own) and never touches an
embedding, so a tied output head is quantized as a copy while the input embedding stays float32.
"""

import fnmatch
from collections.abc import Iterable

import torch
from torch import nn

from kernels import native, packing
from scheduler.config import Precision

INT4_GROUP = 32
HEADS = ("lm_head", "*.lm_head")  # output heads, int8 under int4


class QuantizedLinear(nn.Module):
    """A float32-in, float32-out linear layer over quantized weights; subclasses say how they are coded."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        if linear.weight.device.type != "cpu":
            raise ValueError("quantized linear layers run on the CPU; the model is on " + linear.weight.device.type)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        bias = None if linear.bias is None else linear.bias.detach().float().clone()
        self.register_buffer("bias", bias)
        self.fast = native.lib() is not None

    def keep(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Hold the coded weights as buffers: copied, moved and saved with the module."""
        for name, tensor in tensors:
            self.register_buffer(name, tensor)

    def packed(self):
        """The C++ kernels' own handle on these weights (`native.lib().PackedLinear`, which the one-call
        decode layers run), or None under the float32 fallback."""
        if not self.fast:
            return None
        return native.lib().PackedLinear(*self.packed_weights(), self.bias, self.group, self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"kernel={'C++' if self.fast else 'float32 fallback'}")


class Int8Linear(QuantizedLinear):
    """int8 weights, one scale per output channel (symmetric: codes -127..127)."""

    def __init__(self, linear: nn.Linear):
        super().__init__(linear)
        weight = linear.weight.detach().float()
        scale = (weight.abs().amax(dim=1) / 127).clamp(min=torch.finfo(torch.float32).tiny)
        codes = torch.round(weight / scale[:, None]).clamp(-127, 127)
        if self.fast:
            self.keep(zip(("panels", "scale"), packing.pack_int8(codes, scale), strict=True))
        else:
            self.keep([("weight", codes * scale[:, None])])

    group = 0  # no groups: the kernels' mark of int8

    def packed_weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.panels, self.scale, self.scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fast:
            return packing.int8_linear(x, self.panels, self.scale, self.out_features, self.bias)
        return nn.functional.linear(x, self.weight, self.bias)


class Int4Linear(QuantizedLinear):
    """int4 weights in groups of `group` inputs, each with a scale and a minimum: w = code * scale + min."""

    def __init__(self, linear: nn.Linear, group: int = INT4_GROUP):
        super().__init__(linear)
        if self.in_features % group:
            raise ValueError(f"int4 groups of {group} do not divide {self.in_features} inputs")
        self.group = group
        weight = linear.weight.detach().float().view(self.out_features, -1, group)
        # Scales and minimums are stored as float16 (their bytes are a tenth of the layer's): the codes are
        # rounded against the stored values.
        low, high = weight.amin(dim=-1), weight.amax(dim=-1)
        low = low.half().float()
        scales = ((high - low) / 15).half().float()
        codes = torch.round((weight - low[..., None]) / scales[..., None].clamp(min=torch.finfo(torch.float16).tiny))
        codes = codes.clamp(0, 15)
        if self.fast:
            self.keep(zip(("panels", "scales", "mins"), packing.pack_int4(codes.flatten(1), scales, low),
                          strict=True))
        else:
            self.keep([("weight", (codes * scales[..., None] + low[..., None]).flatten(1))])

    def packed_weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.panels, self.scales, self.mins

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fast:
            return packing.int4_linear(x, self.panels, self.scales, self.mins, self.group, self.out_features,
                                       self.bias)
        return nn.functional.linear(x, self.weight, self.bias)


def quantized(linear: nn.Linear, precision: Precision, name: str = "") -> QuantizedLinear:
    """The layer named `name` in `precision`; under int4 an output head, or a layer whose inputs the groups
    do not divide, is int8."""
    head = any(fnmatch.fnmatchcase(name, p) for p in HEADS)
    if precision == "int4" and not head and linear.in_features % INT4_GROUP == 0:
        return Int4Linear(linear)
    return Int8Linear(linear)


def quantize_linears(module: nn.Module, precision: Precision = "int8", skip: Iterable[str] = ()) -> nn.Module:
    """Replace every `nn.Linear` under `module` with its quantized form, in place; returns `module` (or its
    replacement, when `module` is itself a linear layer).

    `skip` holds glob patterns of qualified module names (e.g. "*.down_proj", "lm_head") to leave in
    float32. "fp32" changes nothing, so callers can pass a configured precision straight through.
    """
    if precision == "fp32":
        return module
    if precision not in ("int8", "int4"):
        raise ValueError(f"unknown precision {precision!r}; expected 'fp32', 'int8' or 'int4'")
    patterns = list(skip)
    if isinstance(module, nn.Linear):
        return quantized(module, precision)
    targets = [(name, child) for name, child in module.named_modules(remove_duplicate=False)
               if isinstance(child, nn.Linear) and not any(fnmatch.fnmatchcase(name, p) for p in patterns)]
    made: dict[int, QuantizedLinear] = {}  # a layer reached by two paths is quantized once
    for name, linear in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        if id(linear) not in made:
            made[id(linear)] = quantized(linear, precision, name)
        setattr(parent, attr, made[id(linear)])
    return module
