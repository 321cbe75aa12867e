"""The options of the commands that hold calls (`serve`, `talk`): the models and the scheduling policy."""

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the runtime's module imports torch: only import it when a command runs
    from voicepipe.runtime import Runtime


# Chosen by measurement (README, Performance): int8 weights decode about twice as fast on a CPU, at 0.5%
# more perplexity; "fp32" gives exactly what transformers' `generate` gives.
DEFAULT_PRECISION = "int8"
PRECISIONS = ("fp32", "int8")
POLICIES = ("o4", "fcfs")


def add_llm_model_arguments(parser: argparse.ArgumentParser) -> None:
    """Which LLM, and the precision of its weights: every command that loads it takes these."""
    parser.add_argument("--llm-model", metavar="PATH", help="GGUF file or transformers checkpoint directory")
    parser.add_argument("--llm-precision", choices=PRECISIONS, default=DEFAULT_PRECISION,
                        help=f"weights of the engine's LLM (default: {DEFAULT_PRECISION}; int8 runs on CPUs only)")


def add_runtime_arguments(parser: argparse.ArgumentParser) -> None:
    from voicepipe.cli import add_tts_arguments  # here: cli imports the commands' modules

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
    from voicepipe.models import load_llm, resolve_asr, resolve_llm
    from voicepipe.runtime import Runtime
    from voicepipe.stages.asr_whisper import WhisperASR
    from voicepipe.stages.tts_select import make_tts

    resolve_llm(args.llm_model)
    resolve_asr(args.asr_model)
    phase("loading the TTS voice")
    tts = make_tts(args.tts, args.tts_model)
    phase("loading Whisper")
    asr = WhisperASR(args.asr_model)
    phase("loading the LLM")
    model, tokenizer = load_llm(args.llm_model)
    phase(f"starting the engine ({args.policy}, {args.llm_precision} weights)")
    return Runtime.start(model, tokenizer, asr, tts, policy=args.policy,
                         config=EngineConfig(precision=args.llm_precision))
