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
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    parser.add_argument("--port", type=_port, default=8000,
                        help="port to listen on; 0 picks a free one (default: 8000)")
    parser.add_argument("--policy", choices=("o4", "fcfs"), default="o4",
                        help="scheduling policy: o4 (deadline-aware, default) or fcfs (plain continuous batching)")
    default_calls = Limits().max_calls
    parser.add_argument("--max-calls", type=_positive, default=default_calls, metavar="N",
                        help=f"calls served at once; more are refused (default: {default_calls})")
    parser.add_argument("--asr-model", metavar="DIR", help="CTranslate2 Whisper model directory")
    parser.add_argument("--llm-model", metavar="PATH", help="GGUF file or transformers checkpoint directory")
    from voicepipe.cli import add_tts_arguments

    add_tts_arguments(parser)


def run_serve(args: argparse.Namespace) -> int:
    """Check every model path, load the models, warm them up, then serve until interrupted."""
    from voicepipe.models import resolve_asr, resolve_llm
    from voicepipe.pipeline import CallConfig
    from voicepipe.runtime import Runtime
    from voicepipe.server import run_server
    from voicepipe.stages.tts_select import make_tts

    resolve_llm(args.llm_model)
    resolve_asr(args.asr_model)
    tts = make_tts(args.tts, args.tts_model)  # a bad voice or model fails here, before the LLM loads
    runtime = Runtime.load(args.llm_model, args.asr_model, policy=args.policy, tts=tts)
    call_config = CallConfig(ttfa_s=args.ttfa_deadline) if args.ttfa_deadline else None
    asyncio.run(run_server(runtime, args.host, args.port, Limits(max_calls=args.max_calls), call_config))
    return 0
