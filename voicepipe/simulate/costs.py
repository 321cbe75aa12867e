"""The models and devices `simulate` knows by name, and the cost model each pair is priced by.

A GPU is priced by the roofline from its datasheet rates (scheduler.sim.devices); `cpu-measured` by the
model fitted to this machine's measured steps (made by `voicepipe simulate calibrate`, at set-up or on first
use, and cached beside the kernels), which holds only for the model, precision and machine it was measured
on: a fit made on another CPU kind was off by 3.5x here, so none is shipped.
"""

import hashlib
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scheduler import EngineConfig
from scheduler.sim import DEVICES, DTYPES, Efficiency, FittedCost, ModelShape, Roofline
from voicepipe.bench.shapes import SHAPES

MODELS = {"llama-2-13b": "13b", "smollm2-135m": "default", "tiny": "tiny"}  # name -> voicepipe.bench.shapes key
CPU = "cpu-measured"
DEVICE_NAMES = (*DEVICES, CPU)
FITTED = ("smollm2-135m", "int8")  # what the CPU's fit measures (voicepipe.simulate.cpu_runs)


def _cpu_identity() -> str:
    """The CPU's model name and feature flags, and how many cores this process may use."""
    lines = []
    try:
        lines = [line for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith(("model name", "flags"))][:2]
    except OSError:
        lines = [platform.processor()]
    return " ".join([*lines, str(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())])


def machine_fit_path() -> Path:
    """Where this machine's fit is cached: beside the kernels (`$VOICEPIPE_CACHE`, else ~/.cache/voicepipe),
    named for the CPU, its cores and the kernels' build (their sources, torch), so another machine or new
    kernels fit their own."""
    from kernels.native import cache_dir, library_path

    key = hashlib.sha256(f"{_cpu_identity()} {library_path().name}".encode()).hexdigest()[:16]
    return cache_dir().parent / "fits" / f"cpu-{FITTED[0]}-{FITTED[1]}-{key}.json"


@dataclass(frozen=True, slots=True)
class JobPrices:
    """Device seconds of a call's ASR final pass and of its speech synthesis, and where the numbers come from."""

    asr_final_s: float
    tts_per_audio_s: float  # seconds of device work per second of speech (a real-time factor)
    about: str


# This CPU: DESIGN.md's measurements (Whisper tiny.en padded to the utterance plus 1-2 s: 100-180 ms for a
# 3-5 s clip; Piper: real-time factor 0.17-0.20). The GPUs, good to a factor of two:
# - TTS: PaddleSpeech's TTS benchmark (wiki "TTS Benchmark", one A100-80GB, one request at a time):
#   FastSpeech2 + HiFi-GAN at a real-time factor of 0.0218; an H100 taken 1.5x as fast (assumed).
# - ASR: a Whisper large-v3-turbo final pass over an utterance-length window (faster-whisper's README: 13 min of
#   audio in 19 s on an RTX 2080 Ti, 0.7 s a 30-s window with beam 5); by the roofline its encoder over 5 s of
#   audio is a few ms on these GPUs, so the pass is its ~10 decoder steps and launch costs (assumed 60/40 ms).
JOB_PRICES = {
    CPU: JobPrices(0.14, 0.185, "measured on this CPU (DESIGN.md): Whisper tiny.en trimmed pass, Piper RTF"),
    "a100-80g": JobPrices(0.06, 0.022, "ASR assumed (x2); TTS PaddleSpeech FastSpeech2+HiFi-GAN on an A100"),
    "h100": JobPrices(0.04, 0.015, "assumed (x2): the A100's, 1.5x as fast"),
    "h200": JobPrices(0.04, 0.015, "assumed (x2): as the H100 (same compute)"),
}


def model_shape(model: str) -> ModelShape:
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r} (choose from {', '.join(MODELS)})")
    return ModelShape.from_config(model, SHAPES[MODELS[model]])


@dataclass
class Priced:
    """A model on a device: its shape, its step cost, its job prices and the pool the engine gets there."""

    shape: ModelShape
    cost: Any  # Roofline or FittedCost
    jobs: JobPrices
    pool: dict[str, Any]  # EngineConfig fields sizing the KV pool
    about: dict
    kv_itemsize: int = 2  # bytes of a cached key or value element


def priced(device: str, model: str, dtype: str, efficiency: Efficiency | None = None,
           fit: Path | None = None) -> Priced:
    shape = model_shape(model)
    if device == CPU:
        if (model, dtype) != FITTED:
            raise ValueError(f"the CPU's cost model is fitted on {FITTED[0]} in {FITTED[1]}, not {model} in {dtype}")
        path = fit or machine_fit_path()
        if not path.exists():
            raise ValueError("this machine has no step-cost fit yet: run `voicepipe simulate calibrate` (minutes)")
        cost = FittedCost.load(path)
        pool = {"num_slabs": EngineConfig().num_slabs}  # the engine's default, as measured
        # The CPU engine keeps its KV cache in the weights' float32, int8 weights included.
        return Priced(shape, cost, JOB_PRICES[CPU], pool, {"cost_model": "fitted", **cost.about}, kv_itemsize=4)
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r} (choose from {', '.join(DEVICE_NAMES)})")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r} for a GPU (choose from {', '.join(DTYPES)})")
    roofline = Roofline(shape, DEVICES[device], DTYPES[dtype], efficiency)
    kv = roofline.kv_capacity_bytes()
    if kv <= 0:
        raise ValueError(f"{model} in {dtype} does not fit in {device}'s memory")
    return Priced(shape, roofline, JOB_PRICES[device], {"kv_bytes": int(kv)},
                  {"cost_model": "roofline", **roofline.describe(), "kv_cache_gb": kv / 1e9,
                   "dtype_about": DTYPES[dtype].about})
