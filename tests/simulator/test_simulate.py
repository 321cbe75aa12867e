"""The simulator: the engine's own planner and pool in virtual time, its cost models, its traffic and its
command. Fast tests only here; tests/simulator/test_simulate_validation.py measures the real engine."""

import json
import math
import random
from pathlib import Path

import pytest

from scheduler import EngineConfig, RequestClass
from scheduler.engine import Engine
from scheduler.jobs import make_job
from scheduler.model.runner import ModelRunner
from scheduler.policies import O4, POLICIES
from scheduler.request import SamplingParams, Sequence
from scheduler.sim import (
    DEVICES,
    DTYPES,
    Driver,
    Efficiency,
    FittedCost,
    ModelShape,
    PricedRunner,
    Roofline,
    StepShape,
    VirtualClock,
    WallClock,
    virtual_engine,
)
from scheduler.step_plan import Chunk, StepPlan
from voicepipe.backends.loading import TTS_SENTENCE
from voicepipe.bench.random_weights import random_llm
from voicepipe.bench.shapes import SHAPES, IdTokenizer
from voicepipe.simulate.calls import CallLoad, priced_jobs
from voicepipe.simulate.costs import JobPrices, priced
from voicepipe.simulate.public import compare
from voicepipe.simulate.run import Scenario, simulate
from voicepipe.simulate.text import TextLoad, prompt_ids, submit_text

A100, H100 = DEVICES["a100-80g"], DEVICES["h100"]
THIRTEEN_B = ModelShape.from_config("llama-2-13b", SHAPES["13b"])
TINY = ModelShape.from_config("tiny", SHAPES["tiny"])


class Constant:
    """A cost model: every step takes the same time."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def step_seconds(self, step: StepShape) -> float:
        return self.seconds


# -- the roofline ----------------------------------------------------------------------------------------------
def test_13b_shape_is_counted_by_hand():
    # per layer: q, k, v, o of 5120 x 5120 and the MLP's three 5120 x 13824
    assert THIRTEEN_B.layer_params == 4 * 5120 * 5120 + 3 * 5120 * 13824 == 317_194_240
    assert THIRTEEN_B.linear_params == 12_687_769_600
    assert THIRTEEN_B.params == 12_687_769_600 + 2 * 32000 * 5120  # untied: embedding and head
    assert THIRTEEN_B.kv_bytes_per_token(2) == 2 * 40 * 40 * 128 * 2 == 819_200


def test_roofline_of_a_decode_step_matches_a_hand_computation():
    roofline = Roofline(THIRTEEN_B, A100, DTYPES["fp16"], Efficiency(mfu=0.68, mbu=0.70, overhead_s=0.001))
    step = StepShape(tokens=1, seqs=1, samples=1, decodes=1, prefill_tokens=0, attention_pairs=128,
                     context_tokens=128)  # one decode at position 127
    weights = 2 * (12_687_769_600 + 32000 * 5120)  # fp16 matrices and the head, read once
    kv = (128 + 1) * 819_200  # the context read, the new token written
    memory_s = (weights + kv) / (0.70 * 2.039e12)
    compute_s = (2 * 12_687_769_600 + 2 * 32000 * 5120) / (0.68 * 312e12) + 4 * 40 * 40 * 128 * 128 / (0.68 * 312e12)
    parts = roofline.parts(step)
    assert parts["memory_s"] == pytest.approx(memory_s, rel=1e-12)
    assert parts["compute_s"] == pytest.approx(compute_s, rel=1e-12)
    assert parts["seconds"] == pytest.approx(0.001 + memory_s, rel=1e-12) == pytest.approx(0.019082, abs=1e-6)


def test_roofline_of_a_prefill_is_compute_bound_and_int8_halves_it():
    prefill = StepShape(2048, 1, 1, 0, 2048, 2048 * 2049 // 2, 2048)
    fp16 = Roofline(THIRTEEN_B, A100, DTYPES["fp16"]).parts(prefill)
    assert fp16["compute_s"] > fp16["memory_s"]
    linear = 2 * 2048 * 12_687_769_600 + 2 * 32000 * 5120
    attention = 4 * 40 * 40 * 128 * (2048 * 2049 // 2)
    assert fp16["compute_s"] == pytest.approx((linear + attention) / (0.68 * 312e12), rel=1e-12)
    int8 = Roofline(THIRTEEN_B, A100, DTYPES["int8"]).parts(prefill)
    assert int8["compute_s"] == pytest.approx(linear / (0.68 * 624e12) + attention / (0.68 * 312e12), rel=1e-12)
    w8a16 = Roofline(THIRTEEN_B, A100, DTYPES["w8a16"]).parts(prefill)  # int8 bytes, FP16 products
    assert w8a16["compute_s"] == pytest.approx(fp16["compute_s"]) and w8a16["weight_bytes"] == fp16["weight_bytes"] / 2


def test_roofline_is_within_25_percent_of_lmdeploys_published_13b_steps():
    rows = compare()
    assert len(rows) == 14
    for row in rows:
        assert abs(row["decode_error"]) < 0.25 and abs(row["ftl_error"]) < 0.25, row
    # and the band brackets the decode steps: the slow end above every one, the fast end below most
    assert all(r["decode_error"] > 0 for r in compare(Efficiency.band()["low"]))
    assert sum(r["decode_error"] < 0.05 for r in compare(Efficiency.band()["high"])) >= 10


def test_kv_capacity_leaves_room_for_weights_and_workspace():
    roofline = Roofline(THIRTEEN_B, A100, DTYPES["int8"])
    assert roofline.kv_capacity_bytes() == pytest.approx(0.9 * 80e9 - 13_015_449_600 - 2e9)


# -- the step's shape and the fitted model --------------------------------------------------------------------
def _seq(prompt: int, outputs: int = 0) -> Sequence:
    seq = Sequence(list(range(3, 3 + prompt)), SamplingParams(max_tokens=10))
    seq.output_ids = [5] * outputs
    return seq


def test_step_shape_counts_a_plan_by_hand():
    decoding, prompt = _seq(30, outputs=2), _seq(100)
    plan = StepPlan([Chunk(decoding, 31, 1), Chunk(prompt, 64, 36)])
    shape = StepShape.of(plan)
    assert (shape.tokens, shape.seqs, shape.samples, shape.decodes, shape.prefill_tokens) == (37, 2, 2, 1, 36)
    assert shape.attention_pairs == 32 + (36 * 64 + 36 * 37 // 2)
    assert shape.context_tokens == 32 + 100


def test_fit_recovers_known_costs_despite_outliers():
    rng = random.Random(1)
    truth = {"const": 0.02, "tokens": 0.004, "samples": 0.001, "seqs": 0.0005, "attention_pairs": 2e-7,
             "context_tokens": 0.0}
    steps = []
    for _ in range(300):  # some decodes, and maybe a prompt's shard
        contexts = [rng.randint(10, 400) for _ in range(rng.randint(0, 8))]
        shard, start = rng.choice([0, 16, 64, 128, 256]), rng.choice([0, 64, 128])
        if not contexts and not shard:
            shard = 32
        plan = StepPlan([Chunk(_seq(c, outputs=1), c, 1) for c in contexts]
                        + ([Chunk(_seq(start + shard + rng.choice([0, 40])), start, shard)] if shard else []))
        steps.append(StepShape.of(plan))
    seconds = [FittedCost(truth).step_seconds(s) * rng.uniform(0.97, 1.03) for s in steps]
    for i in range(0, 300, 25):
        seconds[i] *= 5  # another process took the cores
    fit = FittedCost.fit(steps, seconds)
    c = fit.coefficients
    assert c["const"] == pytest.approx(0.02, rel=0.1) and c["tokens"] == pytest.approx(0.004, rel=0.05)
    assert c["samples"] + c["seqs"] == pytest.approx(0.0015, rel=0.15)  # a sampled row is nearly always a sequence
    for step in steps[1:60:7]:
        assert fit.step_seconds(step) == pytest.approx(FittedCost(truth).step_seconds(step), rel=0.03)
    assert min(fit.coefficients.values()) >= 0
    assert fit.about["outliers_left_out"] >= 12
    assert abs(fit.about["total_time_error"]) < 0.02


# -- the engine core on a virtual clock ------------------------------------------------------------------------
def test_priced_runner_sizes_the_pool_as_the_real_runner_does():
    model, _ = random_llm("tiny")
    for fields in ({"num_slabs": 5}, {"kv_bytes": 3 << 20, "slab_bytes": 1 << 16}):
        config = EngineConfig(**fields)
        real = ModelRunner(model, config)
        fake = PricedRunner(TINY, config, Constant(0.01), VirtualClock(), kv_itemsize=4)
        assert (fake.num_slabs, fake.pages_per_slab) == (real.num_slabs, real.pages_per_slab), fields


def _plans(engine: Engine, clock, items) -> list[list[tuple]]:
    driver = Driver(engine, clock)
    submit_text(driver, items)
    driver.run()
    engine.planner.check_pool()
    return [[(c["id"], c["kind"], c["start"], c["n"]) for c in step["chunks"]] for step in engine.metrics.recent_steps]


@pytest.mark.parametrize("policy", ["o4", "fcfs", "static"])
def test_simulated_steps_are_the_real_engines_plans_step_for_step(policy):
    config = dict(policy=policy, max_batch_tokens=48, max_batch_seqs=3, shard_tokens=16, num_slabs=2,
                  static_batch_size=3, default_output_guess=4)
    items = TextLoad("all_at_once", requests=7, prompt_tokens=(5, 70), output_tokens=(2, 9), seed=3).items(512)
    model, tokenizer = random_llm("tiny")
    real = _plans(Engine(model, tokenizer, EngineConfig(**config)), WallClock(), items)
    clock = VirtualClock()
    simulated = _plans(virtual_engine(TINY, EngineConfig(**config), Constant(0.01), IdTokenizer(512), kv_itemsize=4,
                                      clock=clock), clock, items)
    assert 10 < len(real) < 200  # the step log holds all of them
    assert simulated == real
    resumed = any(kind == "prefill" and start > 0 for step in real for _, kind, start, n in step)
    assert resumed == (policy != "static")  # prompts went in shard by shard (static takes them whole)
    assert clock.now() == pytest.approx(0.01 * len(real))


def _seed_run(policy: str = "o4", rate: float = 3.0, **changes) -> dict:
    load = TextLoad(rate=rate, duration_s=20.0, prompt_tokens=(128, 2048), output_tokens=(16, 256), seed=1)
    scenario = Scenario(policy, {"max_batch_tokens": 4096, "max_batch_seqs": 256}, load,
                        engine={"static_batch_size": 32}, **changes)
    return simulate(scenario, priced("a100-80g", "llama-2-13b", "int8"))


def test_a_small_seed_simulation_keeps_up_with_its_arrivals():
    report = _seed_run()
    text = report["text"]
    assert report["saturated"] is None and text["finished"] == text["requests"] > 40
    assert text["requests_per_s"] == pytest.approx(text["requests"] / report["duration_s"])
    assert 0.01 < text["tpot_p50_s"] < 0.1 and text["ttft_p50_s"] < 1.0  # a 13B on an A100 below saturation
    assert report["steps"]["steps"] > 500 and report["steps"]["prefill_tokens_per_step"] > 0


def test_a_planner_rule_changed_changes_the_simulation(monkeypatch):
    before = _seed_run()
    original = O4.chunk_size

    def one_shard(self, seq, tokens_left):  # a prompt takes at most one shard a step
        return min(original(self, seq, tokens_left), self.planner.config.shard_tokens)

    monkeypatch.setattr(O4, "chunk_size", one_shard)
    after = _seed_run()
    assert after["steps"]["prefill_tokens_per_step"] < before["steps"]["prefill_tokens_per_step"]
    assert after["text"]["ttft_p50_s"] > 2 * before["text"]["ttft_p50_s"]


def test_past_saturation_the_run_stops_and_says_so():
    report = _seed_run("fcfs", rate=60.0, max_wait_s=8.0)
    assert report["saturated"] and "grows without bound" in report["saturated"]
    assert report["duration_s"] < 20.0
    assert report["text"]["finished"] < report["text"]["requests"] / 2


def test_voice_turns_are_on_time_under_o4_and_late_under_static_beside_text():
    runs = {}
    for policy in ("o4", "static"):
        scenario = Scenario(policy, {"max_batch_tokens": 4096, "max_batch_seqs": 256},
                            TextLoad(rate=5.0, duration_s=15.0, seed=2), engine={"static_batch_size": 32},
                            calls=CallLoad(calls=3, turns=3))
        runs[policy] = simulate(scenario, priced("h100", "llama-2-13b", "int8"))
    o4, static = runs["o4"]["calls"], runs["static"]["calls"]
    assert o4["turns"] == static["turns"] == 9 and o4["turns_without_audio"] == 0
    assert o4["on_time_rate"] == 1.0 and o4["ttfa_p99_s"] < 1.5
    assert static["on_time_rate"] < o4["on_time_rate"]


def test_calls_share_their_conversation_prefix_across_turns():
    scenario = Scenario("o4", calls=CallLoad(calls=1, turns=3, instructions_tokens=300))
    report = simulate(scenario, priced("h100", "llama-2-13b", "int8"))
    # the instructions are prefilled once (when the call starts), each turn computes only what is new
    assert report["steps"]["prefill_tokens_per_step"] * report["steps"]["steps"] < 300 + 3 * (24 + 48 + 16)


# -- traffic and the command ------------------------------------------------------------------------------------
def test_text_loads_arrive_as_asked():
    poisson = TextLoad(rate=5.0, duration_s=200.0, prompt_tokens=(10, 20), output_tokens=(3, 3)).items(1000)
    assert len(poisson) == pytest.approx(1000, rel=0.1)
    assert all(10 <= len(w.prompt_ids) <= 20 and w.max_tokens == 3 for w in poisson)
    burst = TextLoad("burst", rate=8.0, duration_s=100.0, burst_size=8).items(1000)
    assert len({w.arrival_s for w in burst}) * 8 == pytest.approx(len(burst), abs=8)
    assert len(TextLoad("all_at_once", requests=5).items(1000)) == 5
    first_pages = {tuple(prompt_ids(n, 40, 1000)[:16]) for n in range(5000)}
    assert len(first_pages) == 5000  # no two requests share a cached page


def test_simulate_command_prints_and_writes_every_policy(tmp_path, capsys):
    from voicepipe.cli import main

    out = tmp_path / "sim.json"
    assert main(["simulate", "--device", "h100", "--rate", "2", "--duration", "5", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert list(report["runs"]) == list(POLICIES)  # every policy in the registry, by default
    for run in report["runs"].values():
        assert run["text"]["finished"] == run["text"]["requests"] > 0
        assert not math.isnan(run["text"]["ttft_p99_s"])
    printed = capsys.readouterr().out
    assert "TTFT p50" in printed and "o4" in printed and "h100" in printed


def test_simulate_command_refuses_what_it_cannot_price(capsys):
    from voicepipe.cli import main

    assert main(["simulate", "--device", "h100", "--dtype", "int4"]) == 2
    assert main(["simulate", "--device", "cpu-measured", "--model", "llama-2-13b"]) == 2
    assert "error" in capsys.readouterr().err
    assert RequestClass.REALTIME < RequestClass.INTERACTIVE  # calls outrank text in the scenarios above


@pytest.mark.parametrize("job_threads", [0, 1])
def test_a_simulated_job_lane_runs_jobs_beside_the_steps_on_the_virtual_clock(job_threads):
    """Two 0.1 s jobs and ten 0.03 s decode steps: between steps they take 0.5 s of virtual time one after
    the other; on a lane (a GPU's second stream) the text ends at 0.3 s, and the second job starts as the
    first ends (0.1 s), not when the step in flight does (0.12 s). Results go out at a step's end, as the
    real engine's: at 0.12 and 0.21 (0.24 had the second waited for the step)."""
    clock = VirtualClock()
    engine = virtual_engine(TINY, EngineConfig(num_slabs=2, job_threads=job_threads), Constant(0.03),
                            IdTokenizer(512), jobs={"tts": lambda n: (0.1, n)}, kv_itemsize=4, clock=clock)
    ended: dict[object, float] = {}
    driver = Driver(engine, clock)
    for n in (1, 2):
        driver.submit_job(make_job("tts", (n,), RequestClass.REALTIME, deadline=0.0),
                          lambda result: ended.setdefault(result.value, clock.now()))
    driver.add_request(Sequence([5] * 4, SamplingParams(max_tokens=10, ignore_eos=True)),
                       lambda output: ended.update(text=clock.now()) if output.finished else None)
    driver.run()
    assert ended == pytest.approx({1: 0.12, 2: 0.21, "text": 0.3} if job_threads else {1: 0.1, 2: 0.2, "text": 0.5})


@pytest.mark.parametrize("batch", [1, 8])
def test_a_device_that_batches_synthesis_runs_several_calls_sentences_in_one_run_priced_by_the_longest(batch):
    """Two calls' sentences of 2 s and 1 s of speech at an RTF of 0.1: one at a time they end at 0.2 and
    0.3 s; batched, each further sentence adds half the longest's price, so both end at 0.3 s together."""
    prices = JobPrices(0.1, 0.1, "test", batch=batch, batch_extra=0.5)
    clock = VirtualClock()
    engine = virtual_engine(TINY, EngineConfig(num_slabs=2), Constant(0.03), IdTokenizer(512),
                            jobs=priced_jobs(prices), kv_itemsize=4, clock=clock)
    ended: dict[float, float] = {}
    driver = Driver(engine, clock)
    for chars in (30, 15):
        driver.submit_job(make_job(TTS_SENTENCE, (chars,), RequestClass.REALTIME, deadline=0.0),
                          lambda result: ended.setdefault(result.value, clock.now()))
    driver.run()
    assert ended == pytest.approx({2.0: 0.3, 1.0: 0.3} if batch > 1 else {2.0: 0.2, 1.0: 0.3})


def test_cpu_measured_prices_steps_by_the_fit_the_engine_kept_serving_here(tmp_path, monkeypatch):
    """The one cost model: what an engine serving the default model learned of its steps, kept where this
    machine's fits are, is what `--device cpu-measured` prices that model's steps with at that precision."""
    monkeypatch.setenv("VOICEPIPE_CACHE", str(tmp_path))
    from voicepipe.backends.loading import ModelOptions, engine_config
    from voicepipe.simulate.costs import CPU

    with pytest.raises(ValueError, match="no engine has served"):
        priced(CPU, "smollm2-135m", "int4")
    kept = Path(engine_config(ModelOptions(device="cpu", llm_precision="int4")).step_cost_file)  # as served
    assert kept.parent.parent == tmp_path  # beside the kernels' cache, named for the machine and model
    kept.parent.mkdir(parents=True)
    terms = {"const": 0.004, "tokens": 0.0015, "samples": 0.0, "seqs": 0.0002, "attention_pairs": 1e-6,
             "context_tokens": 2e-6}
    kept.write_text(json.dumps({"coefficients": terms, "knee_tokens": 0}))
    target = priced(CPU, "smollm2-135m", "int4")
    assert target.about["cost_model"] == "the engine's own fit"
    step = StepShape(tokens=40, seqs=9, samples=9, decodes=8, prefill_tokens=32, attention_pairs=900,
                     context_tokens=1200)
    assert target.cost.step_seconds(step) == pytest.approx(0.004 + 40 * 0.0015 + 9 * 0.0002 + 900e-6 + 1200 * 2e-6)


@pytest.mark.parametrize("horizon_s", [4.0, 1000.0])
def test_a_simulated_reply_is_synthesized_no_further_ahead_than_the_horizon(monkeypatch, horizon_s):
    """Ten sentences of about 4 s of speech each: with a 4 s horizon each waits until the caller has at
    most that left to hear (one about every 4 s), as the TTS stage does; without one each goes as the model
    writes it (all within the reply's 1.5 s of decoding)."""
    asked: list[float] = []
    submit = Driver.submit_job

    def recorded(driver, job, on_result):
        if job.kind == TTS_SENTENCE:
            asked.append(driver.clock.now())
        submit(driver, job, on_result)

    monkeypatch.setattr(Driver, "submit_job", recorded)
    load = CallLoad(calls=1, turns=1, reply_tokens=160, sentence_tokens=16, synthesis_horizon_s=horizon_s)
    simulate(Scenario("o4", calls=load), priced("h100", "llama-2-13b", "int8"))
    spread = [t - asked[0] for t in asked]
    assert len(asked) == 10
    if horizon_s < 100:
        assert sum(t < 5.0 for t in spread) <= 3 and spread[-1] > 25.0
    else:
        assert spread[-1] < 2.0


def test_cpu_measured_without_the_served_model_falls_back_to_the_calibrated_fit(tmp_path, monkeypatch):
    """A machine without the default LLM (the model packages not installed) still simulates by the calibrated
    fit, and says it has none rather than failing on the missing model."""
    from voicepipe.backends import models
    from voicepipe.simulate.costs import CPU, machine_fit_path

    monkeypatch.setenv("VOICEPIPE_CACHE", str(tmp_path))

    def missing(path=None):
        raise models.ModelError("no default LLM installed")

    monkeypatch.setattr(models, "resolve_llm", missing)
    with pytest.raises(ValueError, match="no step-cost fit yet"):
        priced(CPU, "smollm2-135m", "int8")
    machine_fit_path().parent.mkdir(parents=True)
    FittedCost({"const": 0.01, "tokens": 0.002}, {"machine": "test"}).save(machine_fit_path())
    assert priced(CPU, "smollm2-135m", "int8").about["cost_model"] == "fitted"
