"""Steps sized by time: the engine's cost model, fitted online to the steps it runs, and the planner's
shares of a step in seconds, so the same rule gives a cheap device long steps and a slow one short ones."""

import random

import pytest
from test_planner import INTER, make_planner, request, run_step

from scheduler import EngineConfig, SamplingParams, Sequence
from scheduler.step_cost import TERMS, OnlineCost
from scheduler.step_shape import StepShape, Tally
from voicepipe.bench.random_weights import random_engine

# A device's price per step, per token, per sampled row, per sequence, per attention pair, per context token.
CPU_LIKE = dict(zip(TERMS, (0.0045, 0.00126, 0.0, 0.00014, 1.1e-6, 2.4e-6), strict=True))
GPU_LIKE = dict(zip(TERMS, (0.008, 0.00002, 0.0, 0.00002, 1e-9, 1e-8), strict=True))


def shape(prefill: int, decodes: int, context: int) -> StepShape:
    """A step of one prompt chunk of `prefill` tokens at the start and `decodes` rows at `context`."""
    tally = Tally()
    if prefill:
        tally.add(0, prefill, prefill + 50)
    for _ in range(decodes):
        tally.add(context, 1, context + 1)
    tokens, samples, seqs, pairs, keys = tally.tokens, tally.samples, tally.seqs, tally.pairs, tally.context
    return StepShape(tokens, seqs, samples, decodes, prefill, pairs, keys)


def priced(step: StepShape, cost: dict[str, float]) -> float:
    counts = (1, step.tokens, step.samples, step.seqs, step.attention_pairs, step.context_tokens)
    return sum(cost[t] * x for t, x in zip(TERMS, counts, strict=True))


def observed(cost: dict[str, float], steps: int = 200, seed: int = 1, noise: float = 0.02) -> OnlineCost:
    """An online model that saw `steps` steps of a mixed workload priced by `cost` (with some noise)."""
    rng, model = random.Random(seed), OnlineCost()
    for _ in range(steps):
        step = shape(rng.choice([0, 0, 16, 64, 128, 256]), rng.randint(1, 24), rng.randint(20, 800))
        model.observe(step, priced(step, cost) * (1 + rng.uniform(-noise, noise)))
    return model


def test_the_online_model_learns_the_machine_from_its_steps_and_predicts_steps_it_never_saw():
    model = observed(CPU_LIKE)
    assert model.ready and model.fitted["relative_error_p50"] < 0.03
    for step in (shape(192, 3, 400), shape(0, 40, 1500), shape(32, 0, 0)):
        tally = (step.tokens, step.samples, step.seqs, step.attention_pairs, step.context_tokens)
        assert model.predict(*tally) == pytest.approx(priced(step, CPU_LIKE), rel=0.05)


def test_the_online_model_waits_for_prompts_and_decodes_before_it_predicts():
    model = OnlineCost()
    for _ in range(300):  # decodes alone cannot tell a token's price from a step's
        step = shape(0, 8, 200)
        model.observe(step, priced(step, CPU_LIKE))
    assert not model.ready and model.predict(64, 1, 1, 2080, 64) == 0.0


def test_the_online_model_follows_the_machine_when_it_slows_down():
    model = observed(CPU_LIKE)
    before = model.predict(64, 1, 4, 2080 + 3 * 300, 64 + 3 * 300)
    slower = {term: 2 * price for term, price in CPU_LIKE.items()}  # another process took half the cores
    rng = random.Random(5)
    for _ in range(model.shapes.maxlen):
        step = shape(rng.choice([0, 0, 64, 128]), rng.randint(1, 24), rng.randint(20, 800))
        model.observe(step, priced(step, slower))
    assert model.predict(64, 1, 4, 2080 + 3 * 300, 64 + 3 * 300) == pytest.approx(2 * before, rel=0.05)


@pytest.mark.parametrize(("cost", "least", "most"), [(CPU_LIKE, 32, 64), (GPU_LIKE, 256, 256)])
def test_a_live_calls_background_share_is_what_fits_in_the_step_time_on_each_device(cost, least, most):
    planner = make_planner(max_batch_tokens=256, shard_tokens=32, live_prefill_tokens=64, live_step_s=0.1)
    planner.costs = observed(cost)
    api = request(900, INTER, arrival=0.0, first_token=1000)
    planner.add(api)
    planner.live_sessions.add("call-1")
    plan = run_step(planner, 0.0)
    assert plan.rule == "live_call" and least <= plan.num_tokens <= most
    tally = Tally()
    tally.add(0, plan.num_tokens, 900)
    assert planner.costs.predict(tally.tokens, tally.samples, tally.seqs, tally.pairs, tally.context) <= 0.1


def test_shares_go_by_tokens_until_the_model_is_fitted_and_where_time_shares_are_off():
    for planner in (make_planner(max_batch_tokens=256, shard_tokens=64, live_prefill_tokens=64),
                    make_planner(max_batch_tokens=256, shard_tokens=64, live_prefill_tokens=64, time_shares=False)):
        if not planner.config.time_shares:
            planner.costs = observed(GPU_LIKE)  # fitted, but not asked
        planner.add(request(900, INTER, arrival=0.0, first_token=1000))
        planner.live_sessions.add("call-1")
        assert run_step(planner, 0.0).num_tokens == 64


def test_where_no_step_fits_the_budget_other_work_still_gets_its_token_share():
    """A device (or a busy machine) on which even one token's step is over the budget: the step would carry
    nothing, and the engine would spin without learning otherwise."""
    planner = make_planner(max_batch_tokens=256, shard_tokens=32, live_prefill_tokens=64, live_step_s=0.1)
    planner.costs = observed({**CPU_LIKE, "const": 0.2})
    planner.add(request(900, INTER, arrival=0.0, first_token=1000))
    planner.live_sessions.add("call-1")
    assert [run_step(planner, t).num_tokens for t in (0.0, 0.1, 0.2)] == [64, 64, 64]


def test_a_fit_kept_by_one_run_sizes_the_next_runs_first_steps_by_time(tmp_path):
    """A GPU-like device's fit, kept at the path the config names: the next planner starts from it (its
    first live-call step carries what fits in the time, not the token share), and its own steps refit it."""
    kept = tmp_path / "fits" / "engine.json"
    first = observed(GPU_LIKE)
    first.kept_at, first.save_every_s = str(kept), 0.0
    first.save()
    planner = make_planner(max_batch_tokens=256, shard_tokens=32, live_prefill_tokens=64, live_step_s=0.1,
                           step_cost_file=str(kept))
    assert planner.costs.ready and planner.costs.knee == first.knee
    planner.add(request(900, INTER, arrival=0.0, first_token=1000))
    planner.live_sessions.add("call-1")
    assert run_step(planner, 0.0).num_tokens == 256  # by the token share: 64
    relearned = OnlineCost(kept_at=str(kept), save_every_s=0.0)
    slower = {term: 3 * price for term, price in GPU_LIKE.items()}
    rng = random.Random(7)
    for n in range(160):
        step = shape(rng.choice([0, 0, 64, 128]), rng.randint(1, 24), rng.randint(20, 800))
        relearned.observe(step, priced(step, slower))
        if n == 63:  # refitted on 64 steps: too few to replace a kept fit of 200
            assert OnlineCost(kept_at=str(kept)).predict(64, 1, 4, 3000, 300) == pytest.approx(
                first.predict(64, 1, 4, 3000, 300))
    # its own fit, on enough steps, replaced the kept one
    assert OnlineCost(kept_at=str(kept)).predict(64, 1, 4, 3000, 300) == pytest.approx(
        relearned.predict(64, 1, 4, 3000, 300)) == pytest.approx(3 * first.predict(64, 1, 4, 3000, 300), rel=0.05)


NAN_FIT = '{"coefficients": {"const": NaN, "tokens": 0, "samples": 0, "seqs": 0, "attention_pairs": 0, ' \
          '"context_tokens": 0}, "knee_tokens": 0}'


@pytest.mark.parametrize("content", [None, "{not json", '{"coefficients": {"const": 1}}', NAN_FIT])
def test_a_missing_or_unreadable_kept_fit_starts_afresh_and_a_start_that_fitted_nothing_keeps_nothing(
        tmp_path, content):
    kept = tmp_path / "engine.json"
    if content is not None:
        kept.write_text(content)
    costs = OnlineCost(kept_at=str(kept))
    assert not costs.ready
    costs.save()
    assert kept.read_text() == content if content is not None else not kept.exists()


def test_an_engine_keeps_its_fit_on_close_and_the_next_engine_starts_sized_by_time(tmp_path):
    kept = tmp_path / "engine-fit.json"
    config = EngineConfig(step_cost_file=str(kept), step_cost_save_s=1e9, max_batch_tokens=32, shard_tokens=16,
                          max_batch_seqs=4)
    engine, _ = random_engine(config, "tiny")
    assert not engine.planner.costs.ready
    for n in range(24):  # prompts of several chunks, and their decodes: both kinds of step, 200 and more
        engine.add_request(Sequence([5 + n] * (40 + 8 * n), SamplingParams(max_tokens=16, ignore_eos=True)))
    while engine.step():
        pass
    assert engine.planner.costs.fitted["steps"] >= engine.planner.costs.keep_steps and not kept.exists()
    engine.close()
    assert kept.exists()
    again, _ = random_engine(config, "tiny")
    assert again.planner.costs.ready and again.planner.costs.coefficients == pytest.approx(
        engine.planner.costs.coefficients)
    again.close()
