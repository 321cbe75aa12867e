"""`voicepipe talk`: a spoken conversation through this machine's microphone and speakers."""

import argparse
import asyncio

from voicepipe.cli.options import add_runtime_arguments, load_runtime


def _device(text: str) -> int | str:
    """A device number, or part of a device's name (as `python -m sounddevice` lists them)."""
    return int(text) if text.isdigit() else text


def add_talk_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input-device", type=_device, metavar="DEVICE",
                        help="microphone: a number or part of a name that `python -m sounddevice` lists "
                             "(default: the system's)")
    parser.add_argument("--output-device", type=_device, metavar="DEVICE",
                        help="speakers or headphones, named the same way (default: the system's)")
    add_runtime_arguments(parser)


def run_talk(args: argparse.Namespace) -> int:
    """Find the sound devices, load the models, then talk until interrupted (Ctrl+C)."""
    from voicepipe.local.talk import find_devices, talk

    devices = find_devices(args.input_device, args.output_device)  # none: fail before loading anything
    asyncio.run(talk(load_runtime(args), devices))
    return 0
