"""KV-cache dtypes: fp8 pages with per-page scales (round trip, writes, both kernels) and the pool in bytes.

Stated tolerance of fp8 (e4m3, 3 mantissa bits): each stored value is within 2**-4 of its own magnitude
plus one subnormal step of its page's scale, however often later writes rescaled its page; attention over
an fp8 cache equals attention over the dequantized cache; and the logits of a small random-weight model
with fp8 KV stay within 0.1 of the logits' standard deviation of float32 KV's.
"""

import sys

import pytest
import torch
from support.interpreted import interpreted_outputs
from support.kernel_cases import make_case, random_lengths

from kernels import paged_attention_reference, write_kv
from kernels.fp8 import FP8, FP8_MAX, dequantize, quantize, write_kv_fp8
from scheduler import Engine, EngineConfig, SamplingParams, Sequence
from scheduler.model.kv_dtype import KV_DTYPES, page_bytes, pages_per_slab
from scheduler.model.runner import ModelRunner
from scheduler.planner import Chunk, StepPlan
from voicepipe.bench.random_weights import random_llm

STEP = 2.0 ** -4  # e4m3 rounds to within this fraction of a value (3 mantissa bits)
SUBNORMAL = 2.0 ** -9  # its spacing below the smallest normal, in units of the scale


def test_quantize_dequantize_round_trip_within_one_fp8_step():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=gen) * torch.logspace(-3, 2, 4096)
    scale = x.abs().max() / FP8_MAX
    q = quantize(x, scale)
    assert q.dtype == FP8
    back = dequantize(q, scale)
    assert ((back - x).abs() <= x.abs() * STEP + scale * SUBNORMAL / 2).all()
    assert back.abs().max() <= x.abs().max()  # saturates, never overflows to NaN


def test_quantize_fails_loudly_on_a_wrong_scale():
    """The round trip holds only with the scale that fits: a scale 100x too small saturates."""
    x = torch.linspace(-10, 10, 101)
    back = dequantize(quantize(x, x.abs().max() / FP8_MAX / 100), x.abs().max() / FP8_MAX / 100)
    assert (back - x).abs().max() > 1


def test_page_writes_in_position_order_keep_every_value_within_tolerance():
    """Decode-like writes into one page, the later ones larger: the scale grows and old values follow."""
    page_tokens, n_kv, dim = 16, 2, 8
    cache = torch.full((3, page_tokens, n_kv, dim), float("nan")).to(FP8)  # stale bytes of a previous owner
    scale = torch.full((3, n_kv), 123.0)
    gen = torch.Generator().manual_seed(1)
    written = torch.zeros(page_tokens, n_kv, dim)
    for pos in range(page_tokens):
        row = torch.randn(1, n_kv, dim, generator=gen) * (1 + pos)
        written[pos] = row[0]
        write_kv_fp8(cache, scale, row, torch.tensor([page_tokens + pos]))  # page 1
        held = dequantize(cache[1, :pos + 1], scale[1][None, :, None])
        bound = written[:pos + 1].abs() * STEP + scale[1][None, :, None] * SUBNORMAL
        assert ((held - written[:pos + 1]).abs() <= bound).all(), pos
    needed = written.abs().amax((0, 2)) / FP8_MAX
    assert (needed <= scale[1]).all() and (scale[1] < 2 * needed).all()  # the power of two just above
    assert torch.isnan(cache[0].float()).all() and torch.isnan(cache[2].float()).all()  # other pages untouched


def test_a_write_from_a_pages_first_slot_restarts_its_scale():
    cache = torch.zeros(2, 4, 1, 4, dtype=FP8)
    scale = torch.zeros(2, 1)
    write_kv_fp8(cache, scale, torch.full((4, 1, 4), 100.0), torch.arange(4))
    write_kv_fp8(cache, scale, torch.full((2, 1, 4), 1.0), torch.arange(2))  # the page's new owner
    torch.testing.assert_close(scale[0], torch.tensor([2.0 ** -8]))  # 1 / 448 rounded up to a power of two
    assert dequantize(cache[0, 2:], scale[0]).abs().max() == 0  # the old owner's values are gone


def fp8_case(kind: str, seed: int) -> tuple:
    """A random paged case, and the same cache in fp8 written position by position, with its scales."""
    q_lens, kv_lens = random_lengths(kind, n_seqs=5, seed=seed)
    case = make_case(q_lens, kv_lens, 16, 8, 2, 32, seed=seed)
    k8, v8 = (torch.zeros(c.shape, dtype=FP8) for c in (case.k_cache, case.v_cache))
    scales = tuple(torch.zeros(c.shape[0], c.shape[2]) for c in (case.k_cache, case.v_cache))
    for s, kv_len in enumerate(case.kv_lens.tolist()):
        for pos in range(kv_len):
            slot = int(case.block_tables[s, pos // 16]) * 16 + pos % 16
            page, off = divmod(slot, 16)
            write_kv(k8, v8, case.k_cache[page, off][None], case.v_cache[page, off][None], torch.tensor([slot]),
                     scales)
    return case, k8, v8, scales


@pytest.mark.parametrize("kind", ["decode", "prefill", "mixed"])
def test_reference_reads_fp8_pages_through_their_scales(kind: str):
    case, k8, v8, scales = fp8_case(kind, seed=3)
    got = paged_attention_reference(case.q, k8, v8, case.block_tables, case.cu_q_lens, case.kv_lens, case.scale,
                                    scales=scales)
    k_deq = dequantize(k8, scales[0][:, None, :, None])
    v_deq = dequantize(v8, scales[1][:, None, :, None])
    exact = paged_attention_reference(case.q, k_deq, v_deq, case.block_tables, case.cu_q_lens, case.kv_lens,
                                      case.scale)
    torch.testing.assert_close(got, exact, rtol=0, atol=0)
    floats = paged_attention_reference(*case.args())
    assert (got - floats).abs().max() < 4 * STEP * floats.abs().max()


def test_pool_in_bytes_fp8_holds_at_least_1_9x_the_tokens_of_bf16():
    shape = dict(page_tokens=16, n_kv=8, head_dim=128)
    per_slab = {name: pages_per_slab(2 * 1024 * 1024, dtype=dtype, **shape) for name, dtype in KV_DTYPES.items()}
    assert per_slab["bf16"] == per_slab["fp16"] == 2 * per_slab["fp32"]
    assert per_slab["fp8_e4m3"] >= 1.9 * per_slab["bf16"]
    # the scales are paid for: fp8 pages cost more than half of bf16's
    assert 2 * page_bytes(dtype=KV_DTYPES["fp8_e4m3"], **shape) > page_bytes(dtype=KV_DTYPES["bf16"], **shape)


@pytest.mark.parametrize("kv_dtype", ["auto", "fp32", "bf16", "fp8_e4m3"])
def test_runner_allocates_the_kv_dtype_in_the_bytes_asked(kv_dtype: str):
    model, _ = random_llm("tiny")
    runner = ModelRunner(model, EngineConfig(kv_dtype=kv_dtype, kv_bytes=8 * 2 * 1024 * 1024))
    dtype = torch.float32 if kv_dtype == "auto" else KV_DTYPES[kv_dtype]
    assert runner.kv.dtype == dtype and runner.num_slabs == 8 // model.config.num_hidden_layers
    assert (runner.kv_scales is not None) == (kv_dtype == "fp8_e4m3")
    cfg = model.config
    used = runner.num_pages * page_bytes(16, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads,
                                         dtype) * cfg.num_hidden_layers
    assert 0.9 * 8 * 2 * 1024 * 1024 < used <= 8 * 2 * 1024 * 1024


def two_steps_logits(runner: ModelRunner, prompts: list[list[int]]) -> torch.Tensor:
    """A prefill of every prompt, then one decode of each: the logits of both steps."""
    seqs = [Sequence(list(p), SamplingParams()) for p in prompts]
    pages = iter(range(1, runner.num_pages))
    for s in seqs:
        s.pages = [next(pages) for _ in range(len(s.prompt_ids) // 16 + 1)]
    first = runner.run(StepPlan([Chunk(s, 0, len(s.prompt_ids)) for s in seqs]))
    for s in seqs:
        s.output_ids.append(7)
    return torch.cat([first, runner.run(StepPlan([Chunk(s, len(s.prompt_ids), 1) for s in seqs]))])


def test_fp8_kv_logits_stay_within_the_stated_tolerance():
    model, _ = random_llm("tiny")
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 512, (n,), generator=gen).tolist() for n in (5, 40, 17)]
    ref = two_steps_logits(ModelRunner(model, EngineConfig(num_slabs=8)), prompts)
    got = two_steps_logits(ModelRunner(model, EngineConfig(num_slabs=8, kv_dtype="fp8_e4m3")), prompts)
    err = (got - ref).abs().max() / ref.std()
    assert 0 < err < 0.1


def test_copying_fp8_pages_moves_their_scales():
    model, _ = random_llm("tiny")
    runner = ModelRunner(model, EngineConfig(kv_dtype="fp8_e4m3", num_slabs=1))
    gen = torch.Generator().manual_seed(2)
    k, v = (torch.randn(20, 2, 16, generator=gen) * 5 for _ in range(2))
    for kv in runner.caches:
        write_kv(kv.k, kv.v, k, v, torch.arange(16, 36), kv.scales)  # pages 1 and 2
    before = [dequantize(runner.kv[:, :, p], runner.kv_scales[:, :, p][:, :, None, :, None]) for p in (1, 2)]
    runner.copy_pages({1: 7, 2: 9})
    after = [dequantize(runner.kv[:, :, p], runner.kv_scales[:, :, p][:, :, None, :, None]) for p in (7, 9)]
    for old, new in zip(before, after, strict=True):
        torch.testing.assert_close(new, old, rtol=0, atol=0)


def test_fp8_engine_gives_the_same_tokens_with_pages_moved_mid_run():
    """A compaction between steps moves live pages; the tokens are those of a run without one."""
    model, tokenizer = random_llm("tiny")
    prompts = [list(range(3 + 10 * i, 8 + 10 * i)) for i in range(5)]  # a page each: 4 in slab 0, 1 in slab 1

    def run(compact: bool) -> tuple[list[list[int]], int]:
        engine = Engine(model, tokenizer, EngineConfig(kv_dtype="fp8_e4m3", num_slabs=4, reserve_frac=0.0,
                                                       slab_bytes=4 * page_bytes(16, 2, 16, FP8),
                                                       compact_threshold=0.0 if compact else 1.0))
        seqs = [engine.add_request(Sequence(p, SamplingParams(max_tokens=20, ignore_eos=True))) for p in prompts]
        engine.step()
        for seq in seqs[1:4]:  # slab 0 keeps the first request's page, slab 1 the last one's
            engine.abort(seq.request_id)
        while engine.step():
            pass
        engine.planner.check_pool()
        return [seqs[0].output_ids, seqs[4].output_ids], int(engine.metrics.compactions._value.get())

    (plain, no_moves), (compacted, moves) = run(False), run(True)
    assert no_moves == 0 and moves > 0
    assert compacted == plain


# -- the Triton kernel over fp8 pages, interpreted on the CPU (see test_kernels.py for why in a child) ------

def _interpreted_worker(out_path: str) -> None:
    from kernels import triton_paged

    results = {}
    for kind in ("decode", "prefill", "mixed"):
        case, k8, v8, scales = fp8_case(kind, seed=5)
        results[kind] = triton_paged.paged_attention_triton(case.q, k8, v8, case.block_tables, case.cu_q_lens,
                                                            case.kv_lens, case.scale, scales)
    torch.save(results, out_path)


@pytest.fixture(scope="module")
def triton_fp8_outputs(tmp_path_factory) -> dict:
    return interpreted_outputs(__file__, tmp_path_factory.mktemp("triton-fp8"))


@pytest.mark.parametrize("kind", ["decode", "prefill", "mixed"])
def test_triton_reads_fp8_pages_as_the_reference_does(triton_fp8_outputs: dict, kind: str):
    case, k8, v8, scales = fp8_case(kind, seed=5)
    ref = paged_attention_reference(case.q, k8, v8, case.block_tables, case.cu_q_lens, case.kv_lens, case.scale,
                                    scales=scales)
    torch.testing.assert_close(triton_fp8_outputs[kind], ref, rtol=1e-4, atol=2e-5)


if __name__ == "__main__":
    _interpreted_worker(sys.argv[1])
