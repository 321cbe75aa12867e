"""`voicepipe bench calls`: simulated callers speak real synthesized questions, in real time, over the
real websocket, to a real server; reported per policy are time to first audio, deadline hits, underruns,
and the most calls each policy holds with at least 95% of turns on time."""

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field

import numpy as np
import websockets

from voicepipe.audio import resample, to_pcm16
from voicepipe.backends.loading import ModelOptions
from voicepipe.bench.engine_modes import percentile
from voicepipe.call.limits import Limits
from voicepipe.call.runtime import Runtime
from voicepipe.pipeline import CallConfig
from voicepipe.protocol import ServerEvent
from voicepipe.server import VoiceServer

log = logging.getLogger(__name__)
QUESTIONS = ["What is the capital of France?", "How many legs does a spider have?", "What colour is the sky?",
             "Name a fruit that is yellow.", "What do bees make?", "How many days are in a week?"]
FRAME_S = 0.02


@dataclass
class HeardTurn:
    """One turn as a simulated caller heard it."""

    ttfa_s: float | None  # from the last spoken sample sent to the first reply audio received
    deadline_met: bool | None
    underruns: int
    timings: dict = field(default_factory=dict)
    waterfall: dict = field(default_factory=dict)  # the server's stages of the first audio (`turn.waterfall`)


async def caller(url: str, questions: list[np.ndarray], turns: int, offset_s: float) -> list[HeardTurn]:
    """One caller: speaks each question in real time, then streams silence until the reply is done."""
    await asyncio.sleep(offset_s)
    silence = bytes(int(16000 * FRAME_S) * 2)
    results = []
    async with websockets.connect(url, max_size=None) as ws:
        for turn in range(turns):
            question = questions[turn % len(questions)]
            pcm = to_pcm16(question).tobytes()
            step = int(16000 * FRAME_S) * 2
            start = time.monotonic()
            for i, at in enumerate(range(0, len(pcm), step)):
                await ws.send(pcm[at:at + step])
                await asyncio.sleep(max(0.0, start + (i + 1) * FRAME_S - time.monotonic()))
            # Timed from the last sample of speech, not the end of the silence after it: the frame holding
            # it was sent on schedule, when its 20 ms were due.
            spoken_end = start + FRAME_S * (last_voiced(question) // int(16000 * FRAME_S) + 1)
            first_audio, done = None, None
            while done is None:
                await ws.send(silence)
                try:
                    message = await asyncio.wait_for(ws.recv(), FRAME_S)
                except TimeoutError:
                    continue
                if isinstance(message, bytes):
                    first_audio = first_audio or time.monotonic()
                    continue
                event = json.loads(message)
                if event["type"] == ServerEvent.RESPONSE_DONE:
                    done = event["response"]
                elif event["type"] == ServerEvent.ERROR:
                    log.warning("caller got an error: %s", event["error"]["message"])
            results.append(HeardTurn(first_audio - spoken_end if first_audio else None, done.get("deadline_met"),
                                      done.get("underruns", 0), done.get("timings", {}), done.get("waterfall", {})))
            await asyncio.sleep(1.0)  # a pause before the next question
    return results


def last_voiced(audio: np.ndarray, threshold: float = 0.01) -> int:
    """Index of the last sample louder than `threshold` (the end of the speech in a padded clip)."""
    loud = np.flatnonzero(np.abs(audio) > threshold)
    return int(loud[-1]) if loud.size else len(audio) - 1


def waterfall_figures(results: list[HeardTurn]) -> dict[str, dict[str, float]]:
    """p50 and p95 of each stage of the first audio, as the server reported them (`turn.waterfall`), in
    the order the stages come; and what the caller heard beyond them (the network and the client's own
    timing of its last word), so a reader sees every part of the wait."""
    from voicepipe.pipeline.turn import WATERFALL

    figures = {}
    for stage in WATERFALL:
        seconds = [r.waterfall[stage] for r in results if stage in r.waterfall]
        if seconds:
            figures[stage] = {"p50_s": percentile(seconds, 50), "p95_s": percentile(seconds, 95)}
    beyond = [r.ttfa_s - sum(r.waterfall.values()) for r in results if r.ttfa_s is not None and r.waterfall]
    if beyond:
        figures["caller_beyond_server"] = {"p50_s": percentile(beyond, 50), "p95_s": percentile(beyond, 95)}
    return figures


def print_waterfall(figures: dict[str, dict[str, float]], indent: str = "  ") -> None:
    print(f"{indent}waterfall, p50 / p95 ms: " + ", ".join(
        f"{stage} {f['p50_s'] * 1000:.0f} / {f['p95_s'] * 1000:.0f}" for stage, f in figures.items()))


async def run_level(runtime: Runtime, calls: int, turns: int, questions: list[np.ndarray],
                    call_config: CallConfig) -> dict:
    server = VoiceServer(runtime, Limits(max_calls=calls), call_config=call_config)
    await server.start("127.0.0.1", 0)
    try:
        url = f"ws://127.0.0.1:{server.port}/ws"
        per_call = await asyncio.gather(*(caller(url, questions[i:] + questions[:i], turns, 0.37 * i)
                                          for i in range(calls)))
    finally:
        await server.close()
    results = [r for call in per_call for r in call]
    ttfas = [r.ttfa_s for r in results if r.ttfa_s is not None]
    hits = sum(1 for r in results if r.deadline_met)
    return {"calls": calls, "turns": len(results), "ttfa_p50_s": percentile(ttfas, 50),
            "ttfa_p95_s": percentile(ttfas, 95), "ttfa_p99_s": percentile(ttfas, 99),
            "deadline_hit_rate": hits / len(results),
            "within_1_5_s": sum(1 for t in ttfas if t <= 1.5) / len(results),
            "underruns": sum(r.underruns for r in results),
            "server_first_audio_p50_s": percentile([r.timings["first_audio_s"] for r in results
                                                    if "first_audio_s" in r.timings], 50),
            "waterfall": waterfall_figures(results)}


def spoken_questions(tts) -> list[np.ndarray]:
    """The questions as 16 kHz float32 speech from the TTS voice, with a little silence on each side."""
    out = []
    for text in QUESTIONS:
        speech = np.concatenate(list(tts.synthesize(text))).astype(np.float32) / 32768.0
        speech = resample(speech, tts.sample_rate, 16000)
        pad = np.zeros(int(0.3 * 16000), np.float32)
        out.append(np.concatenate([pad, speech, pad]))
    return out


async def bench_runtime(options: ModelOptions, engine: str) -> Runtime:
    """A warm runtime for a caller bench: the engine in its own process (as `serve` runs it) or on a thread."""
    if engine == "process":
        return await Runtime.spawn(options)
    runtime = Runtime.load(options)
    return runtime


async def bench_calls(max_calls: int, turns: int, policies: list[str], deadline_s: float | None = None,
                      options: ModelOptions | None = None, engine: str = "process", from_calls: int = 1) -> dict:
    from voicepipe.backends.tts_piper import PiperTTS

    options = options or ModelOptions()
    questions = spoken_questions(PiperTTS(options.tts_model if options.tts == "piper" else None))
    call_config = CallConfig(ttfa_s=deadline_s) if deadline_s else CallConfig()
    report: dict = {"turns_per_call": turns, "ttfa_deadline_s": call_config.ttfa_s, "engine": engine, "policies": {}}
    for policy in policies:
        runtime = await bench_runtime(options.under(policy), engine)
        try:
            levels = []
            for calls in range(from_calls, max_calls + 1):  # every level, so the policies compare at each load
                levels.append(await run_level(runtime, calls, turns, questions, call_config))
                log.info("%s, %d calls: %s", policy, calls, levels[-1])
            on_time = [level["deadline_hit_rate"] >= 0.95 for level in levels]
            held = from_calls - 1 + (on_time.index(False) if False in on_time else len(levels))
        finally:
            await runtime.close()
        report["policies"][policy] = {"levels": levels, "max_calls_within_deadline": held}
    return report
