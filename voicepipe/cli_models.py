"""The options of the commands that hold calls (`serve`, `talk`): the models and the scheduling policy."""

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the runtime's module imports torch: only import it when a command runs
    from voicepipe.runtime import Runtime


def add_runtime_arguments(parser: argparse.ArgumentParser) -> None:
    from voicepipe.cli import add_tts_arguments  # here: cli imports the commands' modules

    parser.add_argument("--policy", choices=("o4", "fcfs"), default="o4",
                        help="scheduling policy: o4 (deadline-aware, default) or fcfs (plain continuous batching)")
    parser.add_argument("--asr-model", metavar="DIR", help="CTranslate2 Whisper model directory")
    parser.add_argument("--llm-model", metavar="PATH", help="GGUF file or transformers checkpoint directory")
    add_tts_arguments(parser)


def load_runtime(args: argparse.Namespace) -> "Runtime":
    """Check the model paths and load the TTS first (a typo fails at once, not after the LLM's minutes of
    loading), then load the rest and start the engine."""
    from voicepipe.models import resolve_asr, resolve_llm
    from voicepipe.runtime import Runtime
    from voicepipe.stages.tts_select import make_tts

    resolve_llm(args.llm_model)
    resolve_asr(args.asr_model)
    tts = make_tts(args.tts, args.tts_model)
    return Runtime.load(args.llm_model, args.asr_model, policy=args.policy, tts=tts)
