"""The engine's model steps as a benchmark sees them: gathered from its snapshots while a load runs, and
summed up so that a step under load compares with the same step on a quiet engine (the interpreter-lock
convoy shows as the same decode step taking many times as long)."""

import asyncio
import contextlib

from scheduler import RequestClass, SamplingParams
from voicepipe.bench.engine_modes import percentile
from voicepipe.call.runtime import Runtime

POLL_S = 0.25  # a snapshot holds the last 50 steps; no step is this short times 50


class StepLog:
    """Every step the engine reports from now on, polled from its snapshots by a task of its own."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime, self.steps, self.since = runtime, {}, 0.0
        self._task = asyncio.ensure_future(self._poll())

    async def _poll(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # an engine restarting: the steps it lost are lost
                for step in (await self.runtime.engine.snapshot())["steps"]:
                    if step["t"] > self.since:
                        self.steps[step["t"]] = step
            await asyncio.sleep(POLL_S)

    def take(self) -> list[dict]:
        """The steps since the last take."""
        steps = sorted(self.steps.values(), key=lambda s: s["t"])
        self.since = max([self.since, *(s["t"] for s in steps)])
        self.steps = {}
        return steps

    def close(self) -> None:
        self._task.cancel()


def step_figures(steps: list[dict], streams: int) -> dict:
    """Step time p50/p95, and the p50 of the steps shaped like the API load's decodes (only decodes, with
    `streams` sequences give or take the calls' two): the one kind of step every window has."""
    decodes = [s["duration_s"] for s in steps if not s["prefill_tokens"] and abs(s["seqs"] - streams) <= 2]
    times = [s["duration_s"] for s in steps]
    return {"steps": len(steps), "p50_ms": 1000 * percentile(times, 50), "p95_ms": 1000 * percentile(times, 95),
            "api_decode_steps": len(decodes), "api_decode_p50_ms": 1000 * percentile(decodes, 50)}


async def quiet_steps(runtime: Runtime, prompts: list[list[int]], tokens: int) -> dict:
    """The same decode steps on an engine with no server work beside it: the API load's prompts straight to
    the engine, all at once, to the API's length."""
    steps = StepLog(runtime)
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)

    async def one(prompt: list[int]) -> None:
        async for _ in runtime.engine.generate(prompt, params, RequestClass.BATCH):
            pass

    await asyncio.gather(*(one(p) for p in prompts))
    await asyncio.sleep(2 * POLL_S)
    steps.close()
    return step_figures(steps.take(), len(prompts))
