"""`voicepipe bench ipc`: what the channel to the engine process costs, against the same engine on a thread
of this process and the engine core stepped by hand. A job that echoes its arguments gives the round trip
(small, and with a second of 16 kHz audio); a generation on a random-weight model gives the cost per
token and per step. Both engines run the same model, so the differences are the drivers and the channel."""

import asyncio
import time

import numpy as np

from scheduler import EngineConfig, RequestClass, SamplingParams, Sequence
from scheduler.channel.client import EngineClient
from scheduler.channel.engine_process import ProcessEngine
from scheduler.channel.local import LocalEngine
from voicepipe.bench.engine_modes import percentile
from voicepipe.bench.random_weights import random_engine

CONFIG = EngineConfig(num_slabs=8, precision="fp32")
AUDIO = np.zeros(16000, np.float32)  # what a final ASR pass of one second sends


async def round_trips(engine: EngineClient, payload: tuple, n: int) -> dict:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        await engine.run_job("echo", *payload, cls=RequestClass.REALTIME)
        times.append(time.perf_counter() - start)
    return {"p50_us": 1e6 * percentile(times, 50), "p95_us": 1e6 * percentile(times, 95)}


async def generation(engine: EngineClient, streams: int, tokens: int) -> dict:
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)

    async def one(n: int) -> None:
        async for _ in engine.generate([3 + n, 4, 5, 6], params):
            pass

    start = time.perf_counter()
    await asyncio.gather(*(one(n) for n in range(streams)))
    return rates(time.perf_counter() - start, streams, tokens)


def core_generation(shape: str, streams: int, tokens: int) -> dict:
    engine, _ = random_engine(CONFIG, shape)
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    for n in range(streams):
        engine.add_request(Sequence([3 + n, 4, 5, 6], params))
    start = time.perf_counter()
    while engine.step():
        engine.take_outputs()
    return rates(time.perf_counter() - start, streams, tokens)


def rates(seconds: float, streams: int, tokens: int) -> dict:
    """A generation's time per token and per step (every step decodes one token of each stream)."""
    return {"seconds": seconds, "per_token_us": 1e6 * seconds / (streams * tokens),
            "per_step_us": 1e6 * seconds / tokens}


async def bench_ipc(shape: str = "tiny", streams: int = 8, tokens: int = 64, trips: int = 200) -> dict:
    report: dict = {"shape": shape, "streams": streams, "tokens": tokens, "core": core_generation(shape, streams,
                                                                                                   tokens)}
    local = LocalEngine(random_engine(CONFIG, shape)[0])
    local.start()
    process = ProcessEngine(random_engine, CONFIG, shape=shape)
    await process.start()
    try:
        for name, engine in (("thread", local), ("process", process)):
            await generation(engine, streams, 4)  # warm
            report[name] = {"echo_small": await round_trips(engine, ("x",), trips),
                            "echo_audio_1s": await round_trips(engine, (AUDIO,), trips),
                            "generation": await generation(engine, streams, tokens)}
    finally:
        await local.stop()
        await process.stop()
    core = report["core"]["per_token_us"]
    for name in ("thread", "process"):
        report[name]["generation"]["overhead_per_token_us"] = report[name]["generation"]["per_token_us"] - core
    return report


def print_ipc(report: dict) -> None:
    core = report["core"]
    print(f"\n{report['streams']} streams x {report['tokens']} tokens on the random '{report['shape']}' model")
    print(f"{'driver':10}{'echo p50/p95 (us)':>20}{'1 s audio p50/p95 (us)':>25}{'per token (us)':>16}"
          f"{'per step (us)':>15}{'overhead/token':>16}")
    print(f"{'core':10}{'':>20}{'':>25}{core['per_token_us']:16.0f}{core['per_step_us']:15.0f}{'':>16}")
    for name in ("thread", "process"):
        r = report[name]
        small, audio, gen = r["echo_small"], r["echo_audio_1s"], r["generation"]
        print(f"{name:10}{small['p50_us']:11.0f} / {small['p95_us']:<6.0f}{audio['p50_us']:14.0f} / "
              f"{audio['p95_us']:<8.0f}{gen['per_token_us']:16.0f}{gen['per_step_us']:15.0f}"
              f"{gen['overhead_per_token_us']:16.0f}")
