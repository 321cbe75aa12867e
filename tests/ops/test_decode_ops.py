"""The C++ decode-step ops against the torch ops they replace, and the engine's decode path through them
against the packed path: the same greedy tokens in float32, the packed path where the ops are missing, and
under quantized weights the one-call layers giving the layer-by-layer path's tokens."""

from types import SimpleNamespace

import pytest
import torch

import kernels
import scheduler.model.runner
from kernels import decode_ops
from scheduler import Engine, EngineConfig, SamplingParams, Sequence
from scheduler.model.llama import RotaryTable, rotate

pytestmark = pytest.mark.usefixtures("native_kernels")
H, HKV, D, PAGE, PAGES = 9, 3, 64, 16, 40


def _table() -> RotaryTable:
    return RotaryTable(1.0 / (10000 ** (torch.arange(0, D, 2).float() / D)), 1.0, torch.float32, 256)


def test_rotary_and_kv_write_equal_torchs_to_the_bit():
    torch.manual_seed(0)
    positions, slots = torch.tensor([0, 5, 17, 100, 3, 255]), torch.randperm(PAGES * PAGE)[:6]
    qkv = torch.randn(6, (H + 2 * HKV) * D)
    table = _table()
    rotation = table(positions, 256)
    qk = rotate(qkv[:, :(H + HKV) * D].view(6, -1, D), rotation.cos, rotation.sin)
    want_k, want_v = torch.zeros(2, PAGES, PAGE, HKV, D)
    kernels.write_kv(want_k, want_v, qk[:, H:], qkv[:, (H + HKV) * D:].view(6, HKV, D), slots)
    got_k, got_v = torch.zeros(2, PAGES, PAGE, HKV, D)
    whole = table(positions, 256, whole=True)
    decode_ops.rotary_write_kv(qkv, whole.cos, whole.sin, positions, slots, got_k, got_v, H)
    assert torch.equal(qkv[:, :(H + HKV) * D].view(6, -1, D), qk)
    assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)


@pytest.mark.parametrize("kv_lens", [[1], [16, 17], [1, 40, 33, 64, 5]])
def test_decode_attention_matches_the_reference_over_scattered_pages(kv_lens):
    torch.manual_seed(len(kv_lens))
    k_cache, v_cache = torch.randn(2, PAGES, PAGE, HKV, D)
    width = 5
    tables = torch.zeros(len(kv_lens), width, dtype=torch.int32)
    pages = torch.randperm(PAGES)
    for s, n in enumerate(kv_lens):  # each sequence's pages anywhere in the pool, in no order
        used = -(-n // PAGE)
        tables[s, :used] = pages[s * width:s * width + used]
    qkv = torch.randn(len(kv_lens), (H + 2 * HKV) * D) * 3
    lens = torch.tensor(kv_lens, dtype=torch.int32)
    cu = torch.arange(len(kv_lens) + 1, dtype=torch.int32)
    want = kernels.paged_attention(qkv[:, :H * D].reshape(-1, H, D), k_cache, v_cache, tables, cu, lens, D ** -0.5)
    got = decode_ops.decode_attention(qkv, k_cache, v_cache, tables, lens, H, D ** -0.5)
    torch.testing.assert_close(got, want.reshape(len(kv_lens), -1), rtol=1e-5, atol=1e-5)


def test_norm_and_gated_activation_match_torchs_within_rounding():
    torch.manual_seed(2)
    x, weight, gate_up = torch.randn(3, 576) * 5, torch.randn(576), torch.randn(3, 2 * 1536) * 6
    torch.testing.assert_close(decode_ops.rms_norm(x, weight, 1e-5),
                               torch.nn.functional.rms_norm(x, (576,), weight, 1e-5), rtol=1e-5, atol=1e-5)
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(decode_ops.silu_mul(gate_up), torch.nn.functional.silu(gate) * up,
                               rtol=1e-5, atol=1e-6)


def _greedy(engine: Engine, prompts: list[list[int]], tokens: int = 24) -> list[list[int]]:
    seqs = [engine.add_request(Sequence(p, SamplingParams(max_tokens=tokens, ignore_eos=True))) for p in prompts]
    while engine.step():
        pass
    return [s.output_ids for s in seqs]


def _packed(engine: Engine) -> Engine:
    """The same engine with the decode ops turned off: every step through the packed path."""
    engine.runner.native = False
    engine.runner.lean.native = False
    for module in engine.runner.lean.modules():
        if hasattr(module, "native"):
            module.native = False
    return engine


@pytest.fixture(scope="module")
def small_llm():
    """A random-weight model of SmolLM2's head layout (9 query heads of 64 sharing 3 kv heads), 2 layers."""
    from voicepipe.bench.random_weights import random_llm

    return random_llm("tiny", hidden_size=576, num_attention_heads=9, num_key_value_heads=3, num_hidden_layers=2,
                      intermediate_size=1536, vocab_size=512)


def test_the_decode_path_gives_the_packed_paths_tokens_in_fp32(small_llm):
    model, tokenizer = small_llm
    prompts = [[(7 * i + 3 * j) % 500 + 3 for j in range(n)] for i, n in enumerate((5, 17, 40, 3))]
    native = Engine(model, tokenizer, EngineConfig(precision="fp32"))
    assert native.runner.native
    steps = []
    run = native.runner.run
    native.runner.run = lambda plan: (steps.append(all(c.n == 1 for c in plan.chunks)), run(plan))[1]
    got = _greedy(native, prompts)
    assert sum(steps) > 20  # most steps were decodes through the C++ ops
    assert got == _greedy(_packed(Engine(model, tokenizer, EngineConfig(precision="fp32"))), prompts)


def test_the_packed_path_runs_where_the_decode_ops_are_missing(small_llm, monkeypatch):
    model, tokenizer = small_llm
    want = _greedy(Engine(model, tokenizer, EngineConfig(precision="fp32")), [[5, 6, 7]], 8)
    monkeypatch.setattr(scheduler.model.runner.decode_ops.native, "lib", lambda: None)
    engine = Engine(model, tokenizer, EngineConfig(precision="fp32"))
    assert not engine.runner.native and not engine.runner.lean.native
    assert _greedy(engine, [[5, 6, 7]], 8) == want


def test_the_decode_path_gives_the_packed_paths_tokens_on_the_embedded_model(llm):
    model, tokenizer = llm
    prompts = [tokenizer.encode(text) for text in ("The lighthouse keeper climbed the stairs", "Name three colors.",
                                                   "Once upon a time, in a small village by the sea,")]
    native = Engine(model, tokenizer, EngineConfig(precision="fp32"))
    assert native.runner.native
    packed = _packed(Engine(model, tokenizer, EngineConfig(precision="fp32")))
    assert _greedy(native, prompts, 32) == _greedy(packed, prompts, 32)


@pytest.mark.parametrize("precision", ["int4", "int8"])
def test_the_one_call_layers_give_the_layer_by_layer_tokens(small_llm, precision):
    """Under quantized weights a decode step's layers run in one C++ call: the same ops in the same order
    as the layer-by-layer path, so the same tokens; float32's layers have no packed weights and never do."""
    model, tokenizer = small_llm
    prompts = [[(5 * i + 2 * j) % 500 + 3 for j in range(n)] for i, n in enumerate((4, 21, 9))]
    one_call = Engine(model, tokenizer, EngineConfig(precision=precision))
    assert one_call.runner.lean.one_call is not None
    calls = []
    run = one_call.runner.lean.one_call.run
    one_call.runner.lean.one_call = SimpleNamespace(run=lambda *args: (calls.append(1), run(*args))[1])
    got = _greedy(one_call, prompts)
    assert len(calls) > 20
    by_layer = Engine(model, tokenizer, EngineConfig(precision=precision))
    by_layer.runner.lean.one_call = None
    assert got == _greedy(by_layer, prompts)
    assert Engine(model, tokenizer, EngineConfig(precision="fp32")).runner.lean.one_call is None


def test_the_decode_profile_times_the_one_call_step_and_its_parts_layer_by_layer(small_llm):
    from voicepipe.bench.decode_profile import profile_decode

    result = profile_decode(*small_llm, "int4", batch=2, context=8, steps=4, rounds=1)
    assert result["step_ms"] > 0 and result["layer_by_layer_step_ms"] > 0
    assert result["plain_calls_per_step"] < result["calls_per_step"]  # the layers' ops left Python
    assert result["parts_ms"]["linear"] > 0 and result["parts_ms"]["attention"] > 0
