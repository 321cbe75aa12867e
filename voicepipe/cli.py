"""The `voicepipe` command.

Each subcommand is a `Command`: one function registering its arguments and one running it. Inputs are
checked before any model loads, and bad input (an unreadable audio file, a missing model) ends with one
line on stderr, `voicepipe: error: ...`, and exit status 2, as argparse does for bad arguments.
"""

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from voicepipe import __version__, threads
from voicepipe.audio import AudioError, read_audio, write_wav
from voicepipe.cli_models import add_llm_model_arguments
from voicepipe.cli_talk import add_talk_arguments, run_talk
from voicepipe.instructions import DEFAULT_INSTRUCTIONS
from voicepipe.llm_backends import BACKENDS
from voicepipe.models import ModelError
from voicepipe.stages.base import LLM, GenerationParams
from voicepipe.turn import build_messages

log = logging.getLogger("voicepipe")


class UsageError(Exception):
    """Input the command cannot work with; reported in one line like a bad argument."""


@dataclass(frozen=True)
class Command:
    """A subcommand: its name, one line of help, and the functions that register and run it."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def add_tts_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of every command that speaks."""
    from voicepipe.stages.tts_select import TTS_CHOICES

    parser.add_argument("--tts", choices=TTS_CHOICES, default="piper", help="TTS engine (default: piper)")
    parser.add_argument("--tts-model", "--tts-voice", dest="tts_model", metavar="PATH",
                        help="Piper voice .onnx (its .onnx.json beside it) or Coqui model directory")


def add_llm_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of every command that asks the LLM."""
    add_llm_model_arguments(parser)
    parser.add_argument("--backend", choices=BACKENDS, default="engine",
                        help="engine: mini-O4 (default); hf: transformers generate, the correctness oracle")
    parser.add_argument("--system", default=DEFAULT_INSTRUCTIONS,
                        help="system prompt; '' sends none (default: a concise spoken assistant)")
    parser.add_argument("--max-tokens", type=int, default=GenerationParams.max_tokens, metavar="N")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0)


def generation_params(args: argparse.Namespace) -> GenerationParams:
    """Sampling settings from the LLM options."""
    return GenerationParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p)


def make_llm_stage(args: argparse.Namespace) -> LLM:
    """Load the LLM named by the options and wrap it in the chosen backend."""
    from voicepipe.llm_backends import make_llm
    from voicepipe.models import load_llm

    started = time.perf_counter()
    model, tokenizer = load_llm(args.llm_model)
    log.info("LLM loaded in %.1f s", time.perf_counter() - started)
    return make_llm(args.backend, model, tokenizer, args.llm_precision)


def add_transcribe_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="audio file (WAV of any rate and sample format)")
    parser.add_argument("--asr-model", metavar="DIR", help="CTranslate2 Whisper model directory")


def run_transcribe(args: argparse.Namespace) -> int:
    from voicepipe.stages.asr_whisper import WhisperASR

    audio = read_audio(args.file, WhisperASR.sample_rate)
    print(WhisperASR(args.asr_model).transcribe(audio))
    return 0


def add_say_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", help="what to say")
    parser.add_argument("-o", "--output", required=True, metavar="OUT.wav", help="WAV file to write")
    add_tts_arguments(parser)


def run_say(args: argparse.Namespace) -> int:
    from voicepipe.stages.tts_select import make_tts

    if not args.text.strip():
        raise UsageError("TEXT is empty: nothing to say")
    tts = make_tts(args.tts, args.tts_model)
    chunks = list(tts.synthesize(args.text))
    if not chunks:
        raise UsageError(f"TEXT {args.text!r} has nothing to pronounce")
    write_wav(args.output, np.concatenate(chunks), tts.sample_rate)
    return 0


def add_chat_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", help="the user's message")
    add_llm_arguments(parser)


def run_chat(args: argparse.Namespace) -> int:
    llm = make_llm_stage(args)

    async def stream() -> None:
        async for delta in llm.stream(build_messages(args.text, args.system), generation_params(args)):
            sys.stdout.write(delta)
            sys.stdout.flush()

    asyncio.run(stream())
    sys.stdout.write("\n")
    return 0


def add_turn_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", metavar="IN.wav", help="the spoken question")
    parser.add_argument("-o", "--output", required=True, metavar="OUT.wav", help="WAV file for the reply")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.add_argument("--asr-model", metavar="DIR", help="CTranslate2 Whisper model directory")
    add_tts_arguments(parser)
    add_llm_arguments(parser)


def run_turn_command(args: argparse.Namespace) -> int:
    from voicepipe.models import resolve_asr, resolve_llm
    from voicepipe.stages.asr_whisper import WhisperASR
    from voicepipe.stages.tts_select import make_tts
    from voicepipe.turn import run_turn

    read_audio(args.input, WhisperASR.sample_rate)  # fail on bad input before minutes of loading
    resolve_asr(args.asr_model)
    resolve_llm(args.llm_model)
    asr, tts, llm = WhisperASR(args.asr_model), make_tts(args.tts, args.tts_model), make_llm_stage(args)
    result = asyncio.run(run_turn(args.input, asr, llm, tts, generation_params(args), args.system))
    write_wav(args.output, result.audio, result.sample_rate)
    if args.json:
        print(json.dumps({"transcript": result.transcript, "answer": result.answer,
                          "timings": result.timings, "output": str(args.output)}))
    else:
        print(f"transcript: {result.transcript}")
        print(f"answer:     {result.answer}")
        print("timings:    " + ", ".join(
            f"{name} {'-' if value is None else f'{value:.2f}'}" for name, value in result.timings.items()))
        print(f"output:     {args.output}")
    return 0


COMMANDS = [
    Command("transcribe", "print the transcript of an audio file", add_transcribe_arguments, run_transcribe),
    Command("say", "speak TEXT into a WAV file", add_say_arguments, run_say),
    Command("chat", "stream the LLM's answer to TEXT", add_chat_arguments, run_chat),
    Command("turn", "answer a spoken question with speech, timing each stage", add_turn_arguments,
            run_turn_command),
]


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    from voicepipe.bench.cli_bench import (
        add_calls_arguments,
        add_engine_arguments,
        add_mixed_arguments,
        add_threads_arguments,
    )

    which = parser.add_subparsers(dest="bench", required=True, metavar="WHAT")
    benches = [
        (add_engine_arguments, "engine", "one LLM workload through static, fcfs, o4, hf_static, hf_cb"),
        (add_calls_arguments, "calls", "simulated callers over the websocket, o4 vs fcfs"),
        (add_mixed_arguments, "mixed", "voice calls beside streams of /v1/chat/completions, o4 vs fcfs"),
        (add_threads_arguments, "threads", "thread-pool policies of torch, CTranslate2 and onnxruntime, each in a "
                                           "fresh process"),
    ]
    for add_arguments, name, description in benches:
        sub = which.add_parser(name, help=description)
        add_verbose_argument(sub)
        add_arguments(sub)


def run_bench(args: argparse.Namespace) -> int:
    from voicepipe.bench.cli_bench import run_calls_bench, run_engine_bench, run_mixed_bench, run_threads_bench

    runs = {"engine": run_engine_bench, "calls": run_calls_bench, "mixed": run_mixed_bench,
            "threads": run_threads_bench}
    return runs[args.bench](args)


def add_serve_command_arguments(parser: argparse.ArgumentParser) -> None:
    from voicepipe.cli_serve import add_serve_arguments

    add_serve_arguments(parser)


def run_serve_command(args: argparse.Namespace) -> int:
    from voicepipe.cli_serve import run_serve

    return run_serve(args)


COMMANDS.append(Command("serve", "serve the web page, voice calls and OpenAI-compatible APIs",
                        add_serve_command_arguments, run_serve_command))
COMMANDS.append(Command("talk", "talk with the assistant through the microphone and speakers (use headphones)",
                        add_talk_arguments, run_talk))
COMMANDS.append(Command("bench", "measure the engine (bench engine) or whole calls (bench calls)",
                        add_bench_arguments, run_bench))


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one subparser per command."""
    parser = argparse.ArgumentParser(prog="voicepipe", description="A streaming voice assistant.")
    parser.add_argument("--version", action="version", version=f"voicepipe {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        sub = subparsers.add_parser(command.name, help=command.help, description=command.help)
        add_verbose_argument(sub)
        command.add_arguments(sub)
        sub.set_defaults(run=command.run)
    return parser


def add_verbose_argument(parser: argparse.ArgumentParser) -> None:
    """`-v` after a subcommand as well as before it: where it goes is the user's habit, not a rule to learn.
    Not given, it leaves what the main parser found."""
    parser.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="log progress to stderr")


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; the exit status is 0, 2 for bad input, or 130 when interrupted."""
    threads.configure()  # before torch or CTranslate2 loads
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr,
                        format="voicepipe: %(message)s")
    if not args.verbose:
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # also silences transformers' bars
    try:
        return args.run(args)
    except (AudioError, ModelError, UsageError, OSError) as e:
        print(f"voicepipe: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
