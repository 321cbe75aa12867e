"""Grammars compile beside the engine, not in it: a request whose schema takes seconds to compile waits
outside the planner (no pages, no slot) while another request's tokens come as fast as alone; a compile
past its budget is abandoned (the worker killed and started again) and its request ends with
grammar_too_complex; a grammar compiles once for all who ask, and the cache of them is bounded. A tiny
random-weight model over the real tokenizer's vocabulary, and the real compile worker."""

import json
import time

import jsonschema
import pytest

from scheduler import Engine, EngineConfig, SamplingParams, Sequence
from scheduler.grammar.cache import GrammarCache
from scheduler.grammar.constraint import Grammar
from scheduler.request import Status
from voicepipe.backends.loading import ModelOptions, set_torch_threads
from voicepipe.bench.random_weights import random_llm

# Within the schema limits, and slow to compile all the same: a pattern of nested repetitions (2.7 s here),
# and many optional properties (0.6 s for 400; the time grows with their square).
PATTERN = {"type": "string", "pattern": "^([a-z]{1,20}[0-9]{1,20}){1,30}$"}
SLOW = Grammar("json_schema", json.dumps({"type": "object", "properties": {"x": PATTERN}, "required": ["x"]}))
SLOWER = Grammar("json_schema", json.dumps({"type": "object", "properties": {"x": PATTERN, "y": PATTERN},
                                            "required": ["x", "y"]}))
SMALL = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["n"],
         "additionalProperties": False}


def make_engine(**config) -> Engine:
    from voicepipe.backends.models import load_tokenizer

    tokenizer = load_tokenizer()
    model, _ = random_llm("tiny", vocab_size=len(tokenizer))
    engine = Engine(model, tokenizer, EngineConfig(**config))
    warm = engine.add_request(Sequence([1, 2, 3], SamplingParams(max_tokens=4, grammar=Grammar.json_schema(SMALL))))
    run_until(engine, lambda: warm.finish_reason is not None)  # the worker is up, the tokenizer read
    return engine


@pytest.fixture(scope="module")
def engine():
    """With torch's threads as a served engine has them on a CPU (one core fewer than the machine has: the
    compile worker's process takes a core, and a parallel region with a thread on that core waits for it)."""
    import torch

    threads = torch.get_num_threads()
    set_torch_threads(ModelOptions(), EngineConfig(device="cpu"))
    engine = make_engine(grammar_budget_s=30.0)
    yield engine
    engine.close()
    torch.set_num_threads(threads)


def run_until(engine: Engine, done, timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < end, "the engine did not get there"
        engine.step()


def plain(n: int) -> Sequence:
    return Sequence([5, 6, 7, n], SamplingParams(max_tokens=96, ignore_eos=True))


def seconds(engine: Engine, runs: int, still: Sequence | None = None) -> float:
    """The best time of `runs` plain requests one after the other (each while `still` waits for its grammar)."""
    best = float("inf")
    for n in range(runs):
        seq, t0 = engine.add_request(plain(n)), time.monotonic()
        run_until(engine, lambda: seq.finish_reason is not None)  # noqa: B023
        best = min(best, time.monotonic() - t0)
        assert still is None or still.status is Status.WAITING_FOR_GRAMMAR, "the compile ended too soon to tell"
    return best


def test_a_slow_compile_does_not_delay_another_requests_tokens(engine):
    alone = seconds(engine, 3)
    slow = engine.add_request(Sequence([1, 2, 3], SamplingParams(max_tokens=8, grammar=SLOWER)))
    beside = seconds(engine, 2, still=slow)  # each finished while the grammar was still compiling
    assert not slow.pages and slow not in engine.planner.sequences  # it waited holding nothing, never planned
    # Compiled on the engine's loop, the other request waited the whole compile out (several seconds).
    assert beside < 2.0 * alone, (beside, alone)
    run_until(engine, lambda: slow.finish_reason is not None)
    assert slow.finish_reason in ("stop", "length") and slow.output_ids


def test_a_grammar_compiles_once_for_every_request_that_asks_and_is_kept(engine):
    compiled = engine.metrics.grammar_compiles.labels("compiled")
    before = compiled._value.get()
    schema = {**SMALL, "properties": {"m": {"type": "boolean"}}, "required": ["m"]}
    seqs = [engine.add_request(Sequence([1, 2, n], SamplingParams(max_tokens=16, grammar=Grammar.json_schema(schema))))
            for n in range(3)]
    assert len(engine.planner.grammar_waiters()) == 3
    run_until(engine, lambda: all(s.finish_reason for s in seqs))
    again = engine.add_request(Sequence([1, 2, 9], SamplingParams(max_tokens=16, grammar=Grammar.json_schema(schema))))
    assert not engine.planner.grammar_waiters()  # in the cache: admitted at once
    run_until(engine, lambda: again.finish_reason is not None)
    assert compiled._value.get() == before + 1
    for seq in [*seqs, again]:
        jsonschema.validate(json.loads(seq.text), schema)


def test_a_request_aborted_while_its_grammar_compiles_ends_and_holds_nothing(engine):
    schema = {**SMALL, "properties": {"k": {"enum": ["a", "b"]}}, "required": ["k"]}
    seq = engine.add_request(Sequence([1, 2, 3], SamplingParams(grammar=Grammar.json_schema(schema))))
    engine.abort(seq.request_id)
    assert seq.finish_reason == "abort" and not engine.planner.grammar_waiters()
    run_until(engine, lambda: not engine.constraints.pending)
    assert engine.constraints.compiled(Grammar.json_schema(schema)) is not None  # kept for the next one
    assert engine.planner.idle


def test_a_compile_past_its_budget_is_abandoned_and_the_next_one_compiles():
    engine = make_engine(grammar_budget_s=0.5)
    try:
        slow = engine.add_request(Sequence([1, 2, 3], SamplingParams(grammar=SLOW)))
        t0 = time.monotonic()
        run_until(engine, lambda: slow.finish_reason is not None)
        assert time.monotonic() - t0 < 2.0  # the budget, not the 2.7 s the compile would take
        assert slow.finish_reason.startswith("error: grammar_too_complex: compiling it ")
        assert engine.constraints._worker.restarts == 1  # a fresh worker, forked from the seed
        assert engine.metrics.grammar_compiles.labels("grammar_too_complex")._value.get() == 1
        again = engine.add_request(Sequence([1, 2, 3], SamplingParams(grammar=SLOW)))
        assert again.finish_reason == slow.finish_reason and not engine.constraints.pending  # known: no compile
        after = engine.add_request(Sequence([1, 2, 4], SamplingParams(max_tokens=16, grammar=Grammar.json_schema(
            {**SMALL, "properties": {"z": {"type": "integer", "minimum": 1, "maximum": 3}}, "required": ["z"]}))))
        run_until(engine, lambda: after.finish_reason is not None)  # a new worker, started in its place
        assert after.finish_reason == "stop" and 1 <= json.loads(after.text)["z"] <= 3
    finally:
        engine.close()


def test_the_cache_keeps_the_most_recent_within_its_count_and_bytes():
    cache = GrammarCache(max_entries=3, max_bytes=100)
    for n in range(4):
        cache.put(("json_schema", str(n)), f"g{n}", 10)
    assert len(cache) == 3 and cache.get(("json_schema", "0")) is None
    cache.get(("json_schema", "1"))  # used: kept over 2
    cache.put(("json_schema", "big"), "g", 80)
    assert cache.get(("json_schema", "1")) == "g1" and cache.get(("json_schema", "2")) is None
    assert cache.bytes <= 100
    cache.put(("json_schema", "huge"), "g", 101)
    assert cache.get(("json_schema", "huge")) is None  # larger than the whole budget: not kept


def test_a_fault_outside_the_model_step_ends_the_requests_still_waiting_for_their_grammar(engine, monkeypatch):
    from scheduler.channel import driver

    engine.take_outputs()  # what the tests before left
    schema = {**SMALL, "properties": {"f": {"enum": ["x", "y", "z"]}}, "required": ["f"]}
    seq = engine.add_request(Sequence([1, 2, 3], SamplingParams(grammar=Grammar.json_schema(schema))))
    assert seq.status is Status.WAITING_FOR_GRAMMAR and seq.request_id in engine.requests

    def planner_bug() -> bool:
        raise RuntimeError("a planner bug")

    monkeypatch.setattr(engine, "step", planner_bug)
    sent: list = []
    driver.step(engine, sent.append)
    assert [(rid, out.finish_reason) for rid, out in sent[0].tokens] == [(seq.request_id, "error: the engine failed")]
    assert not engine.requests and seq.status is Status.FINISHED
    monkeypatch.undo()
    run_until(engine, lambda: not engine.constraints.pending)
