"""The engine behind its two clients: the same tokens through a thread or a process, device jobs as data,
aborts that free pages (seen through the channel), faults that fail one step, and an engine process that
is killed and comes back. Tiny random-weight models: the fast lane."""

import asyncio
import os
import signal
import time
from dataclasses import asdict

import numpy as np
import pytest
import pytest_asyncio
from support import engine_factories

from scheduler import EngineConfig, RequestClass, SamplingParams, Sequence
from scheduler.channel.client import EngineUnavailable, JobFailed
from scheduler.channel.engine_process import ProcessEngine
from scheduler.channel.local import LocalEngine
from scheduler.jobs import JobHandler, make_job

CONFIG = EngineConfig(num_slabs=4, shard_tokens=16, precision="fp32")
module_loop = pytest.mark.asyncio(loop_scope="module")  # the process engine's fixture lives on it
PROMPTS = [[5, 9, 11, 40, 3, 8], [12, 13, 14], list(range(20, 60))]


def greedy(max_tokens: int = 12) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True)


async def answer(engine, prompt, params=None, **kwargs) -> tuple[list[int], str]:
    tokens, reason = [], None
    async for out in engine.generate(prompt, params or greedy(), **kwargs):
        if out.token_id is not None:
            tokens.append(out.token_id)
        reason = out.finish_reason
    return tokens, reason


def core_tokens(prompts) -> list[list[int]]:
    """What the engine core gives, stepped by hand in this thread."""
    engine, _ = engine_factories.tiny(CONFIG)
    seqs = [engine.add_request(Sequence(list(p), greedy())) for p in prompts]
    while engine.step():
        pass
    return [s.output_ids for s in seqs]


async def started() -> ProcessEngine:
    engine = ProcessEngine(engine_factories.tiny, CONFIG)
    await engine.start()
    return engine


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared_engine():
    """One engine process for the tests that leave it as they found it (a start costs seconds)."""
    engine = await started()
    yield engine
    await engine.stop()


@pytest_asyncio.fixture(loop_scope="module")
async def process_engine():
    """An engine process of the test's own, for the tests that kill it."""
    engine = await started()
    yield engine
    await engine.stop()


async def settled(engine) -> dict:
    """The engine's holdings once it has nothing left to do."""
    end = time.monotonic() + 30
    while True:
        held = await engine.holdings()
        if held["idle"] and not held["jobs"]:
            return held
        assert time.monotonic() < end, held
        await asyncio.sleep(0.02)


@module_loop
async def test_the_engine_process_is_handed_the_servers_own_configuration(shared_engine):
    assert shared_engine.info["config"] == asdict(shared_engine.config) == asdict(CONFIG)


@module_loop
async def test_a_shared_engine_gives_the_tokens_of_the_engine_in_this_thread(shared_engine):
    local = LocalEngine(engine_factories.tiny(CONFIG)[0])
    local.start()
    try:
        expected = core_tokens(PROMPTS)
        for engine in (local, shared_engine):
            answers = await asyncio.gather(*(answer(engine, p) for p in PROMPTS))
            assert [tokens for tokens, _ in answers] == expected
            assert {reason for _, reason in answers} == {"length"}
        snapshot, page = await shared_engine.snapshot(), await shared_engine.view("page")
        assert [s["t"] for s in page["steps"]] == [s["t"] for s in snapshot["steps"][-20:]]
        assert page["steps"] and not any("chunks" in s for s in page["steps"])  # the page's refresh stays small
    finally:
        await local.stop()


@module_loop
async def test_a_probe_reports_the_models_own_probability_of_a_token_through_the_channel(shared_engine):
    import torch

    model = engine_factories.tiny(CONFIG)[0].runner.model
    prompt, probe = PROMPTS[0], (17, 40)
    with torch.no_grad():
        expected = float(torch.softmax(model(torch.tensor([prompt])).logits[0, -1].float(), -1)[list(probe)].sum())
    params = SamplingParams(max_tokens=2, ignore_eos=True, probe_tokens=probe)
    outs = [out async for out in shared_engine.generate(prompt, params) if out.token_id is not None]
    assert outs[0].probe == pytest.approx(expected, rel=1e-3, abs=1e-6)
    assert outs[1].probe is not None and outs[1].probe != outs[0].probe  # a probe at each sampled position
    plain = [out async for out in shared_engine.generate(prompt, greedy(2)) if out.token_id is not None]
    assert [o.token_id for o in plain] == [o.token_id for o in outs] and plain[0].probe is None


@module_loop
async def test_leaving_a_stream_aborts_its_request_and_frees_its_pages(shared_engine):
    stream = shared_engine.generate(PROMPTS[2], greedy(10_000))
    async for out in stream:
        if out.token_id is not None:
            break
    assert (await shared_engine.holdings())["requests"] == 1
    await stream.aclose()
    held = await settled(shared_engine)
    assert held["requests"] == 0 and held["pool_error"] is None
    assert held["used_pages"] == held["cached_pages"]  # only the prefix cache keeps pages


@module_loop
async def test_a_session_keeps_its_prefix_until_released_through_the_channel(shared_engine):
    shared_engine.open_session("call-1")
    await answer(shared_engine, PROMPTS[2], greedy(4), cls=RequestClass.REALTIME, session="call-1")
    held = await settled(shared_engine)
    assert held["pinned"].get("call-1", 0) > 0
    shared_engine.release_session("call-1")
    held = await settled(shared_engine)
    assert "call-1" not in held["pinned"] and held["pool_error"] is None


@module_loop
async def test_device_jobs_cross_as_data_and_their_errors_come_back(shared_engine):
    audio = np.linspace(-1, 1, 16000, dtype=np.float32)
    echoed = await shared_engine.run_job("echo", audio, "text", 3, cls=RequestClass.REALTIME)
    assert isinstance(echoed[0], np.ndarray) and echoed[0].dtype == np.float32
    assert np.array_equal(echoed[0], audio) and echoed[1:] == ["text", 3]
    with pytest.raises(JobFailed, match="no device job named"):
        await shared_engine.run_job("missing")
    with pytest.raises(TypeError, match="cannot send"):
        await shared_engine.run_job("echo", object)  # not data: refused before it leaves
    assert not shared_engine.busy()


def test_queued_jobs_of_a_batched_kind_run_as_one_call_and_cancelled_ones_not_at_all():
    calls = []
    engine, _ = engine_factories.tiny(CONFIG)
    engine.handlers["final"] = JobHandler(lambda batch: calls.append(len(batch)) or [a * 2 for (a,) in batch],
                                          batch=3)
    jobs = [make_job("final", (n,), RequestClass.REALTIME, job_id=f"j{n}") for n in range(5)]
    for job in jobs:
        engine.submit_job(job)
    engine.cancel_job("j1")
    while engine.step():
        pass
    _, results, _ = engine.take_outputs()
    assert calls == [3, 1]
    assert {r.job_id: r.value for r in results} == {"j0": 0, "j2": 4, "j3": 6, "j4": 8}


def test_a_failing_step_fails_only_its_requests_and_the_engine_goes_on():
    engine, _ = engine_factories.faulty(CONFIG)
    bad = engine.add_request(Sequence([engine_factories.POISON, 1, 2], greedy()))
    engine.step()
    assert bad.finish_reason.startswith("error: the model step failed (RuntimeError: injected fault)")
    good = engine.add_request(Sequence(list(PROMPTS[0]), greedy()))
    while engine.step():
        pass
    assert good.output_ids == core_tokens([PROMPTS[0]])[0]
    engine.planner.check_pool()
    assert engine.metrics.step_faults._value.get() == 1


@module_loop
async def test_an_injected_fault_in_the_engine_process_fails_that_request_and_the_next_succeeds():
    engine = ProcessEngine(engine_factories.faulty, CONFIG)
    await engine.start()
    try:
        tokens, reason = await answer(engine, [engine_factories.POISON, 3, 4])
        assert tokens == [] and reason.startswith("error: the model step failed")
        tokens, reason = await answer(engine, PROMPTS[0])
        assert tokens == core_tokens([PROMPTS[0]])[0] and reason == "length"
        assert engine.alive and engine.restarts == 0
    finally:
        await engine.stop()


@module_loop
async def test_a_killed_engine_process_fails_its_requests_and_comes_back(process_engine):
    changes: list[bool] = []
    process_engine.watch(changes.append)
    process_engine.open_session("call-9")
    stream = process_engine.generate(PROMPTS[2], greedy(10_000))
    async for out in stream:
        if out.token_id is not None:
            break
    killed_at = time.monotonic()
    os.kill(process_engine.pid, signal.SIGKILL)
    last = None
    async for out in stream:
        last = out
    assert last.finished and last.finish_reason.startswith("error: the engine process stopped")
    assert time.monotonic() - killed_at < 1.0  # noticed through the process's sentinel, not a timeout
    assert changes == [False] and not process_engine.alive
    with pytest.raises(EngineUnavailable):
        await answer(process_engine, PROMPTS[0])
    end = time.monotonic() + 120
    while not process_engine.alive:
        assert time.monotonic() < end, "the engine did not come back"
        await asyncio.sleep(0.1)
    assert changes == [False, True] and process_engine.restarts == 1
    tokens, _ = await answer(process_engine, PROMPTS[0])
    assert tokens == core_tokens([PROMPTS[0]])[0]
    held = await process_engine.holdings()
    assert held["requests"] == 0 and held["live_sessions"] == ["call-9"]  # the live call's session, sent again


@module_loop
async def test_stopping_leaves_no_engine_process_behind():
    engine = ProcessEngine(engine_factories.tiny, CONFIG)
    await engine.start()
    pid = engine.pid
    await answer(engine, PROMPTS[1])
    await engine.stop()
    assert not engine.alive and engine.process.exitcode == 0
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def until_alive(engine, timeout_s: float = 120.0) -> None:
    end = time.monotonic() + timeout_s
    while not engine.alive:
        assert time.monotonic() < end, "the engine did not come back"
        await asyncio.sleep(0.05)


@pytest.mark.slow
@module_loop
async def test_realtime_work_lost_to_a_killed_engine_goes_on_once_it_is_back(process_engine):
    """A call's reply goes on from the tokens it had (the same greedy tokens, none twice), its device job
    submitted while the engine is down runs once it is back, and so does work with a deadline (a
    speculative reply's); a text request fails at once, as before."""
    await until_alive(process_engine)
    whole = core_tokens([PROMPTS[2]])[0]
    text = process_engine.generate(PROMPTS[1], greedy(10_000))
    await anext(text)
    reply = process_engine.generate(PROMPTS[2], greedy(12), cls=RequestClass.REALTIME)
    tokens = [out.token_id async for out in _until_tokens(reply, 4)]
    os.kill(process_engine.pid, signal.SIGKILL)  # at once: the reply has most of its tokens to go
    while process_engine.alive:
        await asyncio.sleep(0.01)
    last = [out async for out in text][-1]
    assert last.finish_reason.startswith("error: the engine process stopped")  # not held: its client retries
    job = asyncio.create_task(process_engine.run_job("echo", "still here", cls=RequestClass.REALTIME))
    timed = asyncio.create_task(process_engine.run_job("echo", "timed", deadline=time.monotonic() + 1))
    with pytest.raises(EngineUnavailable):
        await process_engine.run_job("echo", "optional", cls=RequestClass.INTERACTIVE)
    async for out in reply:
        if out.token_id is not None:
            tokens.append(out.token_id)
        assert not (out.finish_reason or "").startswith("error"), out
    await until_alive(process_engine)  # a reply that ended before the kill took effect does not wait for it
    assert tokens == whole  # continued where it was, on the new engine
    assert await asyncio.wait_for(job, 30) == ["still here"] and await timed == ["timed"]
    assert (await settled(process_engine))["requests"] == 0


@pytest.mark.slow
@module_loop
async def test_realtime_work_fails_after_all_when_the_engine_is_not_back_in_time(process_engine):
    await until_alive(process_engine)
    process_engine.redo_within_s = 0.05
    try:
        reply = process_engine.generate(PROMPTS[0], greedy(10_000), cls=RequestClass.REALTIME)
        await anext(reply)
        os.kill(process_engine.pid, signal.SIGKILL)
        last = [out async for out in reply][-1]
        assert last.finish_reason.startswith("error: the engine process stopped") and "not back within" in \
            last.finish_reason
    finally:
        process_engine.redo_within_s = 60.0
    await until_alive(process_engine)


async def _until_tokens(stream, n: int):
    """The first `n` tokens' outputs of a stream, leaving it open."""
    seen = 0
    async for out in stream:
        if out.token_id is not None:
            yield out
            seen += 1
            if seen == n:
                return
