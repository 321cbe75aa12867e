"""What a subcommand is, and the error a command raises for input it cannot work with."""

import argparse
from collections.abc import Callable
from dataclasses import dataclass


class UsageError(Exception):
    """Input the command cannot work with; reported in one line like a bad argument."""


@dataclass(frozen=True)
class Command:
    """A subcommand: its name, one line of help, and the functions that register and run it."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
