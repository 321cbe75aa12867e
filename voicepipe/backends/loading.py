"""Loading the models and the engine that runs them, from one typed record: `serve`, `talk`, `turn`, the
benchmarks and the replicas all start here, in this process or in the engine process.

The engine's device jobs are registered here by name (`device_jobs`), so that a call's pipeline asks for a
transcript or a sentence of speech as data, which can cross into the engine process.
"""

import logging
import os
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from scheduler.config import EngineConfig
from scheduler.policies import call_policies
from voicepipe.backends.base import ASR, TTS, chat_prompt_ids

if TYPE_CHECKING:  # torch: only once something is loaded, not for parsing a command line
    from scheduler import Engine
    from scheduler.jobs import JobHandler

log = logging.getLogger("voicepipe")

# Chosen by measurement (docs/decode.md): int4 weights decode a batch of one fastest on a CPU, at float32's
# perplexity on the default model (int8: 0.6% more, faster from a few rows up); "fp32" gives exactly what
# transformers' `generate` gives. On CUDA, bf16 (int8 and int4 are CPU kernels). An engine given no precision
# takes these (scheduler.model.device.default_precision).
DEFAULT_PRECISION = "int4"
CUDA_PRECISION = "bf16"
PRECISIONS = ("fp32", "int8", "int4", "bf16", "fp16")
DEVICES = ("auto", "cpu", "cuda")
BETWEEN_STEPS_THREADS = 2  # each job runtime's threads when jobs run between model steps
ASR_BATCH = 8  # final passes per job: more would hold the device longer than one realtime step should
# The job kinds a call's pipeline submits (the metrics' `kind` label).
ASR_PARTIAL, ASR_FINAL, TTS_SENTENCE, WARM_UP = "asr_partial", "asr_final", "tts", "warm_up"


@dataclass(frozen=True)
class ModelOptions:
    """Which models, on which device as the user asked for it; `engine` the engine's own settings (the
    policy, the knobs, the pool), to which `engine_config` adds the device and precision once resolved."""

    llm_model: str | None = None
    asr_model: str | None = None
    tts: str = "piper"
    tts_model: str | None = None
    device: str = "auto"
    llm_precision: str | None = None
    torch_threads: int | None = None  # torch's intra-op threads in the engine (None: see `set_torch_threads`)
    engine: EngineConfig = field(default_factory=EngineConfig)

    @property
    def policy(self) -> str:
        return self.engine.policy

    def under(self, policy: str) -> "ModelOptions":
        """The same models under another scheduling policy (the benches compare them)."""
        return replace(self, engine=replace(self.engine, policy=policy))


def phase(what: str) -> None:
    """One line on stderr per start-up phase: loading takes long enough to wonder whether anything happens."""
    print(f"voicepipe: {what} ...", file=sys.stderr, flush=True)


def placement(options: ModelOptions) -> dict[str, str]:
    """The engine's `device` and `precision`; a pair that cannot run is a ModelError."""
    from scheduler.model.device import DeviceUnavailable, check_precision, default_precision, resolve_device
    from voicepipe.backends.models import ModelError

    try:
        device = resolve_device(options.device)
        precision = options.llm_precision or default_precision(device)
        check_precision(device, precision)
    except DeviceUnavailable as e:
        raise ModelError(str(e)) from None
    return {"device": device.type, "precision": precision}


def job_threads(config: EngineConfig, device: str) -> int:
    """Where a served engine runs its device jobs, unless asked: on a CUDA device on a lane beside the model's
    steps with the CPU's cores less the server's (Piper's sentences no longer stop the GPU), on a CPU between
    the steps, where each job gets every core (measured on 2 cores, docs/performance.md "Calls per device":
    the lane freed the API's steps but slowed Whisper and Piper, on one thread each, more than the calls
    gained)."""
    if config.job_threads is not None:
        return config.job_threads
    return max(1, (os.cpu_count() or 2) - 1) if device == "cuda" else 0


def engine_config(options: ModelOptions) -> EngineConfig:
    """The engine's whole configuration, made once (in the server, before any engine process starts): the
    model paths and the placement are checked first, so a typo fails at once, not after minutes of loading.
    The engine keeps its step-cost fit for the next start where this machine's fits are kept, named for the
    model, its placement and threads (voicepipe.backends.fits), unless the options name a file, or "" for none."""
    from voicepipe.backends.fits import engine_fit_path
    from voicepipe.backends.models import resolve_asr, resolve_llm

    check_call_policy(options.policy)
    model = resolve_llm(options.llm_model)
    resolve_asr(options.asr_model)
    placed = placement(options)
    lane = job_threads(options.engine, placed["device"])
    kept = options.engine.step_cost_file
    if kept is None:
        kept = str(engine_fit_path(model, placed["precision"], placed["device"], lane, options.torch_threads))
    return replace(options.engine, **placed, job_threads=lane, step_cost_file=kept)


def check_call_policy(name: str) -> None:
    """ValueError unless `name` is a policy that may serve live calls (`scheduler.policies`)."""
    if name not in call_policies():
        raise ValueError(f"policy must be one of {', '.join(call_policies())}, not {name!r}")


def set_torch_threads(options: ModelOptions, config: EngineConfig) -> None:
    """torch's threads in the engine: as asked, else on a CPU the cores left by the server (one) and by the
    job lane (`job_threads`), at least one. Measured (`bench convoy`, docs/performance.md): beside a busy
    server process on 2 cores, with 2 threads a batch-1 decode step took 2.3x and a 224-token prefill step
    8.8x as long as alone (each parallel region waits for the thread that shares its core with the server);
    with 1 thread, 1.03x and 1.01x, at 1.1x and 1.7x the 2-thread steps' time alone."""
    import torch

    threads = options.torch_threads
    if threads is None and config.device == "cpu":
        threads = max(1, (os.cpu_count() or 2) - 1 - (config.job_threads or 0))
    if threads is not None:
        torch.set_num_threads(threads)


def load_voice_models(options: ModelOptions, config: EngineConfig) -> tuple[ASR, TTS]:
    """The TTS first (a bad voice fails fast), then Whisper, which follows the LLM onto CUDA (CTranslate2,
    float16 there); Piper stays on the CPU, where onnxruntime's wheel from PyPI runs it. On a job lane each
    runtime takes the lane's threads; between steps, the defaults (two each)."""
    from voicepipe.backends.asr_whisper import WhisperASR
    from voicepipe.backends.tts_select import make_tts

    threads = job_runtime_threads(config)
    phase("loading the TTS voice")
    tts = make_tts(options.tts, options.tts_model, threads)
    phase("loading Whisper")
    placed = {"device": "cuda", "compute_type": "float16"} if config.device == "cuda" else {}
    asr = WhisperASR(options.asr_model, **placed, cpu_threads=threads)
    return asr, tts


def job_runtime_threads(config: EngineConfig) -> int:
    """The threads each job runtime (CTranslate2, onnxruntime) gets: the lane's, or two between steps."""
    return config.job_threads or BETWEEN_STEPS_THREADS


def device_jobs(asr: ASR, tts: TTS) -> dict[str, "JobHandler"]:
    """The engine's device jobs over these models. Final passes come in batches: callers who stop speaking
    together share one encoder call (an ASR with `transcribe_batch`; any other goes one by one)."""
    from scheduler.jobs import JobHandler

    def finals(batch: list[tuple[np.ndarray]]) -> list[str]:
        audios = [audio for (audio,) in batch]
        many = getattr(asr, "transcribe_batch", None)
        return [t or "" for t in (many(audios) if many is not None else [asr.transcribe(a) for a in audios])]

    def sentence(text: str) -> tuple[list[np.ndarray], float, list[float] | None]:
        """The sentence's audio, the seconds it took, and where each of its words ends in that audio (None
        from a voice that cannot tell)."""
        start = time.perf_counter()
        timed = getattr(tts, "synthesize_words", None)
        chunks, ends = timed(text) if timed is not None else (list(tts.synthesize(text)), None)
        return [np.asarray(c, np.int16) for c in chunks if len(c)], time.perf_counter() - start, ends

    def warm_up() -> None:
        asr.transcribe(np.zeros(asr.sample_rate, np.float32))
        list(tts.synthesize("Hello."))

    return {ASR_PARTIAL: JobHandler(lambda audio: asr.transcribe(audio) or ""),
            ASR_FINAL: JobHandler(finals, batch=ASR_BATCH),
            TTS_SENTENCE: JobHandler(sentence),
            WARM_UP: JobHandler(warm_up)}


def voice_info(model: Any, asr: ASR, tts: TTS) -> dict[str, Any]:
    """What the server needs to know of the models it does not hold."""
    return {"model_id": model_name(model), "asr_rate": asr.sample_rate, "tts_rate": tts.sample_rate}


def model_name(model: Any) -> str:
    """The id the API lists: the checkpoint's name, as transformers recorded where it came from."""
    path = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
    return Path(path).name or "voicepipe"


def make_engine(model: Any, tokenizer: Any, asr: ASR, tts: TTS, config: EngineConfig) -> "Engine":
    from scheduler import Engine

    return Engine(model, tokenizer, config, device_jobs(asr, tts))


def warm_up_engine(engine: "Engine") -> None:
    """Run each model once on the engine, before it serves, so the first caller waits for no lazy set-up (a
    constrained request too: the grammar worker starts, about 3 s)."""
    from scheduler import SamplingParams, Sequence
    from scheduler.grammar.constraint import Grammar

    engine.handlers[WARM_UP].fn()
    prompt = chat_prompt_ids(engine.tokenizer, [{"role": "user", "content": "Hello."}])
    engine.add_request(Sequence(prompt, SamplingParams(max_tokens=2)))
    engine.add_request(Sequence(prompt, SamplingParams(max_tokens=2, grammar=Grammar("json_object"))))
    while engine.step():
        pass
    engine.take_outputs()


def load_models(options: ModelOptions, config: EngineConfig) -> tuple[Any, Any, ASR, TTS]:
    """(model, tokenizer, asr, tts): every model the options name, placed as `config` says. The one load
    path of an engine in its own process (`build_engine`) and of one on a thread (`Runtime.load`)."""
    from voicepipe.backends.models import load_llm

    asr, tts = load_voice_models(options, config)
    phase("loading the LLM")
    model, tokenizer = load_llm(options.llm_model)
    return model, tokenizer, asr, tts


def ready_engine(model: Any, tokenizer: Any, asr: ASR, tts: TTS, config: EngineConfig) -> "Engine":
    """The engine over loaded models, warmed up before it serves, wherever it will run."""
    phase(f"starting the engine ({config.policy}, {config.precision} weights on {config.device})")
    engine = make_engine(model, tokenizer, asr, tts, config)
    warm_up_engine(engine)
    return engine


def build_engine(config: EngineConfig, options: ModelOptions) -> tuple["Engine", dict[str, Any]]:
    """The engine process's factory: load every model named by the options, make the engine with the
    configuration the server made (`engine_config`), warm it up."""
    from voicepipe.backends import threads

    threads.configure()  # before torch or CTranslate2 loads in this process
    set_torch_threads(options, config)
    model, tokenizer, asr, tts = load_models(options, config)
    return ready_engine(model, tokenizer, asr, tts, config), voice_info(model, asr, tts)
