"""The device check's summary: its engine benchmarks and the KV pool's capacity, next to the GPU targets.

Targets (one H200-class GPU, mixed workload, 13B shape): o4 at least 3x static batching's throughput and at
most 0.6x its p99 latency; batch-1 decode within 1.5x of the memory-bandwidth limit; fp8 KV holding at
least 1.9x bf16's tokens in the same bytes. Run as `python -m voicepipe.bench.device_summary DIR`.
"""

import json
import sys
from pathlib import Path

from voicepipe.bench.shapes import SHAPES


def fp8_capacity_ratio(shape: str, slab_bytes: int = 2 * 1024 * 1024, page_tokens: int = 16) -> float:
    """Tokens an fp8 pool holds over those a bf16 pool holds, in the same bytes, for a named shape."""
    import torch

    from scheduler.model.kv_dtype import pages_per_slab

    dims = SHAPES[shape]
    head_dim = dims.get("head_dim") or dims["hidden_size"] // dims["num_attention_heads"]
    pages = {dtype: pages_per_slab(slab_bytes, page_tokens, dims["num_key_value_heads"], head_dim, dtype)
             for dtype in (torch.bfloat16, torch.float8_e4m3fn)}
    return pages[torch.float8_e4m3fn] / pages[torch.bfloat16]


def check(name: str, value: float | None, target: str, ok: bool | None) -> str:
    shown = "-" if value is None else f"{value:.2f}"
    verdict = "not measured" if ok is None else "met" if ok else "missed"
    return f"| {name} | {shown} | {target} | {verdict} |"


def summarize(folder: Path) -> str:
    """Markdown: one table of modes per benchmark JSON in `folder` (bench-SHAPE.json), then the targets."""
    lines = ["# Device check", ""]
    reports = {p.stem.removeprefix("bench-"): json.loads(p.read_text()) for p in sorted(folder.glob("bench-*.json"))}
    for shape, report in reports.items():
        m = report["machine"]
        lines += [f"## {shape}: {report.get('model')}, {report['engine']['precision']} weights, "
                  f"KV {report['engine']['kv_dtype']}, on {m.get('gpu', m['device'])}", "",
                  "| mode | tok/s | TTFT p50 s | TTFT p99 s | latency p50 s | latency p99 s |",
                  "|---|---|---|---|---|---|"]
        for mode, r in report["modes"].items():
            lines.append(f"| {mode} | {r['throughput_tok_s']:.1f} | {r['ttft_p50_s']:.3f} | {r['ttft_p99_s']:.3f} | "
                         f"{r['latency_p50_s']:.3f} | {r['latency_p99_s']:.3f} |")
        roof = report.get("roofline", {})
        if roof:
            lines += ["", f"batch-1 decode {roof['batch1_decode_tok_s']:.1f} tok/s, bandwidth limit "
                          f"{roof['limit_tok_s']:.1f} tok/s ({roof['bandwidth_gb_s']:.0f} GB/s): "
                          f"{roof['ratio_of_limit']:.2f} of the limit"]
        lines.append("")
    big = reports.get("13b", {})
    ratios, roof = big.get("ratios", {}), big.get("roofline", {})
    throughput, p99 = ratios.get("o4_vs_static_throughput"), ratios.get("o4_vs_static_latency_p99")
    roof_ratio = roof.get("ratio_of_limit")
    fp8 = fp8_capacity_ratio("13b")
    lines += ["## Targets (13B shape)", "", "| figure | value | target | |", "|---|---|---|---|",
              check("o4 / static throughput", throughput, ">= 3", None if throughput is None else throughput >= 3),
              check("o4 / static p99 latency", p99, "<= 0.6", None if p99 is None else p99 <= 0.6),
              check("batch-1 decode / bandwidth limit", roof_ratio, ">= 0.67 (within 1.5x)",
                    None if roof_ratio is None else roof_ratio >= 1 / 1.5),
              check("fp8 / bf16 KV tokens, same bytes", fp8, ">= 1.9", fp8 >= 1.9), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    folder = Path(sys.argv[1])
    text = summarize(folder)
    (folder / "summary.md").write_text(text)
    print(text)
