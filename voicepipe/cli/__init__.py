"""The `voicepipe` command line: `main` runs it (the console script and `python -m voicepipe`)."""

from voicepipe.cli.commands import build_parser, main

__all__ = ["build_parser", "main"]
