"""The `voicepipe` command line: `main` runs it (the console script and `python -m voicepipe`).

`main` and `build_parser` load on first use, so `python -m voicepipe.bench` can import its options from
this package without the rest of the commands.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from voicepipe.cli.commands import build_parser, main

__all__ = ["build_parser", "main"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        import importlib

        return getattr(importlib.import_module("voicepipe.cli.commands"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
