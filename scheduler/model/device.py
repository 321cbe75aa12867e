"""Where the engine's model runs, and in which dtype.

`auto` takes CUDA when torch sees a device, else the CPU, so a machine with a GPU uses it without being
told. Asking for CUDA where there is none is an error, never a silent fall back to the CPU: a run measured
or served on the wrong device would be worse than no run.
"""

import torch
from torch import nn

DEVICES = ("auto", "cpu", "cuda")
# Weight dtypes by precision name; int8 and int4 keep float32 storage here and are converted by
# scheduler.model.quantize.
WEIGHT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "int8": torch.float32,
                 "int4": torch.float32}


class DeviceUnavailable(ValueError):
    """The device asked for cannot be used here; the message says why in one line."""


def resolve_device(name: str) -> torch.device:
    """`auto`, `cpu` or `cuda` to a torch device; `cuda` without CUDA raises DeviceUnavailable."""
    if name not in DEVICES:
        raise DeviceUnavailable(f"unknown device {name!r} (choose from {', '.join(DEVICES)})")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise DeviceUnavailable("--device cuda: torch sees no CUDA device (is this torch a CPU build?)")
    return torch.device(name)


def default_precision(device: torch.device) -> str:
    """int4 weights on a CPU (its C++ kernels: the fastest batch-1 decode there, at float32's perplexity on
    the default model, docs/decode.md), bf16 on CUDA."""
    return "bf16" if device.type == "cuda" else "int4"


def check_precision(device: torch.device, precision: str) -> None:
    """Refuse a precision the device cannot run: the int8 and int4 linears are CPU kernels."""
    if precision not in WEIGHT_DTYPES:
        raise ValueError(f"unknown precision {precision!r} (choose from {', '.join(WEIGHT_DTYPES)})")
    if precision in ("int8", "int4") and device.type != "cpu":
        raise DeviceUnavailable(f"{precision} weights run on CPUs only; use bf16 or fp16 on {device.type}")


def place_model(model: nn.Module, device: str | None, precision: str | None) -> str:
    """Move and cast the model in place to the device (None: where it is) and the precision's dtype (None:
    the device's default); returns the precision."""
    first = next(model.parameters())
    target = first.device if device is None else resolve_device(device)
    precision = precision or default_precision(target)
    check_precision(target, precision)
    dtype = WEIGHT_DTYPES[precision]
    if first.device != target or first.dtype != dtype:
        model.to(device=target, dtype=dtype)
    return precision
