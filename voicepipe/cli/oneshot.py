"""The one-shot commands: `transcribe`, `say`, `chat` and `turn`, each on a file or a line of text."""

import argparse
import asyncio
import json
import sys
from typing import TYPE_CHECKING

from voicepipe.cli.command import UsageError
from voicepipe.cli.options import (
    add_llm_arguments,
    add_reply_arguments,
    add_runtime_arguments,
    add_tts_arguments,
    generation_params,
    load_llm_backend,
    load_runtime,
)

if TYPE_CHECKING:
    from voicepipe.local.recorded_turn import TurnResult


def add_transcribe_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="audio file (WAV of any rate and sample format)")
    parser.add_argument("--asr-model", metavar="DIR", help="CTranslate2 Whisper model directory")


def run_transcribe(args: argparse.Namespace) -> int:
    from voicepipe.audio import read_audio
    from voicepipe.backends.asr_whisper import WhisperASR

    audio = read_audio(args.file, WhisperASR.sample_rate)
    print(WhisperASR(args.asr_model).transcribe(audio))
    return 0


def add_say_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", help="what to say")
    parser.add_argument("-o", "--output", required=True, metavar="OUT.wav", help="WAV file to write")
    add_tts_arguments(parser)


def run_say(args: argparse.Namespace) -> int:
    import numpy as np

    from voicepipe.audio import write_wav
    from voicepipe.backends.tts_select import make_tts

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
    from voicepipe.pipeline.instructions import build_messages

    llm = load_llm_backend(args)

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
    add_runtime_arguments(parser)
    add_reply_arguments(parser)


def run_turn_command(args: argparse.Namespace) -> int:
    """One turn of a call, from a file: the server's pipeline on this machine's engine."""
    from voicepipe.audio import SAMPLE_RATE, read_audio, write_wav
    from voicepipe.local.recorded_turn import run_turn
    from voicepipe.pipeline import CallConfig

    read_audio(args.input, SAMPLE_RATE)  # fail on bad input before minutes of loading
    runtime = load_runtime(args)
    config = CallConfig(instructions=args.system, max_tokens=args.max_tokens, temperature=args.temperature)

    async def turn() -> "TurnResult":
        try:
            return await run_turn(runtime, args.input, config)
        finally:
            await runtime.close()

    result = asyncio.run(turn())
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
