"""The step planner without a model: budgets, priorities, pacing, aging, the reserve and preemption."""

import random

import pytest

from scheduler.config import EngineConfig
from scheduler.kv_pool import SlabPool
from scheduler.planner import StepPlanner
from scheduler.policies import POLICIES, Policy, call_policies
from scheduler.request import RequestClass, SamplingParams, Sequence, Status

RT, INTER, BATCH = RequestClass.REALTIME, RequestClass.INTERACTIVE, RequestClass.BATCH


def make_planner(slabs=8, per_slab=16, **knobs) -> StepPlanner:
    config = EngineConfig(page_tokens=16, **knobs)
    return StepPlanner(config, SlabPool(slabs, per_slab, 16, config.reserve_frac))


def request(n_prompt, cls=INTER, max_tokens=8, deadline=None, arrival=0.0, first_token=1) -> Sequence:
    tokens = list(range(first_token, first_token + n_prompt))
    seq = Sequence(tokens, SamplingParams(max_tokens=max_tokens), cls, deadline)
    seq.arrival = arrival
    return seq


def run_step(planner: StepPlanner, now: float):
    """Plan a step and account for it as the engine would, with a dummy token per sampling chunk."""
    plan = planner.plan(now)
    for chunk in plan.chunks:
        planner.advance(chunk)
        if chunk.samples:
            chunk.seq.output_ids.append(7)
            if len(chunk.seq.output_ids) >= chunk.seq.params.max_tokens:
                planner.finish(chunk.seq, "length")
    planner.pool.check([s.pages for s in planner.running + planner.waiting])
    return plan


def test_budgets_are_never_exceeded_on_a_random_workload():
    rng = random.Random(3)
    planner = make_planner(max_batch_tokens=96, max_batch_seqs=5, shard_tokens=32)
    for i in range(40):
        planner.add(request(rng.randint(5, 200), rng.choice(list(RequestClass)), rng.randint(1, 30), arrival=i))
    steps = 0
    while not planner.idle:
        plan = run_step(planner, now=100.0 + steps)
        assert plan.num_tokens <= 96 and len(plan.chunks) <= 5
        left = 96
        for c in plan.chunks:  # whole shards, but for a prompt's tail or the end of the budget
            assert c.n % 32 == 0 or c.start + c.n >= c.seq.num_tokens - 1 or c.n == left  # (a token was added)
            left -= c.n
        steps += 1
        assert steps < 2000
    assert planner.pool.num_used == len(planner.pool.lru)  # only cached pages remain


def test_long_prefill_is_sharded_and_never_stalls_running_decodes():
    planner = make_planner(max_batch_tokens=64, shard_tokens=32)
    chatty = request(10, max_tokens=50)
    planner.add(chatty)
    run_step(planner, 0.0)
    planner.add(request(500, cls=INTER, arrival=1.0))
    for t in range(5):
        plan = run_step(planner, 2.0 + t)
        kinds = {c.seq is chatty: c.kind for c in plan.chunks}
        assert kinds[True] == "decode" and kinds[False] == "prefill"
        assert plan.num_tokens <= 64


def test_pressing_realtime_decode_goes_first_under_a_flood_of_batch_work():
    planner = make_planner(max_batch_tokens=128, max_batch_seqs=4, shard_tokens=64)
    call = request(20, cls=RT, max_tokens=100, deadline=1000.0)
    planner.add(call)
    run_step(planner, 0.0)
    for i in range(30):
        planner.add(request(40, cls=BATCH, max_tokens=100, arrival=0.5 + i * 0.01))
    for t in range(5):  # batch work fills the sequence budget; the call is not pressing yet
        run_step(planner, 1.0 + t * 0.01)
    call.deadline = 1.2  # its buffered audio is about to run out
    plan = planner.plan(1.1)
    assert plan.chunks[0].seq is call and plan.chunks[0].kind == "decode"


def test_batch_work_ages_upward_and_completes_under_steady_interactive_load():
    planner = make_planner(max_batch_tokens=32, max_batch_seqs=1, shard_tokens=32, aging_s=5.0)
    background = request(16, cls=BATCH, max_tokens=2, arrival=0.0)
    planner.add(background)
    now = 0.0
    for _ in range(200):
        planner.add(request(16, cls=INTER, max_tokens=2, arrival=now))
        run_step(planner, now)
        now += 1.0
        if background.status is Status.FINISHED:
            break
    assert background.status is Status.FINISHED
    assert now <= 20.0  # two class levels of aging at 5 s each, plus its own steps


def test_only_realtime_decodes_may_use_the_reserve():
    planner = make_planner(slabs=1, per_slab=25, max_batch_tokens=512, shard_tokens=512)
    reserve = planner.pool.reserve
    assert reserve == 2
    batch = request(16 * 23, cls=BATCH, max_tokens=40)  # exactly fills the non-reserved pages
    planner.config.default_output_guess = 0
    planner.add(batch)
    run_step(planner, 0.0)
    assert planner.pool.num_free == reserve
    plan = planner.plan(1.0)  # its decode needs a new page: only the reserve is left
    assert plan.chunks == [] and planner.pool.num_free == reserve

    rt_planner = make_planner(slabs=1, per_slab=25, max_batch_tokens=512, shard_tokens=512)
    rt_planner.config.default_output_guess = 0
    call = request(16 * 23, cls=RT, max_tokens=40)
    rt_planner.add(call)
    run_step(rt_planner, 0.0)
    plan = run_step(rt_planner, 1.0)
    assert plan.chunks[0].seq is call and rt_planner.pool.num_free == reserve - 1


def test_memory_pressure_preempts_lower_classes_never_a_pressing_call():
    planner = make_planner(slabs=1, per_slab=19, max_batch_tokens=512, shard_tokens=512, default_output_guess=0)
    call = request(16 * 8 - 1, cls=RT, max_tokens=60, deadline=40.0)  # outgrows the free pages and the reserve
    background = request(16 * 8 - 1, cls=BATCH, max_tokens=40, first_token=5000)
    planner.add(call)
    planner.add(background)
    run_step(planner, 0.0)
    preempted = []
    for t in range(60):
        preempted += run_step(planner, 1.0 + t).preempted
        if call.status is Status.FINISHED:
            break
    assert call.status is Status.FINISHED and call.preemptions == 0
    assert background in preempted and background.preemptions >= 1


def test_kept_session_prefixes_give_way_to_a_new_request():
    planner = make_planner(slabs=1, per_slab=20, max_batch_tokens=512, shard_tokens=512, default_output_guess=0)
    earlier = request(16 * 12, cls=RT, max_tokens=1, first_token=9000)
    earlier.session = "call-1"
    planner.add(earlier)
    run_step(planner, 0.0)
    assert earlier.status is Status.FINISHED and "call-1" in planner.pool.pins  # 12 of 20 pages kept
    newcomer = request(16 * 7, cls=BATCH, max_tokens=1)  # 7 pages: more than the 8 free less the reserve
    planner.add(newcomer)
    run_step(planner, 1.0)
    assert newcomer.status is Status.FINISHED and "call-1" not in planner.pool.pins


def test_other_prefill_is_held_to_a_small_share_while_a_realtime_deadline_approaches():
    planner = make_planner(max_batch_tokens=256, shard_tokens=64, realtime_prefill_tokens=32, pressing_window_s=1.0)
    api = request(900, INTER, arrival=0.0, first_token=1000)
    planner.add(api)
    assert run_step(planner, 0.0).num_tokens == 256  # alone, the prompt takes the whole budget
    relaxed = request(40, RT, max_tokens=5, deadline=20.0, arrival=0.1, first_token=3000)
    planner.add(relaxed)
    plan = run_step(planner, 0.1)  # 20 s of slack: a reply with audio buffered slows nobody down
    assert sum(c.n for c in plan.chunks if c.seq is api) > 32
    reply = request(40, RT, max_tokens=5, deadline=1.7, arrival=0.2)
    planner.add(reply)
    plan = run_step(planner, 0.2)  # 1.5 s of slack: within two pressing windows, not pressing yet
    assert reply in [c.seq for c in plan.chunks]
    assert sum(c.n for c in plan.chunks if c.seq is api) <= 32  # the reply's prompt goes whole, the other waits
    while reply in planner.running:
        plan = run_step(planner, 0.3)
        assert sum(c.n for c in plan.chunks if c.seq is api) <= 32
    assert sum(c.n for c in run_step(planner, 0.4).chunks if c.seq is api) > 32  # the reply is done: full steps


def test_a_prompt_aged_into_the_realtime_class_goes_first_among_the_others_within_their_share():
    planner = make_planner(max_batch_tokens=256, shard_tokens=64, realtime_prefill_tokens=32, aging_s=5.0,
                           pressing_window_s=1.0)
    old = request(600, INTER, arrival=0.0, first_token=1000)
    reply = request(40, RT, max_tokens=200, deadline=2.5, arrival=0.0)
    planner.add(old)
    planner.add(reply)
    assert sum(c.n for c in run_step(planner, 1.0).chunks if c.seq is old) <= 32
    reply.deadline = 7.5  # paced: the deadline keeps 1.5 s ahead
    young = request(600, INTER, arrival=5.5, first_token=2000)
    planner.add(young)
    plan = run_step(planner, 6.0)  # `old` has waited 6 s: it climbed a class, and goes before `young`...
    assert 0 < sum(c.n for c in plan.chunks if c.seq is old) <= 32  # ...but within the step's share
    assert not any(c.seq is young for c in plan.chunks)


def test_a_pressing_reply_gets_steps_of_its_own():
    planner = make_planner(max_batch_tokens=256, shard_tokens=64, pressing_window_s=0.6)
    api = [request(40, INTER, max_tokens=50, arrival=0.0, first_token=1000 + 100 * i) for i in range(3)]
    for seq in api:
        planner.add(seq)
    for _ in range(3):
        run_step(planner, 0.0)  # the API requests are decoding
    reply = request(20, RT, max_tokens=30, deadline=10.0, arrival=1.0)
    planner.add(reply)
    relaxed = run_step(planner, 1.0)  # its deadline is 9 s away: the others' decodes go along
    assert {c.seq.cls for c in relaxed.chunks} == {RT, INTER}
    pressing = run_step(planner, 9.6)  # 0.4 s before its deadline: alone
    assert [c.seq for c in pressing.chunks] == [reply]


def test_steps_stay_short_while_calls_are_live():
    planner = make_planner(max_batch_tokens=256, shard_tokens=64, live_prefill_tokens=64)
    api = request(900, INTER, arrival=0.0, first_token=1000)
    planner.add(api)
    assert run_step(planner, 0.0).num_tokens == 256
    planner.live_sessions.add("call-1")  # a call is open, between its turns
    assert run_step(planner, 0.1).num_tokens == 64
    planner.live_sessions.discard("call-1")
    assert run_step(planner, 0.2).num_tokens == 256


def test_while_a_caller_may_be_finishing_background_steps_stay_under_the_cap():
    planner = make_planner(slabs=16, max_batch_tokens=256, max_batch_seqs=32, expect_background_seqs=4,
                           expect_prefill_tokens=16)
    streams = [request(8, max_tokens=100, arrival=9.9 + i / 100, first_token=100 * i + 1) for i in range(12)]
    for seq in streams:
        planner.add(seq)
    now = 10.0
    while any(s.remaining_prefill > 1 for s in streams):
        run_step(planner, now)
        now += 0.05
    planner.add(request(200, arrival=now, first_token=5000))  # a long prompt arrives too
    assert len(run_step(planner, now).chunks) == 13 and planner.plan(now).rule == "open"  # nothing held back
    planner.expect("call-1", until=now + 1.0)  # the call's VAD heard its caller fall silent
    carried: set[str] = set()
    for _ in range(3):
        plan = run_step(planner, now)
        assert plan.rule == "expecting"
        assert len(plan.chunks) <= 4 and sum(c.n for c in plan.chunks if c.kind == "prefill") <= 16
        carried |= {c.seq.request_id for c in plan.chunks if c.kind == "decode"}
        now += 0.05
    assert len(carried) == 12  # the streams took turns: none stopped
    turn = request(40, RT, deadline=now + 1.4, arrival=now, first_token=9000)
    planner.add(turn)
    assert turn in [c.seq for c in run_step(planner, now).chunks]  # the caller's own work is never capped
    now += 2.0  # the hint ran out (the turn's first audio was never reported)
    turn.deadline = None
    assert planner.plan(now).rule == "open"


class ShortestFirst(Policy):
    """A toy policy: running sequences first, then the shortest prompt (o4 and fcfs take the older one)."""

    def priority(self, seq: Sequence, now: float) -> tuple:
        return (seq.status is not Status.RUNNING, seq.num_tokens)


def test_a_policy_added_to_the_registry_runs_through_the_planner(monkeypatch):
    with pytest.raises(ValueError, match="policy must be one of o4, fcfs, static"):
        make_planner(policy="shortest")
    monkeypatch.setitem(POLICIES, "shortest", ShortestFirst)  # the one registry line a new policy adds
    assert "shortest" in call_policies()
    planner = make_planner(policy="shortest", max_batch_tokens=64, max_batch_seqs=1)
    old, young = request(60, arrival=0.0), request(10, arrival=1.0, first_token=500)
    planner.add(old)
    planner.add(young)
    carried = []
    while not planner.idle:
        carried += [c.seq for c in run_step(planner, 2.0).chunks]
    assert carried == [young] * 8 + [old] * 8  # the short prompt's prefill and decodes, then the long one's
