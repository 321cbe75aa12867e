"""The engine against transformers' own generate: exact greedy tokens, whatever the batching; no leaks. On
the tiny random-weight model (the embedded model's exactness is `test_lean_runner`'s and the server tests')."""

import asyncio
import threading
import time

import pytest
import torch

from scheduler import Engine, EngineConfig, RequestClass, SamplingParams, Sequence
from scheduler.channel.client import JobFailed
from scheduler.channel.local import LocalEngine
from scheduler.jobs import JobHandler, make_job
from scheduler.request import Status
from scheduler.views import holdings
from voicepipe.backends.base import chat_prompt_ids

QUESTIONS = [
    "What is the capital of France?", "Name three colors.", "What is 2+2?", "Tell me a joke.",
    "Why is the sky blue?", "Write a haiku about rain.", "Who wrote Hamlet?", "How do I boil an egg?",
    "What is a prime number?", "Give me a tip for sleeping well.", "Translate 'hello' to Spanish.",
    "What does a cat eat?", "Summarize the water cycle.", "What is the speed of light?",
    "Describe a sunset in one sentence.", "List two planets.",
]
STORY = ("The old lighthouse keeper climbed the stairs every evening, counting each step, listening to the "
         "waves below and thinking about the ships that had passed in the night. ")
MAX_TOKENS = 20
SLAB_4_PAGES = 4 * 16 * 2 * 2 * 16 * 4  # four 16-token pages of one tiny layer's K and V (2 heads of 16, fp32)


@pytest.fixture(scope="module")
def tiny_llm():
    """The tiny random-weight model with the default model's tokenizer, so prompts are real chats: exactness
    against `generate` holds for any weights, and the engine's tests run in seconds."""
    from voicepipe.backends.models import load_tokenizer
    from voicepipe.bench.random_weights import random_llm

    tokenizer = load_tokenizer()
    model, _ = random_llm("tiny", vocab_size=len(tokenizer))
    return model, tokenizer


@pytest.fixture(scope="module")
def prompts(tiny_llm):
    _, tokenizer = tiny_llm
    out = []
    for i, q in enumerate(QUESTIONS):
        text = STORY * (i % 5) + q  # 30 to 250 tokens
        messages = [{"role": "system", "content": "Be brief."}] if i % 2 else []
        out.append(chat_prompt_ids(tokenizer, messages + [{"role": "user", "content": text}]))
    return out


@pytest.fixture(scope="module")
def reference(tiny_llm, prompts):
    model, _ = tiny_llm
    answers = []
    for ids in prompts:
        out = model.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False)
        answers.append(out[0, len(ids):].tolist())
    return answers


def run_all(engine: Engine, prompts: list[list[int]]) -> list[Sequence]:
    seqs = [engine.add_request(Sequence(p, SamplingParams(max_tokens=MAX_TOKENS))) for p in prompts]
    while engine.step():
        engine.planner.check_pool()
    return seqs


def only_cached_pages(engine: Engine) -> bool:
    """The pool's books balance and no page is referenced: only cached prefix pages stay."""
    held = holdings(engine)
    return held["pool_error"] is None and held["used_pages"] == held["cached_pages"]


def trim_eos(tokens: list[int], eos: set[int]) -> list[int]:
    return tokens[:next((i + 1 for i, t in enumerate(tokens) if t in eos), len(tokens))]


@pytest.mark.parametrize(("runner", "shard_tokens", "page_tokens"), [
    ("lean", 16, 16), ("lean", 16, 32), ("lean", 64, 16), ("lean", 64, 32), ("transformers", 16, 32)])
def test_greedy_tokens_match_transformers_generate(tiny_llm, prompts, reference, runner, shard_tokens, page_tokens):
    engine = Engine(*tiny_llm, EngineConfig(runner=runner, shard_tokens=shard_tokens, page_tokens=page_tokens,
                                       num_slabs=4, max_batch_tokens=128, max_batch_seqs=16))
    seqs = run_all(engine, prompts)
    for seq, ref in zip(seqs, reference, strict=True):
        assert seq.output_ids == trim_eos(ref, engine.eos_ids)
    assert only_cached_pages(engine)


@pytest.mark.parametrize("runner", ["lean", "transformers"])
def test_greedy_tokens_match_with_compaction_during_the_run(tiny_llm, prompts, reference, runner):
    engine = Engine(*tiny_llm, EngineConfig(runner=runner, slab_bytes=SLAB_4_PAGES, num_slabs=80, compact_threshold=0.0,
                                       max_batch_tokens=160, max_batch_seqs=6))
    seqs = run_all(engine, prompts)
    assert engine.metrics.compactions._value.get() > 0
    for seq, ref in zip(seqs, reference, strict=True):
        assert seq.output_ids == trim_eos(ref, engine.eos_ids)


@pytest.mark.parametrize("runner", ["lean", "transformers"])
def test_greedy_tokens_match_with_preemption_in_a_tiny_pool(tiny_llm, prompts, reference, runner):
    engine = Engine(*tiny_llm, EngineConfig(runner=runner, slab_bytes=SLAB_4_PAGES, num_slabs=7, default_output_guess=1,
                                       max_batch_tokens=256, max_batch_seqs=16))
    seqs = run_all(engine, prompts)
    assert sum(s.preemptions for s in seqs) > 0
    for seq, ref in zip(seqs, reference, strict=True):
        assert seq.output_ids == trim_eos(ref, engine.eos_ids)


def test_fcfs_and_static_policies_give_the_same_tokens(tiny_llm, prompts, reference):
    for policy in ("fcfs", "static"):
        engine = Engine(*tiny_llm, EngineConfig(policy=policy, num_slabs=4, static_batch_size=8))
        seqs = run_all(engine, prompts[:8])
        for seq, ref in zip(seqs, reference, strict=False):
            assert seq.output_ids[:len(trim_eos(ref, engine.eos_ids))] == trim_eos(ref, engine.eos_ids)
        assert only_cached_pages(engine)


def test_aborting_mid_prefill_and_mid_decode_frees_every_page(tiny_llm, prompts):
    engine = Engine(*tiny_llm, EngineConfig(shard_tokens=16, max_batch_tokens=16, num_slabs=4))
    long, short = engine.add_request(Sequence(prompts[4], SamplingParams(max_tokens=50))), None
    engine.step()  # one shard of the long prompt is in
    assert 0 < long.num_cached < len(long.prompt_ids)
    engine.abort(long.request_id)
    short = engine.add_request(Sequence(prompts[1], SamplingParams(max_tokens=50, ignore_eos=True)))
    while len(short.output_ids) < 3:
        engine.step()
    engine.abort(short.request_id)
    assert not engine.step()
    assert only_cached_pages(engine)


def test_a_session_keeps_its_conversation_prefix_for_the_next_turn(tiny_llm):
    model, tokenizer = tiny_llm
    engine = Engine(model, tokenizer, EngineConfig(num_slabs=4))
    turn1 = [{"role": "user", "content": STORY + "What did the keeper count?"}]
    first = engine.add_request(Sequence(chat_prompt_ids(tokenizer, turn1), SamplingParams(max_tokens=12),
                                        RequestClass.REALTIME, session="call-1"))
    while engine.step():
        pass
    pinned = engine.pool.pins["call-1"][0]
    assert pinned and all(engine.pool.refs[p] == 1 for p in pinned)
    turn2 = turn1 + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "Why?"}]
    second = engine.add_request(Sequence(chat_prompt_ids(tokenizer, turn2), SamplingParams(max_tokens=4),
                                         RequestClass.REALTIME, session="call-1"))
    engine.step()
    assert second.pages[:len(pinned) - 1] == pinned[:len(pinned) - 1]  # reused, not recomputed
    while engine.step():
        pass
    engine.release_session("call-1")
    engine.planner.check_pool()
    assert "call-1" not in engine.pool.pins and all(r == 0 for r in engine.pool.refs)


def test_a_promoted_request_takes_its_new_class_deadline_and_session(tiny_llm):
    model, tokenizer = tiny_llm
    engine = Engine(model, tokenizer, EngineConfig(num_slabs=4))
    prompt = chat_prompt_ids(tokenizer, [{"role": "user", "content": STORY + "What did the keeper count?"}])
    seq = engine.add_request(Sequence(prompt, SamplingParams(max_tokens=6), RequestClass.INTERACTIVE))
    engine.step()
    engine.promote(seq.request_id, RequestClass.REALTIME, 123.0, "call-2")
    assert (seq.cls, seq.deadline, seq.session) == (RequestClass.REALTIME, 123.0, "call-2")
    while engine.step():
        pass
    assert holdings(engine)["pinned"]["call-2"]  # ended as the session's request: its prefix is kept
    engine.release_session("call-2")
    engine.planner.check_pool()


async def test_async_generate_streams_text_and_jobs_run_by_priority(tiny_llm, prompts):
    order: list[str] = []
    jobs = {"note": JobHandler(lambda what: order.append(what) or len(order)), "fail": JobHandler(lambda: 1 / 0)}
    engine = LocalEngine(Engine(*tiny_llm, EngineConfig(num_slabs=4), jobs))
    engine.start()
    try:
        slow = [engine.run_job("note", "batch", cls=RequestClass.BATCH) for _ in range(2)]
        urgent = engine.run_job("note", "realtime", cls=RequestClass.REALTIME, deadline=time.monotonic())
        pieces = [out async for out in engine.generate(prompts[0], SamplingParams(max_tokens=12))]
        results = await asyncio.gather(*slow, urgent)
        assert sorted(results) == [1, 2, 3] and order.count("batch") == 2
        assert pieces[-1].finished and "".join(p.text for p in pieces).strip()
        with pytest.raises(JobFailed, match="ZeroDivisionError"):
            await engine.run_job("fail")
        stream = engine.generate(prompts[1], SamplingParams(max_tokens=200, ignore_eos=True))
        async for _ in stream:
            break
        await stream.aclose()  # leaving early aborts the request
        held = await engine.holdings()  # read after the abort: the engine takes commands in order
        assert held["requests"] == 0 and held["pool_error"] is None
    finally:
        await engine.stop()


@pytest.mark.parametrize("job_threads", [1, 0])
def test_a_job_on_the_lane_runs_beside_model_steps_and_an_inline_one_between_them(tiny_llm, prompts, job_threads):
    """On a lane (job_threads >= 1) a request decodes to its end while a job is still running; between steps
    (0), the job holds the engine's thread: it ended before the request took a step."""
    released = threading.Event()
    engine: Engine

    def hold() -> int:
        released.wait(10 if job_threads else 0.5)
        return engine.metrics.steps_run

    engine = Engine(*tiny_llm, EngineConfig(num_slabs=4, job_threads=job_threads), {"hold": JobHandler(hold)})
    try:
        engine.submit_job(make_job("hold", ()))
        seq = engine.add_request(Sequence(prompts[0], SamplingParams(max_tokens=8, ignore_eos=True)))
        while seq.status is not Status.FINISHED and engine.step():
            pass
        _, before, _ = engine.take_outputs()
        released.set()
        while engine.step():
            pass
        _, after, _ = engine.take_outputs()
        assert len(seq.output_ids) == 8
        if job_threads:
            assert before == [] and [(r.error, r.value) for r in after] == [(None, 8)]  # still running at the end
        else:
            assert [(r.error, r.value) for r in before] == [(None, 0)] and after == []
    finally:
        engine.close()


def test_knobs_are_validated_and_applied(tiny_llm):
    engine = Engine(*tiny_llm, EngineConfig(num_slabs=1))
    engine.update_config(max_batch_tokens=64, max_batch_seqs=3)
    assert (engine.config.max_batch_tokens, engine.config.max_batch_seqs) == (64, 3)
    for bad in ({"max_batch_tokens": 0}, {"max_batch_seqs": "8"}, {"shard_tokens": 8}, {"max_batch_seqs": True}):
        with pytest.raises(ValueError):
            engine.update_config(**bad)
    assert (engine.config.max_batch_tokens, engine.config.max_batch_seqs) == (64, 3)


def test_a_seeded_request_computes_its_whole_prompt_and_an_unseeded_one_takes_the_cached_pages(tiny_llm):
    """A seed promises the same answer every time; cached pages were computed in other steps, whose
    rounding changed a sampled token of the default model at int4 (the second of four seeded requests)."""
    model, tokenizer = tiny_llm
    engine = Engine(model, tokenizer, EngineConfig(num_slabs=4))
    prompt = chat_prompt_ids(tokenizer, [{"role": "user", "content": STORY + "What did the keeper count?"}])
    answers, cached, admit = [], [], engine.planner.admit

    def admitted(seq: Sequence) -> bool:
        ok = admit(seq)
        cached.append(seq.num_cached)  # the tokens its prompt took over from the cache
        return ok

    engine.planner.admit = admitted
    for params in (SamplingParams(max_tokens=8, temperature=1.0, seed=3),) * 2 + (SamplingParams(max_tokens=8),):
        seq = engine.add_request(Sequence(prompt, params))
        while engine.step():
            pass
        answers.append(seq.output_ids)
    assert cached[0] == cached[1] == 0 and cached[2] > 0  # the prompt's pages were there for all but the first
    assert answers[0] == answers[1]
    engine.planner.check_pool()


def test_a_job_below_the_realtime_tier_ages_as_requests_do_and_old_requests_cannot_starve_it(tiny_llm, prompts):
    """Requests that have waited long enough climb into the top class; a queued job climbs too, so one
    waiting behind them runs once it has waited as long (it never did: a speculative reply's synthesis then
    waited for as long as a text API kept old requests in the engine)."""
    now = [100.0]
    ran: list[float] = []
    engine = Engine(*tiny_llm, EngineConfig(num_slabs=4, aging_s=5.0), {"note": JobHandler(lambda: ran.append(now[0]))},
                    clock=lambda: now[0])
    try:
        seq = engine.add_request(Sequence(prompts[0], SamplingParams(max_tokens=60, ignore_eos=True)))
        seq.arrival = now[0] - 60.0  # an old request: its class has climbed to the top
        engine.submit_job(make_job("note", (), RequestClass.INTERACTIVE))
        for _ in range(8):  # 4 s: the old request's steps go first
            engine.step()
            now[0] += 0.5
        assert ran == [] and seq.status is Status.RUNNING
        for _ in range(6):
            engine.step()
            now[0] += 0.5
        assert len(ran) == 1 and 105.0 <= ran[0] <= 105.5 and seq.status is Status.RUNNING
    finally:
        engine.close()
