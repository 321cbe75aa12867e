"""`voicepipe bench convoy`: the same model steps alone and beside a busy server, with the engine on a thread
of the server's process and in a process of its own; then beside a stream of Piper sentences, run between
the steps or on the engine's job lane.

A busy server is stood in for by a thread doing what a websocket/SSE server does all day: JSON of small
audio messages. Beside it, an engine on a thread waits for the interpreter lock at every torch op (the
convoy); an engine process shares only the cores. The steps are timed inside the engine (the model's own
run, as its metrics record it): a batch-1 decode, and a step carrying a 224-token prompt with 16 decodes.
"""

import asyncio
import base64
import itertools
import json
import threading
import time
from dataclasses import asdict, replace
from typing import Any

from scheduler import Engine, EngineConfig, RequestClass, SamplingParams
from scheduler.channel.client import EngineClient
from scheduler.channel.engine_process import ProcessEngine
from scheduler.channel.local import LocalEngine
from voicepipe.bench.engine_modes import percentile

PROMPT = 224
DECODES = 16
# Prompts no earlier step has seen: a prompt found in the prefix cache is not computed again.
FRESH = (list(range(start, start + PROMPT)) for start in itertools.count(100, PROMPT))
CONFIG = EngineConfig(precision="int8", shard_tokens=PROMPT, max_batch_tokens=PROMPT + DECODES, num_slabs=24)


def llm_engine(config: EngineConfig, torch_threads: int | None = None) -> tuple[Engine, dict]:
    """The embedded LLM alone, as the engine process's factory."""
    import torch

    from voicepipe.backends import threads
    from voicepipe.backends.models import load_llm

    threads.configure()
    if torch_threads is not None:
        torch.set_num_threads(torch_threads)
    model, tokenizer = load_llm()
    return Engine(model, tokenizer, config), {}


SENTENCE = "The lighthouse keeper counted every step on the way up, and listened to the waves below."


def voiced_engine(config: EngineConfig, torch_threads: int | None = None) -> tuple[Engine, dict]:
    """The embedded LLM with a `tts` job (the embedded Piper voice, sized as a served engine sizes it), as
    the engine process's factory."""
    from scheduler.jobs import JobHandler
    from voicepipe.backends.loading import job_runtime_threads
    from voicepipe.backends.tts_piper import PiperTTS

    engine, info = llm_engine(config, torch_threads)
    tts = PiperTTS(threads=job_runtime_threads(config))
    engine.handlers["tts"] = JobHandler(lambda text: sum(len(chunk) for chunk in tts.synthesize(text)))
    return engine, info


class Sentences:
    """One sentence of speech always in flight on the engine, until the block ends: what a few calls'
    replies ask of it."""

    def __init__(self, engine: EngineClient) -> None:
        self.engine, self.done = engine, 0
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> "Sentences":
        self._task = asyncio.create_task(self._speak())
        return self

    async def __aexit__(self, *_: Any) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def _speak(self) -> None:
        while True:
            await self.engine.run_job("tts", SENTENCE, cls=RequestClass.REALTIME)
            self.done += 1


class BusyServer:
    """A thread encoding and decoding small audio messages as fast as it can, until stopped."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._work, name="busy-server", daemon=True)
        self.messages = 0

    def __enter__(self) -> "BusyServer":
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _work(self) -> None:
        audio = base64.b64encode(bytes(640)).decode()  # 20 ms of 16 kHz PCM16
        while not self._stop.is_set():
            message = json.dumps({"type": "input_audio_buffer.append", "audio": audio, "event_id": "e"})
            json.loads(message)
            self.messages += 1


async def timed_steps(engine: EngineClient, rounds: int = 3, tokens: int = 16) -> dict:
    """Decode steps of one request (`tokens` of them), then `rounds` steps of a 224-token prompt beside 16
    decoding requests."""
    async def run(prompt: list[int], tokens: int) -> None:
        async for _ in engine.generate(prompt, SamplingParams(max_tokens=tokens, ignore_eos=True),
                                       RequestClass.BATCH):
            pass

    async def new_steps(seen: set[float]) -> list[dict]:  # a snapshot holds the last 50: read before they go
        return [s for s in (await engine.snapshot())["steps"] if s["t"] not in seen]

    seen = {s["t"] for s in await new_steps(set())}
    await run(list(range(10, 42)), tokens)
    steps = await new_steps(seen)
    single = [s["duration_s"] for s in steps if s["seqs"] == 1 and s["decode_tokens"] == 1]
    seen |= {s["t"] for s in steps}
    mixed: list[float] = []
    for _ in range(rounds):
        decodes = [asyncio.create_task(run([50 + n, 51, 52, 53], 4)) for n in range(DECODES)]
        await asyncio.sleep(0.3)  # they are decoding
        await run(next(FRESH), 1)
        await asyncio.gather(*decodes)
        steps = await new_steps(seen)
        seen |= {s["t"] for s in steps}
        mixed += [s["duration_s"] for s in steps if any(c["n"] == PROMPT for c in s["chunks"])]
    return {"decode_1_ms": 1000 * percentile(single, 50), "decode_1_steps": len(single),
            "prefill_224_with_16_decodes_ms": 1000 * percentile(mixed, 50), "prefill_steps": len(mixed)}


async def bench_convoy() -> dict:
    """The process first: beside the busy thread, the engine on a thread may take minutes for a few steps,
    so it gets fewer of them."""
    report: dict = {"config": asdict(CONFIG)}
    for name, threads in (("process", None), ("process_1_thread", 1)):
        process = ProcessEngine(llm_engine, CONFIG, torch_threads=threads)
        await process.start()
        try:
            await timed_steps(process)
            report[f"{name}_alone"] = await timed_steps(process)
            with BusyServer() as busy:
                report[f"{name}_busy_server"] = await timed_steps(process)
            report[f"{name}_busy_server"]["busy_messages"] = busy.messages
        finally:
            await process.stop()
    for name, job_threads in (("between_steps", 0), ("job_lane", 1)):
        process = ProcessEngine(voiced_engine, replace(CONFIG, job_threads=job_threads), torch_threads=1)
        await process.start()
        try:
            await timed_steps(process)
            async with Sentences(process) as sentences:
                started = time.perf_counter()
                report[f"sentences_{name}"] = await timed_steps(process)
            wall = time.perf_counter() - started
            report[f"sentences_{name}"].update(sentences_per_s=sentences.done / wall, steps_wall_s=wall)
        finally:
            await process.stop()
    local = LocalEngine(llm_engine(CONFIG)[0])
    local.start()
    try:
        await timed_steps(local)  # warm
        report["thread_alone"] = await timed_steps(local)
        with BusyServer() as busy:
            report["thread_busy_server"] = await timed_steps(local, rounds=1, tokens=6)
        report["thread_busy_server"]["busy_messages"] = busy.messages
    finally:
        await local.stop()
    return report


def print_convoy(report: dict) -> None:
    base = report["thread_alone"]
    print("\nmodel steps, p50 ms (ratio to the engine on a thread with nothing beside it)")
    print(f"{'engine':26}{'beside':14}{'batch-1 decode':>18}{f'{PROMPT} prompt + {DECODES} decodes':>28}")
    for key, engine, beside in (("thread_alone", "thread", "nothing"), ("thread_busy_server", "thread", "busy server"),
                                ("process_alone", "process", "nothing"),
                                ("process_busy_server", "process", "busy server"),
                                ("process_1_thread_alone", "process, torch 1 thread", "nothing"),
                                ("process_1_thread_busy_server", "process, torch 1 thread", "busy server")):
        r = report[key]
        print(f"{engine:26}{beside:14}{r['decode_1_ms']:10.1f} ({r['decode_1_ms'] / base['decode_1_ms']:4.1f}x)"
              f"{r['prefill_224_with_16_decodes_ms']:18.0f} "
              f"({r['prefill_224_with_16_decodes_ms'] / base['prefill_224_with_16_decodes_ms']:4.1f}x)")
    print("\nbeside a stream of Piper sentences (process, torch 1 thread): model steps p50 ms, the steps' run in s,"
          " sentences a second")
    for key, where in (("sentences_between_steps", "between steps"), ("sentences_job_lane", "on the job lane")):
        r = report[key]
        print(f"  jobs {where:18}{r['decode_1_ms']:10.1f}{r['prefill_224_with_16_decodes_ms']:12.0f}"
              f"{r['steps_wall_s']:10.1f}{r['sentences_per_s']:10.1f}")
