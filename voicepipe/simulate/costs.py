"""The models and devices `simulate` knows by name, and the cost model each pair is priced by.

A GPU is priced by the roofline from its datasheet rates (scheduler.sim.devices); `cpu-measured` by a model
fitted to this machine's measured steps: the engine's own, kept by the last engine that served the default
model here (refitted from its steps as it serves), else the calibrated one (made by `voicepipe simulate
calibrate`, at set-up or on first use); both are kept beside the kernels and hold only for the model,
precision and machine they were measured on: a fit made on another CPU kind was off by 3.5x here, so none is
shipped.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scheduler import EngineConfig
from scheduler.sim import DEVICES, DTYPES, Efficiency, FittedCost, ModelShape, Roofline
from scheduler.step_cost import OnlineCost
from voicepipe.backends.fits import fit_path
from voicepipe.bench.shapes import SHAPES

if TYPE_CHECKING:
    from scheduler.sim.runner import StepCost

MODELS = {"llama-2-13b": "13b", "smollm2-135m": "default", "tiny": "tiny"}  # name -> voicepipe.bench.shapes key
CPU = "cpu-measured"
DEVICE_NAMES = (*DEVICES, CPU)
FITTED = ("smollm2-135m", "int8")  # what the CPU's fit measures (voicepipe.simulate.cpu_runs)


def machine_fit_path() -> Path:
    """Where this machine's calibrated fit is cached (voicepipe.backends.fits), so another machine or new
    kernels fit their own."""
    return fit_path(f"cpu-{FITTED[0]}-{FITTED[1]}")


@dataclass(frozen=True, slots=True)
class JobPrices:
    """Device seconds of a call's ASR final pass and of its speech synthesis, and where the numbers come from."""

    asr_final_s: float
    tts_per_audio_s: float  # seconds of device work per second of speech (a real-time factor)
    about: str
    batch: int = 1  # jobs of a kind one run takes, several calls' at once (final passes, sentences)
    batch_extra: float = 1.0  # each further job of a run, as a fraction of its dearest one's price

    def run_s(self, prices: list[float]) -> float:
        """One run over several jobs of a kind, each priced alone at `prices`: padded to the dearest (the
        longest sentence), whose price each further job adds a fraction of."""
        return max(prices) * (1 + self.batch_extra * (len(prices) - 1))


# This CPU: DESIGN.md's measurements (Whisper tiny.en padded to the utterance plus 1-2 s: 100-180 ms for a
# 3-5 s clip; Piper: real-time factor 0.17-0.20). The GPUs, good to a factor of two:
# - TTS: PaddleSpeech's TTS benchmark (wiki "TTS Benchmark", one A100-80GB, one request at a time):
#   FastSpeech2 + HiFi-GAN at a real-time factor of 0.0218; an H100 taken 1.5x as fast (assumed).
# - ASR: a Whisper large-v3-turbo final pass over an utterance-length window (faster-whisper's README: 13 min of
#   audio in 19 s on an RTX 2080 Ti, 0.7 s a 30-s window with beam 5); by the roofline its encoder over 5 s of
#   audio is a few ms on these GPUs, so the pass is its ~10 decoder steps and launch costs (assumed 60/40 ms).
# - Batched across calls: a GPU runs up to 8 final passes or 8 sentences at once (the engine's final passes
#   batch as much: voicepipe.backends.loading.ASR_BATCH), each after the dearest adding a quarter of its price
#   (assumed; Du et al., "Efficient Incremental Text-to-Speech on GPUs", arXiv 2211.13939: on one A10, 10x
#   the requests a second raised a short text's RTF from 0.041 to 0.076, about 0.1 a further request;
#   `simulate seed` reports 0.1-0.5). This CPU's jobs are priced one a run: Piper batched on it took as long
#   as sentence by sentence or longer (docs/simulator.md), and a final pass is priced as DESIGN.md measured it.
GPU_BATCH = {"batch": 8, "batch_extra": 0.25}
JOB_PRICES = {
    CPU: JobPrices(0.14, 0.185, "measured on this CPU (DESIGN.md): Whisper tiny.en trimmed pass, Piper RTF"),
    "a100-80g": JobPrices(0.06, 0.022, "ASR assumed (x2); TTS PaddleSpeech FastSpeech2+HiFi-GAN on an A100",
                          **GPU_BATCH),
    "h100": JobPrices(0.04, 0.015, "assumed (x2): the A100's, 1.5x as fast", **GPU_BATCH),
    "h200": JobPrices(0.04, 0.015, "assumed (x2): as the H100 (same compute)", **GPU_BATCH),
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
        cost, about = cpu_cost(model, dtype, fit)
        pool = {"num_slabs": EngineConfig().num_slabs}  # the engine's default, as measured
        # The CPU engine keeps its KV cache in the weights' float32, int8 weights included.
        return Priced(shape, cost, JOB_PRICES[CPU], pool, about, kv_itemsize=4)
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


def cpu_cost(model: str, dtype: str, fit: Path | None = None) -> tuple["StepCost", dict]:
    """This CPU's price of a step of the default model (SmolLM2-135M) in `dtype`: the fit at `fit`, else the
    engine's own (`served_fit`), else the calibrated fit (int8: `voicepipe simulate calibrate`)."""
    if model != FITTED[0]:
        raise ValueError(f"this CPU's cost models price {FITTED[0]}, the served default, not {model}")
    if fit is None and (served := served_fit(dtype)) is not None:
        return served, {"cost_model": "the engine's own fit", **served.fitted}
    if fit is None and dtype != FITTED[1]:
        raise ValueError(f"no engine has served {model} in {dtype} on this machine yet, and the calibrated fit "
                         f"is {FITTED[1]}'s")
    path = fit or machine_fit_path()
    if not path.exists():
        raise ValueError("this machine has no step-cost fit yet: run `voicepipe simulate calibrate` (minutes)")
    cost = FittedCost.load(path)
    return cost, {"cost_model": "fitted", **cost.about}


def served_fit(dtype: str) -> OnlineCost | None:
    """The fit an engine kept here serving the default model in `dtype` on this CPU with the server's default
    threads (refitted to every step it ran, as it served); None where none is kept or can be used."""
    from voicepipe.backends.fits import engine_fit_path
    from voicepipe.backends.loading import job_threads
    from voicepipe.backends.models import ModelError, resolve_llm

    try:
        path = engine_fit_path(resolve_llm(), dtype, "cpu", job_threads(EngineConfig(), "cpu"), None)
    except ModelError:
        return None
    engine = OnlineCost(kept_at=str(path))
    return engine if engine.ready else None
