"""The options the commands share, each declared once: the models and their device, the LLM's backend and
sampling, the voice, the scheduling policy; and loading what they name."""

import argparse
import logging
import sys
import time
from typing import TYPE_CHECKING

from voicepipe.backends.base import LLM, GenerationParams
from voicepipe.instructions import DEFAULT_INSTRUCTIONS

if TYPE_CHECKING:  # it imports torch: only when a command runs
    from voicepipe.runtime import Runtime

log = logging.getLogger("voicepipe")


# Chosen by measurement (README, Performance): int8 weights decode about twice as fast on a CPU, at 0.5%
# more perplexity; "fp32" gives exactly what transformers' `generate` gives. On CUDA, bf16 (int8 is fbgemm's,
# a CPU kernel). An engine given no precision takes these (scheduler.device.default_precision).
DEFAULT_PRECISION = "int8"
CUDA_PRECISION = "bf16"
PRECISIONS = ("fp32", "int8", "bf16", "fp16")
POLICIES = ("o4", "fcfs")
DEVICES = ("auto", "cpu", "cuda")


def usable_device(name: str) -> str:
    """argparse type of --device: `cuda` where torch sees none is refused while parsing (exit status 2)."""
    if name == "cuda":
        from scheduler.device import DeviceUnavailable, resolve_device  # torch: only when CUDA is asked for

        try:
            resolve_device(name)
        except DeviceUnavailable as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return name


def add_llm_model_arguments(parser: argparse.ArgumentParser) -> None:
    """Which LLM, the precision of its weights and the device: every command that loads it takes these."""
    parser.add_argument("--llm-model", metavar="PATH", help="GGUF file or transformers checkpoint directory")
    parser.add_argument("--llm-precision", choices=PRECISIONS, default=None,
                        help=f"weights of the engine's LLM (default: {DEFAULT_PRECISION} on a CPU, {CUDA_PRECISION} "
                             "on CUDA; int8 runs on CPUs only)")
    parser.add_argument("--device", type=usable_device, choices=DEVICES, default="auto",
                        help="where the LLM runs: auto (CUDA when torch sees one, default), cpu or cuda")


def engine_placement(args: argparse.Namespace) -> dict[str, str]:
    """The engine's `device` and `precision` from the options; a pair that cannot run is a ModelError."""
    from scheduler.device import DeviceUnavailable, check_precision, default_precision, resolve_device
    from voicepipe.models import ModelError

    try:
        device = resolve_device(args.device)
        precision = args.llm_precision or default_precision(device)
        check_precision(device, precision)
    except DeviceUnavailable as e:
        raise ModelError(str(e)) from None
    return {"device": device.type, "precision": precision}


def add_runtime_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the commands that hold calls (`serve`, `talk`)."""
    parser.add_argument("--policy", choices=POLICIES, default="o4",
                        help="scheduling policy: o4 (deadline-aware, default) or fcfs (plain continuous batching)")
    parser.add_argument("--asr-model", metavar="DIR", help="CTranslate2 Whisper model directory")
    add_llm_model_arguments(parser)
    add_tts_arguments(parser)


def phase(what: str) -> None:
    """One line on stderr per start-up phase: loading takes long enough to wonder whether anything happens."""
    print(f"voicepipe: {what} ...", file=sys.stderr, flush=True)


def load_runtime(args: argparse.Namespace) -> "Runtime":
    """Check the model paths and load the TTS first (a typo fails at once, not after the LLM's minutes of
    loading), then load the rest and start the engine."""
    from scheduler import EngineConfig
    from voicepipe.backends.asr_whisper import WhisperASR
    from voicepipe.backends.tts_select import make_tts
    from voicepipe.models import load_llm, resolve_asr, resolve_llm
    from voicepipe.runtime import Runtime

    resolve_llm(args.llm_model)
    resolve_asr(args.asr_model)
    placement = engine_placement(args)  # int8 asked for on CUDA fails here, before any loading
    phase("loading the TTS voice")
    tts = make_tts(args.tts, args.tts_model)
    phase("loading Whisper")
    # Whisper follows the LLM onto CUDA (CTranslate2, float16 there); Piper stays on the CPU, where
    # onnxruntime's wheel from PyPI runs it.
    asr = WhisperASR(args.asr_model, **({"device": "cuda", "compute_type": "float16"}
                                        if placement["device"] == "cuda" else {}))
    phase("loading the LLM")
    model, tokenizer = load_llm(args.llm_model)
    phase(f"starting the engine ({args.policy}, {placement['precision']} weights on {placement['device']})")
    return Runtime.start(model, tokenizer, asr, tts, policy=args.policy, config=EngineConfig(**placement))


def add_tts_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of every command that speaks."""
    from voicepipe.backends.tts_select import TTS_CHOICES

    parser.add_argument("--tts", choices=TTS_CHOICES, default="piper", help="TTS engine (default: piper)")
    parser.add_argument("--tts-model", "--tts-voice", dest="tts_model", metavar="PATH",
                        help="Piper voice .onnx (its .onnx.json beside it) or Coqui model directory")


def add_llm_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `chat`: the LLM, its backend and its sampling."""
    add_llm_model_arguments(parser)
    parser.add_argument("--backend", choices=("engine", "hf"), default="engine",
                        help="engine: mini-O4 (default); hf: transformers generate, the correctness oracle")
    add_reply_arguments(parser)
    parser.add_argument("--top-p", type=float, default=1.0)


def add_reply_arguments(parser: argparse.ArgumentParser) -> None:
    """What the assistant is told and how long and how freely it answers (`chat`, `turn`)."""
    parser.add_argument("--system", default=DEFAULT_INSTRUCTIONS,
                        help="system prompt; '' sends none (default: a concise spoken assistant)")
    parser.add_argument("--max-tokens", type=int, default=GenerationParams.max_tokens, metavar="N")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")


def generation_params(args: argparse.Namespace) -> GenerationParams:
    """Sampling settings from the LLM options."""
    return GenerationParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p)


def load_llm_backend(args: argparse.Namespace) -> LLM:
    """Load the LLM named by the options and wrap it in the chosen backend."""
    from voicepipe.backends.llm_select import make_llm
    from voicepipe.models import load_llm

    started = time.perf_counter()
    model, tokenizer = load_llm(args.llm_model)
    log.info("LLM loaded in %.1f s", time.perf_counter() - started)
    return make_llm(args.backend, model, tokenizer, args.llm_precision, args.device)


def add_verbose_argument(parser: argparse.ArgumentParser) -> None:
    """`-v` after a subcommand as well as before it: where it goes is the user's habit, not a rule to learn.
    Not given, it leaves what the main parser found."""
    parser.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="log progress to stderr")
