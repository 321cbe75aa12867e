"""`python -m voicepipe.bench engine ...`: the engine benchmark without the rest of the command line.

`voicepipe bench engine` takes the same options; this entry point imports only what the engine needs
(torch, transformers, numpy), so it runs on a GPU machine that has no audio packages installed.
"""

import argparse
import sys

from voicepipe.backends import threads
from voicepipe.bench.engine_command import add_engine_arguments, run_engine_bench


def main(argv: list[str] | None = None) -> int:
    threads.configure()  # before torch loads, as the full command does
    parser = argparse.ArgumentParser(prog="python -m voicepipe.bench")
    which = parser.add_subparsers(dest="bench", required=True, metavar="WHAT")
    add_engine_arguments(which.add_parser("engine", help="one LLM workload through the engine's modes"))
    args = parser.parse_args(argv)
    from voicepipe.backends.models import ModelError

    try:
        return run_engine_bench(args)
    except ModelError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
