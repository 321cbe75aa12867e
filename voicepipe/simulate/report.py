"""Printing a simulation's figures as the benches print theirs: one row per policy, seconds and tokens/s."""

import json
from pathlib import Path

TEXT_COLUMNS = (("throughput_tok_s", "tok/s", "{:10.1f}"), ("requests_per_s", "req/s", "{:8.2f}"),
                ("ttft_p50_s", "TTFT p50", "{:9.3f}"), ("ttft_p99_s", "p99", "{:8.3f}"),
                ("tpot_p50_s", "TPOT p50", "{:9.4f}"), ("tpot_p99_s", "p99", "{:8.4f}"),
                ("latency_p50_s", "E2E p50", "{:8.2f}"), ("latency_p99_s", "p99", "{:8.2f}"),
                ("within_slo", "in SLO", "{:7.0%}"))
STEP_COLUMNS = (("steps", "steps", "{:7d}"), ("step_p50_ms", "step p50 ms", "{:12.1f}"),
                ("decodes_per_step", "decodes", "{:8.1f}"), ("prefill_tokens_per_step", "prefill tok", "{:12.1f}"),
                ("host_p50_ms", "host ms", "{:8.1f}"))


def cells(figures: dict, columns: tuple) -> str:
    out = []
    for key, _title, fmt in columns:
        width = len(fmt.format(0 if "d}" in fmt else 0.0))
        value = figures.get(key)
        out.append(fmt.format(value) if isinstance(value, (int, float)) and value == value else f"{'-':>{width}}")
    return "".join(out)


def header(columns: tuple) -> str:
    return "".join(f"{title:>{len(fmt.format(0 if 'd}' in fmt else 0.0))}}" for _, title, fmt in columns)


def print_runs(runs: dict[str, dict], title: str) -> None:
    """One line per run: text figures, calls on time, step composition; a saturated run says so."""
    print(f"\n{title}")
    if any("text" in r for r in runs.values()):
        print(f"{'':8}" + header(TEXT_COLUMNS))
        for name, r in runs.items():
            if "text" in r:
                print(f"{name:8}" + cells(r["text"], TEXT_COLUMNS))
    if any("calls" in r for r in runs.values()):
        for name, r in runs.items():
            c = r.get("calls")
            if c:
                print(f"{name:8}calls: {c['on_time']}/{c['turns']} turns on time ({c['on_time_rate']:.1%}), "
                      f"time to first audio p50 {c['ttfa_p50_s']:.2f} s, p99 {c['ttfa_p99_s']:.2f} s, "
                      f"underruns {c['underruns']}")
    print(f"{'':8}" + header(STEP_COLUMNS))
    for name, r in runs.items():
        print(f"{name:8}" + cells(r["steps"], STEP_COLUMNS)
              + (f"  {r['duration_s']:.0f} s simulated in {r['wall_s']:.1f} s" if "wall_s" in r else ""))
    for name, r in runs.items():
        if r.get("saturated"):
            print(f"{name:8}{r['saturated']}")


def save(report: dict, path: str | Path) -> None:
    Path(path).write_text(json.dumps(report, indent=2, default=str) + "\n")
