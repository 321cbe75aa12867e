"""Random-weight models of named shapes, their id-only tokenizer and workload, and `bench engine` on one."""

import json

import pytest
import torch

from voicepipe.bench.__main__ import main as bench_main
from voicepipe.bench.random_weights import SHAPES, IdTokenizer, random_llm, shape_config
from voicepipe.bench.workload import Workload


def test_the_default_shape_is_the_embedded_models(llm):
    model, _ = llm
    ours, theirs = shape_config("default"), model.config
    for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings", "tie_word_embeddings",
                 "hidden_act"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.rope_parameters["rope_theta"] == theirs.rope_parameters["rope_theta"]
    assert ours.rms_norm_eps == pytest.approx(theirs.rms_norm_eps)


@pytest.mark.parametrize(("shape", "billions"), [("13b", 13.016), ("1b", 1.236), ("default", 0.1345)])
def test_shapes_have_their_models_parameter_counts(shape: str, billions: float):
    model, _ = random_llm(shape, device="meta")  # shapes only, no memory
    assert sum(p.numel() for p in model.parameters()) / 1e9 == pytest.approx(billions, rel=1e-3)


def test_the_13b_shape_is_llama_2_13b():
    cfg = shape_config("13b")
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.intermediate_size, cfg.vocab_size) == (40, 5120, 40, 40, 13824, 32000)


def test_random_models_are_seeded_and_built_in_the_dtype_asked():
    a, tokenizer = random_llm("tiny", seed=3)
    b, _ = random_llm("tiny", seed=3)
    c, _ = random_llm("tiny", seed=4)
    weights = lambda m: torch.cat([p.flatten() for p in m.parameters()])  # noqa: E731
    assert torch.equal(weights(a), weights(b)) and not torch.equal(weights(a), weights(c))
    half, _ = random_llm("tiny", dtype=torch.bfloat16)
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    assert isinstance(tokenizer, IdTokenizer) and tokenizer.vocab_size == SHAPES["tiny"]["vocab_size"]
    with pytest.raises(ValueError, match="unknown shape"):
        shape_config("7b")


def test_the_id_tokenizer_round_trips_any_ids():
    tokenizer = IdTokenizer(100)
    assert tokenizer.encode(tokenizer.decode([5, 0, 99])) == [5, 0, 99]


def test_token_items_keep_the_workloads_lengths_and_arrivals(llm):
    _, tokenizer = llm
    workload = Workload(requests=6, prompt_tokens=(20, 60), output_tokens=(4, 9), poisson_rate=3.0)
    text, ids = workload.items(tokenizer), workload.token_items(512)
    assert [(w.max_tokens, w.arrival_s) for w in ids] == [(w.max_tokens, w.arrival_s) for w in text]
    assert all(20 <= len(w.prompt_ids) <= 60 and max(w.prompt_ids) < 512 for w in ids)
    assert ids == workload.token_items(512)


def test_bench_engine_runs_on_random_weights(tmp_path):
    out = tmp_path / "bench.json"
    assert bench_main(["engine", "--random-weights", "tiny", "--device", "cpu", "--llm-precision", "fp32", "--quick",
                       "--modes", "static,o4", "--workloads", "mixed", "--kv-dtype", "fp8_e4m3",
                       "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["engine"] == {"device": "cpu", "precision": "fp32", "kv_dtype": "fp8_e4m3"}
    assert set(report["modes"]) == {"static", "o4"} and "poisson" not in report
    # ignore_eos and fixed lengths: every mode produced the same number of tokens
    assert report["modes"]["static"]["tokens"] == report["modes"]["o4"]["tokens"] == sum(
        w.max_tokens for w in Workload(12, (32, 128), (8, 48)).token_items(512))


def test_bench_engine_measures_each_precision_in_one_run(tmp_path):
    out = tmp_path / "bench.json"
    assert bench_main(["engine", "--random-weights", "tiny", "--device", "cpu", "--llm-precision", "fp32", "--quick",
                       "--modes", "o4", "--workloads", "mixed", "--precisions", "fp32,int8,int4",
                       "--json", str(out)]) == 0
    table = json.loads(out.read_text())["precisions"]
    rows = table["by_precision"]
    assert list(rows) == ["fp32", "int8", "int4"] and table["hf_static_32_tok_s"] > 0
    assert rows["fp32"]["weight_bytes"] > rows["int8"]["weight_bytes"] > rows["int4"]["weight_bytes"]
    assert len({row["bandwidth_gb_s"] for row in rows.values()}) == 1  # one bandwidth: the limits compare
    for row in rows.values():
        assert row["batch1_decode_tok_s"] > 0 and row["batch16_decode_tok_s"] > 0 and row["all_at_once_tok_s"] > 0
        assert row["all_at_once_vs_hf_static_32"] == row["all_at_once_tok_s"] / table["hf_static_32_tok_s"]
