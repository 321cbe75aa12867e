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
    parser.add_argument("--idle-timeout", type=float, metavar="S", default=None,
                        help="re-prompt after this many seconds of silence following a reply (default: never)")
    parser.add_argument("--idle-prompts", type=int, metavar="N", default=2,
                        help="unanswered re-prompts before a goodbye ends the call (default: 2)")
    add_runtime_arguments(parser)


def run_talk(args: argparse.Namespace) -> int:
    """Find the sound devices, load the models, then talk until interrupted (Ctrl+C) or, with an idle
    timeout, until the assistant has said goodbye to silence."""
    from voicepipe.local.devices import find_devices
    from voicepipe.pipeline import CallConfig
    from voicepipe.pipeline.detection import check_update

    config = CallConfig()
    idle = {"idle_timeout_ms": None if args.idle_timeout is None else int(args.idle_timeout * 1000),
            "idle_prompts": args.idle_prompts}
    try:
        for name, value in check_update(idle, config.turn_detection).items():
            setattr(config.turn_detection, name, value)
    except ValueError as e:
        raise SystemExit(f"voicepipe talk: {e}") from None
    devices = find_devices(args.input_device, args.output_device)  # none: fail before loading anything
    from voicepipe.local.talk import talk

    asyncio.run(talk(load_runtime(args), devices, config))
    return 0
