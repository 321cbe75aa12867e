"""The options the commands share, each declared once: the models and their device, the LLM's backend and
sampling, the voice, the scheduling policy; and loading what they name."""

import argparse
import logging
import time
from typing import TYPE_CHECKING

from scheduler.config import DEFAULT_POLICY
from scheduler.policies import POLICIES, call_policies
from voicepipe.backends.arguments import add_llm_model_arguments, model_options
from voicepipe.backends.base import LLM, GenerationParams
from voicepipe.pipeline.instructions import DEFAULT_INSTRUCTIONS

if TYPE_CHECKING:  # it imports torch: only when a command runs
    from voicepipe.call.runtime import Runtime

log = logging.getLogger("voicepipe")


def add_runtime_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the commands that hold calls (`serve`, `talk`)."""
    about = ", ".join(f"{name} ({POLICIES[name].about})" for name in call_policies())
    parser.add_argument("--policy", choices=call_policies(), default=DEFAULT_POLICY,
                        help=f"scheduling policy (default {DEFAULT_POLICY}): {about}")
    parser.add_argument("--asr-model", metavar="DIR", help="CTranslate2 Whisper model directory")
    parser.add_argument("--torch-threads", type=int, metavar="N", default=None,
                        help="torch's threads in the engine (default on a CPU: the cores the server and the job lane "
                             "leave, so a busy server does not stall every step; docs/architecture.md)")
    parser.add_argument("--job-threads", type=int, metavar="N", default=None,
                        help="device jobs (Whisper, Piper): 0 between the model's steps, N on a lane of their own "
                             "with N threads beside them (default: the lane on CUDA, between steps on a CPU; "
                             "docs/performance.md, Calls per device)")
    add_llm_model_arguments(parser)
    add_tts_arguments(parser)


def load_runtime(args: argparse.Namespace) -> "Runtime":
    """The models the options name, with their engine on a thread of this process (`talk`, `turn`)."""
    from voicepipe.call.runtime import Runtime

    return Runtime.load(model_options(args))


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
    from voicepipe.backends.models import load_llm

    started = time.perf_counter()
    model, tokenizer = load_llm(args.llm_model)
    log.info("LLM loaded in %.1f s", time.perf_counter() - started)
    return make_llm(args.backend, model, tokenizer, args.llm_precision, args.device)


def add_verbose_argument(parser: argparse.ArgumentParser) -> None:
    """`-v` after a subcommand as well as before it: where it goes is the user's habit, not a rule to learn.
    Not given, it leaves what the main parser found."""
    parser.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="log progress to stderr")
