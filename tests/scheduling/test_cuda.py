"""On a CUDA device: the Triton kernel (compiled) against the reference, the engine in bf16 against
transformers' `generate`, fp8 KV within its stated tolerance (test_kv_dtype.py). Skipped without CUDA.

Self-contained (no conftest fixtures), so that scripts/device-check.sh runs it where only torch, triton,
transformers and pytest are installed.
"""

import pytest
import torch
from support.kernel_cases import make_case, random_lengths

from kernels import paged_attention_reference, write_kv
from kernels.fp8 import FP8
from scheduler import Engine, EngineConfig, SamplingParams, Sequence
from scheduler.model.runner import ModelRunner
from scheduler.planner import Chunk, StepPlan
from voicepipe.bench.random_weights import random_llm

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
CUDA = torch.device("cuda")


def on_device(case, dtype: torch.dtype):
    """The case's tensors on the GPU, values in `dtype`; the NaN poison of unowned slots is kept."""
    return (case.q.to(CUDA, dtype), case.k_cache.to(CUDA, dtype), case.v_cache.to(CUDA, dtype),
            case.block_tables.to(CUDA), case.cu_q_lens.to(CUDA), case.kv_lens.to(CUDA), case.scale)


@pytest.mark.parametrize("kind", ["decode", "prefill", "mixed"])
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-4), (torch.bfloat16, 2e-2), (torch.float16, 2e-3)])
@pytest.mark.parametrize(("n_heads", "n_kv", "head_dim"), [(9, 3, 64), (40, 40, 128), (32, 8, 64)])
def test_triton_on_the_device_matches_the_reference(kind: str, dtype: torch.dtype, tol: float, n_heads: int,
                                                    n_kv: int, head_dim: int):
    from kernels.triton_paged import paged_attention_triton

    q_lens, kv_lens = random_lengths(kind, n_seqs=6, seed=n_heads)
    args = on_device(make_case(q_lens, kv_lens, 16, n_heads, n_kv, head_dim, seed=1), dtype)
    got = paged_attention_triton(*args)
    ref = paged_attention_reference(*args)
    assert not got.isnan().any()
    torch.testing.assert_close(got.float(), ref.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("kind", ["decode", "mixed"])
def test_triton_reads_fp8_pages_on_the_device(kind: str):
    from kernels.triton_paged import paged_attention_triton

    q_lens, kv_lens = random_lengths(kind, n_seqs=6, seed=2)
    case = make_case(q_lens, kv_lens, 16, 8, 2, 64, seed=2)
    q, k, v, tables, cu, lens, scale = on_device(case, torch.bfloat16)
    k8, v8 = torch.zeros(k.shape, dtype=FP8, device=CUDA), torch.zeros(v.shape, dtype=FP8, device=CUDA)
    scales = (torch.zeros(k.shape[0], k.shape[2], device=CUDA), torch.zeros(k.shape[0], k.shape[2], device=CUDA))
    for s, n in enumerate(lens.tolist()):
        for pos in range(n):  # in position order, as the engine writes
            slot = int(tables[s, pos // 16]) * 16 + pos % 16
            write_kv(k8, v8, k.flatten(0, 1)[slot][None], v.flatten(0, 1)[slot][None],
                     torch.tensor([slot], device=CUDA), scales)
    got = paged_attention_triton(q, k8, v8, tables, cu, lens, scale, scales)
    ref = paged_attention_reference(q, k8, v8, tables, cu, lens, scale, scales=scales)
    torch.testing.assert_close(got.float(), ref.float(), rtol=2e-2, atol=2e-2)


def greedy_generate(model, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    ids = torch.tensor([prompt], device=CUDA)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                         output_scores=True, return_dict_in_generate=True)
    return out.sequences[0, len(prompt):].tolist(), torch.stack(out.scores)[:, 0].float()


def test_engine_in_bf16_gives_generates_greedy_tokens():
    """Exact up to near-ties: where the two first differ, generate's top two logits must be within bf16's
    rounding of each other (two kernels may order a sum differently), and the engine's token one of them."""
    model, tokenizer = random_llm("tiny", CUDA, torch.bfloat16, eos_token_id=None)  # both run to the length
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 512, (n,), generator=gen).tolist() for n in (5, 40, 17, 70)]
    expected = [greedy_generate(model, p, 24) for p in prompts]
    engine = Engine(model, tokenizer, EngineConfig(precision="bf16", shard_tokens=16, num_slabs=4))
    seqs = [engine.add_request(Sequence(p, SamplingParams(max_tokens=24, ignore_eos=True))) for p in prompts]
    while engine.step():
        pass
    engine.planner.check_pool()
    exact = 0
    for seq, (tokens, scores) in zip(seqs, expected, strict=True):
        first = next((i for i, (a, b) in enumerate(zip(seq.output_ids, tokens, strict=True)) if a != b), None)
        if first is None:
            exact += 1
            continue
        top2 = scores[first].topk(2)
        assert float(top2.values[0] - top2.values[1]) <= 2 ** -7 * float(top2.values[0].abs()) + 1e-3
        assert seq.output_ids[first] in top2.indices.tolist()
    assert exact >= len(prompts) // 2


def test_engine_moves_a_cpu_model_to_cuda_in_bf16():
    model, tokenizer = random_llm("tiny")
    engine = Engine(model, tokenizer, EngineConfig(device="cuda", precision=None, num_slabs=2))
    assert engine.runner.kv.is_cuda and next(model.parameters()).dtype == torch.bfloat16
    seq = engine.add_request(Sequence([5, 6, 7], SamplingParams(max_tokens=4, ignore_eos=True)))
    while engine.step():
        pass
    assert len(seq.output_ids) == 4


def test_fp8_kv_logits_on_the_device_within_the_stated_tolerance():
    model, _ = random_llm("tiny", CUDA, torch.bfloat16)
    prompts = [list(range(3, 3 + n)) for n in (5, 40, 17)]

    def logits(kv_dtype: str) -> torch.Tensor:
        runner = ModelRunner(model, EngineConfig(precision="bf16", num_slabs=4, kv_dtype=kv_dtype))
        seqs = [Sequence(list(p), SamplingParams()) for p in prompts]
        for i, s in enumerate(seqs):
            s.pages = [1 + 4 * i + j for j in range(4)]
        return runner.run(StepPlan([Chunk(s, 0, len(s.prompt_ids)) for s in seqs]))

    ref, got = logits("bf16"), logits("fp8_e4m3")
    assert float((got - ref).abs().max() / ref.std()) < 0.1
