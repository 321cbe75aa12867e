"""Constrained decoding in the engine: outputs that match their grammar under greedy and sampled decoding
(random weights: whatever the model prefers, the mask decides what it may say), a constrained and an
unconstrained request in one batch each getting what they asked for, and bad grammars refused."""

import json

import jsonschema
import pytest

from scheduler import Engine, EngineConfig, SamplingParams, Sequence
from scheduler.grammar.constraint import Grammar
from scheduler.request import check_request
from voicepipe.bench.random_weights import random_llm

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer",
     "minimum": 0, "maximum": 120}}, "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome", "Berlin"]}, "sunny": {"type": "boolean"}},
     "required": ["city", "sunny"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 9}, "minItems": 1, "maxItems": 4},
    {"type": "object", "properties": {"expression": {"type": "string", "pattern": "^[0-9]{1,3}[*+-][0-9]{1,3}$"}},
     "required": ["expression"], "additionalProperties": False},
    {"type": "object", "properties": {"point": {"type": "object", "properties": {
        "x": {"type": "number", "minimum": -10, "maximum": 10}, "y": {"type": "number", "minimum": -10,
                                                                       "maximum": 10}},
        "required": ["x", "y"], "additionalProperties": False}, "label": {"type": ["string", "null"],
                                                                          "maxLength": 8}},
     "required": ["point", "label"], "additionalProperties": False},
    {"type": "string", "enum": ["yes", "no", "maybe"]},
]


@pytest.fixture(scope="module")
def engine():
    from voicepipe.backends.models import load_tokenizer

    tokenizer = load_tokenizer()
    model, _ = random_llm("tiny", vocab_size=len(tokenizer))
    return Engine(model, tokenizer, EngineConfig())


def run(engine: Engine, requests: list[tuple[list[int], SamplingParams]]) -> list[Sequence]:
    seqs = [engine.add_request(Sequence(prompt, params)) for prompt, params in requests]
    while engine.step():
        engine.planner.check_pool()
    return seqs


def prompt(engine: Engine, n: int) -> list[int]:
    return engine.tokenizer.encode(f"Question number {n}: answer in JSON.")


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_every_constrained_output_parses_and_validates_against_its_schema(engine, temperature):
    requests = [(prompt(engine, n), SamplingParams(max_tokens=200, temperature=temperature, seed=n,
                                                   grammar=Grammar.json_schema(schema)))
                for n, schema in enumerate(SCHEMAS * 3)]
    for seq, schema in zip(run(engine, requests), SCHEMAS * 3, strict=True):
        assert seq.finish_reason == "stop", (seq.finish_reason, seq.text)
        jsonschema.validate(json.loads(seq.text), schema)


def test_a_choice_and_a_regex_are_matched_exactly(engine):
    choice, regex = run(engine, [
        (prompt(engine, 1), SamplingParams(max_tokens=20, grammar=Grammar.choice(["red", "green", "blue"]))),
        (prompt(engine, 2), SamplingParams(max_tokens=20, temperature=1.0, seed=3,
                                           grammar=Grammar("regex", r"[0-9]{3}-[a-z]{2}")))])
    assert choice.text in ("red", "green", "blue") and choice.finish_reason == "stop"
    assert len(regex.text) == 6 and regex.text[:3].isdigit() and regex.text[3] == "-" and regex.text[4:].isalpha()


def test_an_unconstrained_request_beside_a_constrained_one_gets_its_own_greedy_tokens(engine):
    alone = run(engine, [(prompt(engine, 5), SamplingParams(max_tokens=24, ignore_eos=True))])[0].output_ids
    constrained, free = run(engine, [
        (prompt(engine, 6), SamplingParams(max_tokens=200, grammar=Grammar.json_schema(SCHEMAS[0]))),
        (prompt(engine, 5), SamplingParams(max_tokens=24, ignore_eos=True))])
    assert free.output_ids == alone
    jsonschema.validate(json.loads(constrained.text), SCHEMAS[0])
    assert engine.metrics.mask_seconds.collect()[0].samples  # the masks were timed


@pytest.mark.parametrize("grammar", [Grammar("choice", "[]"), Grammar("bnf", "root ::= x")])
def test_a_grammar_of_no_known_kind_is_refused_before_it_is_sent(engine, grammar):
    with pytest.raises(ValueError):
        check_request([1, 2, 3], SamplingParams(grammar=grammar))
    with pytest.raises(ValueError):
        seq = Sequence([1, 2, 3], SamplingParams(grammar=grammar))
        engine.add_request(seq)
    assert not engine.requests
    outputs, _, _ = engine.take_outputs()  # and a client across the channel hears why
    ended = [(out.finished, out.finish_reason[:6]) for rid, out in outputs if rid == seq.request_id]
    assert ended == [(True, "error:")]


@pytest.mark.parametrize("grammar", [Grammar("json_schema", "{not json"),
                                     Grammar("json_schema", json.dumps({"type": "nonsense"})),
                                     Grammar("regex", "([a-z")])
def test_a_grammar_that_does_not_compile_ends_its_request_before_it_runs(engine, grammar):
    seq = run(engine, [([1, 2, 3], SamplingParams(grammar=grammar))])[0]
    assert seq.finish_reason.startswith("error: invalid_grammar") and not seq.output_ids
    assert not engine.requests and not engine.planner.grammar_waiters() and engine.pool.num_used == len(engine.pool.lru)


def test_a_grammar_crosses_the_process_channel_as_it_is():
    from scheduler.channel import messages as m

    codec = m.Codec()
    params = SamplingParams(max_tokens=9, grammar=Grammar.json_schema(SCHEMAS[1]))
    back = codec.command(codec.encode(m.Add("r1", [1, 2], params, 0)))
    assert back.params == params and isinstance(back.params.grammar, Grammar)


def test_numbers_without_bounds_get_finite_ones_and_given_bounds_stay():
    from scheduler.grammar.constraint import NUMBER_BOUND, bounded

    schema = {"type": "object", "properties": {"n": {"type": "number"}, "k": {"type": ["integer", "null"],
              "minimum": 3}, "items": {"type": "array", "items": {"type": "integer", "exclusiveMaximum": 9}}}}
    out = bounded(schema)["properties"]
    assert (out["n"]["minimum"], out["n"]["maximum"]) == (-NUMBER_BOUND, NUMBER_BOUND)
    assert (out["k"]["minimum"], out["k"]["maximum"]) == (3, NUMBER_BOUND)
    assert out["items"]["items"] == {"type": "integer", "exclusiveMaximum": 9, "minimum": -NUMBER_BOUND}
