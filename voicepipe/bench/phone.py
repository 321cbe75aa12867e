"""Phone calls against websocket calls, with the real models: the same spoken question asked by a real SIP
phone (baresip, playing it as a WAV) and by a scripted caller on `/ws`, `calls` at a time, and the first
audio after the caller's last word of each.

On the websocket the times are the caller's: from when its last sample went out to when the first reply
frame came in. On the phone they are read off baresip's own recordings of what it sent and what it heard
(both start with the call's audio): from the end of the question in the one to the first reply audio in
the other, so they include the RTP packets' 20 ms and baresip's jitter buffer, as a caller's ear does."""

import asyncio
import os
import statistics
import tempfile
from pathlib import Path

import numpy as np
import soundfile

from voicepipe.bench.baresip import Baresip
from voicepipe.bench.engine_modes import percentile
from voicepipe.bench.scripted_caller import AUDIO, RATE, ScriptedCaller
from voicepipe.bench.turn_set import say_with
from voicepipe.call.runtime import Runtime

QUESTIONS = ("What is the capital of France?", "How many days are there in a week?",
             "What colour is the sky on a clear day?", "Name a fruit that is yellow.")
LEAD_S = 0.5  # silence before each question
LOUD = 200  # mean |sample| of a 20 ms window that holds speech, at 8 kHz


async def ask_on_ws(url: str, question: np.ndarray, limit_s: float = 30.0) -> float | None:
    caller = await ScriptedCaller.call(url, {"type": "server_vad"})
    try:
        caller.say(np.zeros(int(LEAD_S * RATE), np.float32))
        _, end = caller.say(question)
        await caller.until(lambda: caller.first(AUDIO, end) is not None, limit_s)
    finally:
        await caller.close()
    first = caller.first(AUDIO, end)
    return None if first is None else first - end


async def ask_on_phone(uri: str, question: np.ndarray, folder: Path, limit_s: float = 30.0) -> float | None:
    handle, name = tempfile.mkstemp(".wav", "question-", folder)  # one file per call, calls running at once
    os.close(handle)
    wav = Path(name)
    soundfile.write(wav, np.concatenate([np.zeros(int(LEAD_S * RATE), np.float32), question]), RATE)
    async with Baresip(wav) as phone:
        await phone.dial(uri)
        await phone.wait_event("CALL_ESTABLISHED", 10)
        end_s = LEAD_S + len(question) / RATE
        heard = None
        for _ in range(int(limit_s / 0.25)):
            await asyncio.sleep(0.25)
            heard = first_speech(phone.recordings()[0], end_s)
            if heard is not None:
                break
        await phone.hangup()
    return None if heard is None else heard - end_s


def first_speech(path: Path, after_s: float) -> float | None:
    """When speech first comes in a recording after `after_s` (None: not yet)."""
    audio, rate = soundfile.read(path, dtype="int16")
    window = rate // 50
    start = int(after_s * rate)
    for i in range(start, len(audio) - window, window):
        if np.abs(audio[i:i + window].astype(np.int32)).mean() > LOUD:
            return i / rate
    return None


async def bench_phone(runtime: Runtime, tts, tries: int, calls: int) -> dict:
    """`tries` rounds of `calls` questions at once, on each line."""
    from voicepipe.call.limits import Limits
    from voicepipe.server import VoiceServer
    from voicepipe.sip.agent import SipSettings

    questions = [say_with(tts, text) for text in QUESTIONS]
    server = VoiceServer(runtime, Limits(max_calls=max(4, calls)), sip=SipSettings(port=0))
    await server.start("127.0.0.1", 0)
    url = f"ws://127.0.0.1:{server.port}/ws"
    uri = f"sip:voicepipe@127.0.0.1:{server.sip.agent.address[1]}"
    runs: dict[str, list[float | None]] = {"ws": [], "sip": []}
    try:
        with tempfile.TemporaryDirectory() as folder:
            await ask_on_ws(url, questions[0])  # warm: the prefix caches
            await ask_on_phone(uri, questions[0], Path(folder))
            for n in range(tries):
                picked = [questions[(n + k) % len(questions)] for k in range(calls)]
                runs["ws"] += await asyncio.gather(*(ask_on_ws(url, q) for q in picked))
                runs["sip"] += await asyncio.gather(*(ask_on_phone(uri, q, Path(folder)) for q in picked))
    finally:
        await server.close()
    return {"tries": tries, "calls": calls, "runs": runs, "summary": summarize(runs)}


def summarize(runs: dict[str, list[float | None]]) -> dict:
    summary = {}
    for line, times in runs.items():
        found = [t for t in times if t is not None]
        summary[line] = {"answered": f"{len(found)}/{len(times)}",
                         "first_audio_s_p50": round(statistics.median(found), 3) if found else None,
                         "first_audio_s_p95": round(percentile(found, 95), 3) if found else None}
    ws, sip = summary["ws"]["first_audio_s_p50"], summary["sip"]["first_audio_s_p50"]
    summary["sip_minus_ws_s_p50"] = round(sip - ws, 3) if ws is not None and sip is not None else None
    return summary


def print_phone(report: dict) -> None:
    s = report["summary"]
    for line in ("ws", "sip"):
        print(f"{line:>3}: {report['calls']} at a time, answered {s[line]['answered']}, first audio after the last "
              f"word {s[line]['first_audio_s_p50']} s p50, {s[line]['first_audio_s_p95']} s p95")
    print(f"the phone line's first audio less the websocket's: {s['sip_minus_ws_s_p50']} s p50")
