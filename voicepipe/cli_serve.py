"""`voicepipe serve`: the web page, the metrics and the calls, on one port."""

import argparse
import asyncio

from voicepipe.limits import Limits


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number (0-65535), got {value}")
    return value


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    from voicepipe.cli_models import add_runtime_arguments

    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    parser.add_argument("--port", type=_port, default=8000,
                        help="port to listen on; 0 picks a free one (default: 8000)")
    default_calls = Limits().max_calls
    parser.add_argument("--max-calls", type=_positive, default=default_calls, metavar="N",
                        help=f"calls served at once; more are refused (default: {default_calls})")
    parser.add_argument("--ttfa-deadline", type=float, metavar="S",
                        help="each turn's time-to-first-audio deadline from the end of speech (default: 1.5)")
    add_runtime_arguments(parser)


def run_serve(args: argparse.Namespace) -> int:
    """Check every model path, load the models, warm them up, then serve until interrupted."""
    from voicepipe.cli_models import load_runtime
    from voicepipe.pipeline import CallConfig
    from voicepipe.server import run_server

    runtime = load_runtime(args)
    call_config = CallConfig(ttfa_s=args.ttfa_deadline) if args.ttfa_deadline else None
    asyncio.run(run_server(runtime, args.host, args.port, Limits(max_calls=args.max_calls), call_config))
    return 0
