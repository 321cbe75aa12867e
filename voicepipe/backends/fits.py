"""Where step-cost fits are kept on this machine: beside the kernels (`$VOICEPIPE_CACHE`, else
~/.cache/voicepipe), each named for what it holds for: the CPU (its model name, flags and the cores this
process may use), the kernels' build (their sources, torch), and, for an engine's own fit, the model,
precision, device (a GPU by name) and threads it served with. Another machine, new kernels or another
model fit their own."""

import hashlib
import os
import platform
from pathlib import Path


def machine_identity() -> str:
    """The CPU's model name and feature flags, how many cores this process may use, and the kernels' build."""
    from kernels.native import library_path

    try:
        lines = [line for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith(("model name", "flags"))][:2]
    except OSError:
        lines = [platform.processor()]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return " ".join([*lines, str(cores), library_path().name])


def fit_path(name: str, *about: str) -> Path:
    """`fits/{name}-{key}.json`, the key a digest of this machine and of `about`."""
    from kernels.native import cache_dir

    key = hashlib.sha256(" ".join((machine_identity(), *about)).encode()).hexdigest()[:16]
    return cache_dir().parent / "fits" / f"{name}-{key}.json"


def engine_fit_path(model: Path, precision: str, device: str, job_threads: int, torch_threads: int | None) -> Path:
    """Where an engine serving `model` (a resolved GGUF file or checkpoint) keeps its own step-cost fit, named
    for its placement and the threads that set a step's speed; on CUDA the GPU is named too."""
    stat = model.stat()
    about = (f"job threads {job_threads}", f"torch {torch_threads}")
    if device == "cuda":
        import torch

        about = (*about, torch.cuda.get_device_name(), os.environ.get("CUDA_VISIBLE_DEVICES", ""))
    return fit_path(f"engine-{model.stem}-{precision}-{device}", str(model.resolve()), str(stat.st_size),
                    str(int(stat.st_mtime)), *about)
