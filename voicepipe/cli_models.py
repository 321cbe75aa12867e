"""The options of the commands that hold calls (`serve`, `talk`): the models and the scheduling policy."""

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the runtime's module imports torch: only import it when a command runs
    from voicepipe.runtime import Runtime


# Chosen by measurement (README, Performance): int8 weights decode about twice as fast on a CPU, at 0.5%
# more perplexity; "fp32" gives exactly what transformers' `generate` gives.
DEFAULT_PRECISION = "int8"


def add_llm_model_arguments(parser: argparse.ArgumentParser) -> None:
    """Which LLM, and the precision of its weights: every command that loads it takes these."""
    parser.add_argument("--llm-model", metavar="PATH", help="GGUF file or transformers checkpoint directory")
    parser.add_argument("--llm-precision", choices=("fp32", "int8"), default=DEFAULT_PRECISION,
                        help=f"weights of the engine's LLM (default: {DEFAULT_PRECISION}; int8 runs on CPUs only)")


def add_runtime_arguments(parser: argparse.ArgumentParser) -> None:
    from voicepipe.cli import add_tts_arguments  # here: cli imports the commands' modules

    parser.add_argument("--policy", choices=("o4", "fcfs"), default="o4",
                        help="scheduling policy: o4 (deadline-aware, default) or fcfs (plain continuous batching)")
    parser.add_argument("--asr-model", metavar="DIR", help="CTranslate2 Whisper model directory")
    add_llm_model_arguments(parser)
    add_tts_arguments(parser)


def load_runtime(args: argparse.Namespace) -> "Runtime":
    """Check the model paths and load the TTS first (a typo fails at once, not after the LLM's minutes of
    loading), then load the rest and start the engine."""
    from scheduler import EngineConfig
    from voicepipe.models import resolve_asr, resolve_llm
    from voicepipe.runtime import Runtime
    from voicepipe.stages.tts_select import make_tts

    resolve_llm(args.llm_model)
    resolve_asr(args.asr_model)
    tts = make_tts(args.tts, args.tts_model)
    return Runtime.load(args.llm_model, args.asr_model, policy=args.policy, tts=tts,
                        config=EngineConfig(precision=args.llm_precision))
