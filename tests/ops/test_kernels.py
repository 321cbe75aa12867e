"""Paged attention: the reference against a naive loop, the Triton kernel (interpreted) against the reference.

Layouts are random: pages are a random permutation of the pool, unused block-table slots are -1, and every
cache slot no sequence owns (spare pages, page tails past kv_len) holds NaN, so reading one shows up.
"""

import sys

import pytest
import torch
from support.interpreted import interpreted_outputs
from support.kernel_cases import Case, make_case, random_lengths

from kernels import paged_attention_reference, write_kv


def naive_attention(case: Case) -> torch.Tensor:
    """Per sequence and head: gather keys position by position, dense causal softmax in float64."""
    n_heads, page_tokens, n_kv = case.q.shape[1], case.k_cache.shape[1], case.k_cache.shape[2]
    group = n_heads // n_kv
    outs = []
    for s in range(case.kv_lens.shape[0]):
        q_lo, q_hi, kv_len = int(case.cu_q_lens[s]), int(case.cu_q_lens[s + 1]), int(case.kv_lens[s])
        pages = [int(case.block_tables[s, pos // page_tokens]) for pos in range(kv_len)]
        slots = [pos % page_tokens for pos in range(kv_len)]
        keys = case.k_cache[pages, slots].double()  # [kv_len, Hkv, D]
        values = case.v_cache[pages, slots].double()
        q = case.q[q_lo:q_hi].double()
        q_len = q_hi - q_lo
        causal = torch.arange(kv_len)[None, :] <= (kv_len - q_len + torch.arange(q_len))[:, None]
        out = torch.empty(q_len, n_heads, q.shape[-1], dtype=torch.float64)
        for h in range(n_heads):
            scores = (q[:, h] @ keys[:, h // group].T) * case.scale
            probs = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
            out[:, h] = probs @ values[:, h // group]
        outs.append(out)
    return torch.cat(outs).float()


# -- the reference ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["decode", "prefill", "mixed"])
@pytest.mark.parametrize("page_tokens", [16, 32])
@pytest.mark.parametrize(("n_heads", "n_kv", "head_dim"), [(9, 3, 64), (4, 4, 32), (8, 2, 128)])
def test_reference_matches_naive_loop(kind: str, page_tokens: int, n_heads: int, n_kv: int, head_dim: int):
    for seed in range(2):
        q_lens, kv_lens = random_lengths(kind, n_seqs=5, seed=seed)
        case = make_case(q_lens, kv_lens, page_tokens, n_heads, n_kv, head_dim, seed=seed)
        out = paged_attention_reference(*case.args())
        assert out.shape == case.q.shape
        torch.testing.assert_close(out, naive_attention(case), rtol=1e-4, atol=1e-5)


def test_reference_padded_max_q_len_and_empty_sequence():
    """A caller-supplied max_q_len above the real one, and a sequence with no rows this step."""
    case = make_case([3, 0, 1, 17], [20, 9, 33, 17], page_tokens=16, n_heads=9, n_kv=3, head_dim=64, seed=7)
    out = paged_attention_reference(*case.args(), max_q_len=24)
    torch.testing.assert_close(out, naive_attention(case), rtol=1e-4, atol=1e-5)


# -- write_kv --------------------------------------------------------------------------------------------

def test_write_kv_puts_values_at_their_slots():
    gen = torch.Generator().manual_seed(0)
    n_pages, page_tokens, n_kv, head_dim = 6, 16, 3, 8
    k_cache = torch.zeros(n_pages, page_tokens, n_kv, head_dim)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.randperm(n_pages * page_tokens, generator=gen)[:20]
    k = torch.randn(20, n_kv, head_dim, generator=gen)
    v = torch.randn(20, n_kv, head_dim, generator=gen)
    write_kv(k_cache, v_cache, k, v, slots)
    for i, slot in enumerate(slots.tolist()):
        assert torch.equal(k_cache[slot // page_tokens, slot % page_tokens], k[i])
        assert torch.equal(v_cache[slot // page_tokens, slot % page_tokens], v[i])
    untouched = torch.ones(n_pages * page_tokens, dtype=torch.bool)
    untouched[slots] = False
    assert not k_cache.view(-1, n_kv, head_dim)[untouched].any()
    assert not v_cache.view(-1, n_kv, head_dim)[untouched].any()


# -- the Triton kernel, interpreted on the CPU -----------------------------------------------------------
#
# Triton picks interpreter or compiler when `@triton.jit` runs, and its own library functions (tl.zeros...)
# are decorated when triton is first imported, so TRITON_INTERPRET=1 must be set before that import. It
# cannot be switched on inside this session without turning every later Triton kernel (GPU tests included)
# into interpreted ones, so the kernel runs in one child process that computes every case below; each test
# then compares its output with the reference here.

def _triton_cases() -> dict[str, dict]:
    cases = {}
    for kind in ("decode", "prefill", "mixed"):
        for page_tokens in (16, 32):
            for n_heads, n_kv in ((9, 3), (4, 4)):
                lengths = random_lengths(kind, n_seqs=4, seed=page_tokens + n_heads)
                cases[f"{kind}-page{page_tokens}-h{n_heads}kv{n_kv}"] = dict(
                    lengths=lengths, page_tokens=page_tokens, n_heads=n_heads, n_kv=n_kv, head_dim=64, seed=1)
    for head_dim in (32, 128):
        cases[f"mixed-dim{head_dim}"] = dict(lengths=random_lengths("mixed", n_seqs=3, seed=head_dim),
                                            page_tokens=16, n_heads=8, n_kv=2, head_dim=head_dim, seed=2)
    # An empty sequence, a shard ending on a page boundary, a one-token prompt; then a lone long prompt.
    cases["edges"] = dict(lengths=([5, 0, 32, 1, 1], [21, 4, 64, 1, 40]), page_tokens=16, n_heads=9, n_kv=3,
                          head_dim=64, seed=3)
    cases["single-prompt"] = dict(lengths=([70], [70]), page_tokens=32, n_heads=9, n_kv=3, head_dim=64, seed=4)
    # The model hands over q as a transposed [H, T, D] view.
    cases["strided-q"] = dict(lengths=([1, 12, 1], [30, 40, 7]), page_tokens=16, n_heads=9, n_kv=3,
                              head_dim=64, seed=5, strided=True)
    return cases


TRITON_CASES = _triton_cases()


def build_triton_case(spec: dict) -> Case:
    q_lens, kv_lens = spec["lengths"]
    case = make_case(list(q_lens), list(kv_lens), spec["page_tokens"], spec["n_heads"], spec["n_kv"],
                     spec["head_dim"], seed=spec["seed"])
    if spec.get("strided"):
        case.q = case.q.transpose(0, 1).contiguous().transpose(0, 1)
    return case


def _interpreted_worker(out_path: str) -> None:
    """Child process: run every case through the interpreted kernel, saving outputs or error texts."""
    import traceback

    from triton.runtime.interpreter import InterpretedFunction

    from kernels import triton_paged

    assert isinstance(triton_paged._paged_attention_kernel, InterpretedFunction), "TRITON_INTERPRET not seen"
    results: dict[str, torch.Tensor | str] = {}
    for name, spec in TRITON_CASES.items():
        try:
            results[name] = triton_paged.paged_attention_triton(*build_triton_case(spec).args())
        except Exception:  # each test reports its own failure
            results[name] = traceback.format_exc()
    torch.save(results, out_path)


@pytest.fixture(scope="module")
def triton_outputs(tmp_path_factory) -> dict:
    return interpreted_outputs(__file__, tmp_path_factory.mktemp("triton"))


@pytest.mark.parametrize("name", list(TRITON_CASES))
def test_triton_matches_reference(triton_outputs: dict, name: str):
    out = triton_outputs[name]
    if isinstance(out, str):
        pytest.fail(f"interpreted kernel raised:\n{out}")
    case = build_triton_case(TRITON_CASES[name])
    assert out.shape == case.q.shape and out.dtype == case.q.dtype
    torch.testing.assert_close(out, paged_attention_reference(*case.args()), rtol=1e-4, atol=2e-5)


if __name__ == "__main__":
    _interpreted_worker(sys.argv[1])
