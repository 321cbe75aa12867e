"""The roofline against published step times it was not fitted on: LMDeploy's Llama-2-13B on one A100-80G.

Source: InternLM/lmdeploy, docs/en/benchmark/a100_fp16.md at commit ebe90bc94 ("Report the inference
benchmark of models with different size", TurboMind v0.2.0, fp16, tp 1): the static inference table, each
row a batch of equal requests; the per-token latency percentiles are decode steps, and "FTL" (min) is the
first request's first token: its prompt's step, and for a prompt of more than one token one decode step
more (the table's 1-token prompts take 18-21 ms, one step; its 128-token prompts 39-46 ms, two). Rows whose
batch cannot hold its context in the A100's KV cache (64 x 2,176 tokens = 114 GB) are left out: TurboMind
ran them in waves, which is not one step's time.
"""

from scheduler.sim import DEVICES, DTYPES, Efficiency, Roofline, StepShape
from voicepipe.simulate.costs import model_shape

# (batch, prompt tokens, output tokens, FTL min s, per-token p50 s), fp16, A100-80G, Llama-2-13B
LMDEPLOY_13B_A100 = [
    (1, 1, 128, 0.018, 0.017), (1, 128, 128, 0.039, 0.017), (1, 128, 2048, 0.040, 0.018),
    (1, 2048, 128, 0.242, 0.019), (1, 2048, 2048, 0.240, 0.019),
    (16, 1, 128, 0.019, 0.018), (16, 128, 128, 0.041, 0.019), (16, 128, 2048, 0.041, 0.026),
    (16, 2048, 128, 0.245, 0.033), (32, 1, 128, 0.021, 0.019), (32, 128, 128, 0.040, 0.021),
    (32, 128, 2048, 0.041, 0.034), (64, 1, 128, 0.025, 0.020), (64, 128, 128, 0.046, 0.024),
]


def decode_step(batch: int, context: int) -> StepShape:
    """A step of `batch` decodes, each at position `context` (its cache holds `context` tokens)."""
    return StepShape(batch, batch, batch, batch, 0, batch * (context + 1), batch * (context + 1))


def prefill_step(tokens: int) -> StepShape:
    """One prompt, whole, in one step."""
    return StepShape(tokens, 1, 1, 0, tokens, tokens * (tokens + 1) // 2, tokens)


def compare(efficiency: Efficiency | None = None) -> list[dict]:
    """Each row: LMDeploy's first-token time and median decode step next to the roofline's. The decode step
    is priced at the middle of the output (the p50 step's context)."""
    roofline = Roofline(model_shape("llama-2-13b"), DEVICES["a100-80g"], DTYPES["fp16"], efficiency)
    rows = []
    for batch, prompt, output, ftl, per_token in LMDEPLOY_13B_A100:
        first = roofline.step_seconds(prefill_step(prompt))
        if prompt > 1:
            first += roofline.step_seconds(decode_step(1, prompt))
        step = roofline.step_seconds(decode_step(batch, prompt + output // 2))
        rows.append({"batch": batch, "prompt": prompt, "output": output, "ftl_s": ftl, "ftl_roofline_s": first,
                     "ftl_error": first / ftl - 1, "decode_s": per_token, "decode_roofline_s": step,
                     "decode_error": step / per_token - 1})
    return rows


def print_comparison(rows: list[dict]) -> None:
    print("Llama-2-13B fp16 on one A100-80G: LMDeploy's published step times (TurboMind v0.2.0) vs the roofline")
    print(f"{'batch':>5} {'prompt':>6} {'output':>6} {'first tok':>10} {'roofline':>9} {'diff':>6} "
          f"{'decode':>8} {'roofline':>9} {'diff':>6}")
    for r in rows:
        print(f"{r['batch']:5d} {r['prompt']:6d} {r['output']:6d} {1e3 * r['ftl_s']:8.0f}ms "
              f"{1e3 * r['ftl_roofline_s']:7.0f}ms {r['ftl_error']:+6.0%} {1e3 * r['decode_s']:6.0f}ms "
              f"{1e3 * r['decode_roofline_s']:7.1f}ms {r['decode_error']:+6.0%}")
