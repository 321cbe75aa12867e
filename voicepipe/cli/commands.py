"""The `voicepipe` command.

Each subcommand is a `Command`: one function registering its arguments and one running it. Inputs are
checked before any model loads, and bad input (an unreadable audio file, a missing model) ends with one
line on stderr, `voicepipe: error: ...`, and exit status 2, as argparse does for bad arguments. Building
the parser imports no model library, so `--help` and a bad flag answer at once.
"""

import argparse
import logging
import os
import sys

from voicepipe import __version__
from voicepipe.audio import AudioError
from voicepipe.backends import threads
from voicepipe.backends.models import ModelError
from voicepipe.cli.bench import add_bench_arguments, run_bench
from voicepipe.cli.command import Command, UsageError
from voicepipe.cli.oneshot import (
    add_chat_arguments,
    add_say_arguments,
    add_transcribe_arguments,
    add_turn_arguments,
    run_chat,
    run_say,
    run_transcribe,
    run_turn_command,
)
from voicepipe.cli.options import add_verbose_argument
from voicepipe.cli.serve import add_serve_arguments, run_serve
from voicepipe.cli.simulate import add_simulate_arguments, run_simulate
from voicepipe.cli.talk import add_talk_arguments, run_talk

COMMANDS = [
    Command("transcribe", "print the transcript of an audio file", add_transcribe_arguments, run_transcribe),
    Command("say", "speak TEXT into a WAV file", add_say_arguments, run_say),
    Command("chat", "stream the LLM's answer to TEXT", add_chat_arguments, run_chat),
    Command("turn", "answer a spoken question with speech, timing each stage", add_turn_arguments,
            run_turn_command),
    Command("serve", "serve the web page, voice calls and OpenAI-compatible APIs", add_serve_arguments, run_serve),
    Command("talk", "talk with the assistant through the microphone and speakers (its echo cancelled)",
            add_talk_arguments, run_talk),
    Command("bench", "measure the engine, whole calls, calls beside API traffic, or thread pools",
            add_bench_arguments, run_bench),
    Command("simulate", "mini-O4's own planner on a GPU it does not have: virtual time, priced steps",
            add_simulate_arguments, run_simulate),
]


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
