"""`voicepipe bench grammar`: what constrained decoding costs and whether it holds. Validity: requests over a
dozen schemas, greedy and sampled, each output parsed and validated against its schema. Cost: the engine
bench's mixed workload through mini-O4 with none of its requests constrained, then with a share of them
(tokens/s and p99 latency, as a ratio run after run), and the mask time per step."""

import json
import time

import jsonschema

from scheduler import Engine, EngineConfig, SamplingParams, Sequence
from scheduler.grammar.constraint import Grammar
from voicepipe.backends.base import chat_prompt_ids
from voicepipe.bench.engine_modes import run_engine
from voicepipe.bench.workload import Workload

TEXT = {"type": "string", "maxLength": 40}
SCHEMAS: list[tuple[str, dict]] = [
    ("Describe Paris.", {"type": "object", "properties": {"name": TEXT, "country": TEXT,
                                                          "population_millions": {"type": "number"}},
                         "required": ["name", "country", "population_millions"], "additionalProperties": False}),
    ("Who wrote Hamlet?", {"type": "object", "properties": {"author": TEXT, "year": {"type": "integer"}},
                           "required": ["author", "year"], "additionalProperties": False}),
    ("What is the weather like in Rome today?", {"type": "object", "properties": {
        "city": TEXT, "condition": {"enum": ["sunny", "cloudy", "rain", "snow"]},
        "celsius": {"type": "number", "minimum": -50, "maximum": 60}},
        "required": ["city", "condition", "celsius"], "additionalProperties": False}),
    ("Is a tomato a fruit?", {"type": "object", "properties": {"answer": {"type": "boolean"}, "reason": TEXT},
                              "required": ["answer", "reason"], "additionalProperties": False}),
    ("List three colours.", {"type": "array", "items": TEXT, "minItems": 3, "maxItems": 3}),
    ("Order two pizzas and a salad.", {"type": "object", "properties": {"items": {"type": "array", "maxItems": 5,
        "items": {"type": "object", "properties": {"dish": TEXT, "quantity": {"type": "integer", "minimum": 1,
                                                                              "maximum": 9}},
                  "required": ["dish", "quantity"], "additionalProperties": False}}},
        "required": ["items"], "additionalProperties": False}),
    ("Rate the film Jaws out of five.", {"type": "object", "properties": {"stars": {"type": "integer", "minimum": 1,
                                                                                    "maximum": 5}, "summary": TEXT},
                                         "required": ["stars", "summary"], "additionalProperties": False}),
    ("Book a table for four at eight.", {"type": "object", "properties": {
        "people": {"type": "integer", "minimum": 1, "maximum": 20}, "time": {"type": "string",
                                                                             "pattern": "^[0-2][0-9]:[0-5][0-9]$"}},
        "required": ["people", "time"], "additionalProperties": False}),
    ("What is the address of the Louvre?", {"type": "object", "properties": {
        "street": TEXT, "city": TEXT, "postcode": {"type": ["string", "null"], "maxLength": 10}},
        "required": ["street", "city", "postcode"], "additionalProperties": False}),
    ("Convert ten miles to kilometres.", {"type": "object", "properties": {"value": {"type": "number"},
                                                                           "unit": {"enum": ["km", "m"]}},
                                          "required": ["value", "unit"], "additionalProperties": False}),
    ("Plan my morning.", {"type": "object", "properties": {"tasks": {"type": "array", "minItems": 1, "maxItems": 4,
                                                                     "items": TEXT}, "done": {"type": "boolean"}},
                          "required": ["tasks", "done"], "additionalProperties": False}),
    ("Yes or no: is the sky green?", {"enum": ["yes", "no"]}),
]


def validity(engine: Engine, requests: int, max_tokens: int = 160) -> dict:
    """`requests` constrained requests over SCHEMAS, every other one sampled; how many parse and validate."""
    seqs = []
    for n in range(requests):
        question, schema = SCHEMAS[n % len(SCHEMAS)]
        prompt = chat_prompt_ids(engine.tokenizer, [{"role": "user", "content": f"{question} Answer in JSON."}])
        params = SamplingParams(max_tokens=max_tokens, temperature=0.8 if n % 2 else 0.0, seed=n,
                                grammar=Grammar.json_schema(schema))
        seqs.append((engine.add_request(Sequence(prompt, params)), schema))
    start = time.monotonic()
    while engine.step():
        pass
    counts = {"valid": 0, "invalid": 0, "cut_by_length": 0}
    for seq, schema in seqs:
        if seq.finish_reason == "length":
            counts["cut_by_length"] += 1
            continue
        try:
            jsonschema.validate(json.loads(seq.text), schema)
            counts["valid"] += 1
        except (ValueError, jsonschema.ValidationError):
            counts["invalid"] += 1
    return {"requests": requests, "schemas": len(SCHEMAS), **counts, "seconds": time.monotonic() - start}


def cost(model, tokenizer, share: float, workload: Workload) -> dict:
    """The mixed workload with none, then `share`, of its requests constrained (each to one of SCHEMAS)."""
    items = workload.items(tokenizer)
    every = max(1, round(1 / share))
    grammars = {n: Grammar.json_schema(SCHEMAS[n % len(SCHEMAS)][1]) for n in range(0, len(items), every)}
    free = run_engine(model, tokenizer, items, EngineConfig())
    constrained = run_engine(model, tokenizer, items, EngineConfig(), grammars)
    constrained.pop("outputs")
    return {"share": len(grammars) / len(items), "unconstrained": free, "constrained": constrained,
            "throughput_ratio": constrained["throughput_tok_s"] / free["throughput_tok_s"],
            "latency_p99_ratio": constrained["latency_p99_s"] / free["latency_p99_s"]}


def bench_grammar(requests: int, share: float, quick: bool) -> dict:
    from voicepipe.backends.models import load_llm

    model, tokenizer = load_llm()
    workload = Workload(requests=16, output_tokens=(16, 96)) if quick else Workload()
    return {"validity": validity(Engine(model, tokenizer, EngineConfig()), requests),
            "cost": cost(model, tokenizer, share, workload)}


def print_grammar(report: dict) -> None:
    v, c = report["validity"], report["cost"]
    print(f"validity: {v['valid']} of {v['requests']} valid ({v['invalid']} invalid, {v['cut_by_length']} cut by "
          f"max_tokens) over {v['schemas']} schemas, greedy and sampled, in {v['seconds']:.0f} s")
    for name in ("unconstrained", "constrained"):
        m = c[name]
        print(f"{name:14} {m['throughput_tok_s']:8.1f} tok/s  p99 latency {m['latency_p99_s']:6.2f} s")
    print(f"{c['share']:.0%} constrained: throughput x{c['throughput_ratio']:.2f}, p99 latency "
          f"x{c['latency_p99_ratio']:.2f}; mask {c['constrained']['mask_ms_per_masked_step']:.3f} ms per masked step")
