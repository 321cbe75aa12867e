"""`voicepipe simulate seed`: the seed article's experiment on simulated GPUs, and what its claim would need.

The article: Llama-2-13B INT8, inputs uniform over 128-2,048 tokens, 200 requests/s for 30 minutes; 3,220
req/s for O4 against 1,050 for a fixed batch of 32 (3.07x), P99 1.8 s against 3.1 s (-41%). Here, on an
A100-80G and an H100 priced by the roofline:
- capacity: each policy past saturation, its completions per second once the queue is long (the run stops
  when the queue is seen to grow without bound); at 200 req/s every policy is past saturation, so this is
  what the article's throughput figures can only be;
- a rate sweep up to and past saturation, with goodput: the highest rate at which >= 90% of requests meet
  the latency objective (TTFT <= 2 s and TPOT <= 100 ms, this project's choice for a chat API);
- the o4/static ratios with their uncertainty (the efficiency band, three workload seeds), the P99s at a
  rate both policies sustain, and the arithmetic of 3,220 req/s;
- voice at GPU scale: how many calls one H100 holds with >= 99% of turns on time beside that text traffic.
"""

import logging
from dataclasses import replace

from scheduler.policies import POLICIES
from scheduler.sim import Efficiency
from voicepipe.simulate.calls import CallLoad
from voicepipe.simulate.costs import model_shape, priced
from voicepipe.simulate.run import Scenario, simulate
from voicepipe.simulate.text import SEED

log = logging.getLogger(__name__)
KNOBS = {"max_batch_tokens": 4096, "max_batch_seqs": 256}  # the article's scheduler sketch's budgets
ENGINE = {"static_batch_size": 32}  # its baseline: a fixed batch of 32
SLO = (2.0, 0.1)
# o4 by tokens: its token shares (64 and 32 prompt tokens a step while calls are live) are sized for this
# CPU, where 64 tokens take over a tenth of a second; on an H100 1,024 take ~10 ms, hence the hand-sized
# GPU shares. By time (o4 as it is) the same step seconds fit both.
BY_TOKENS = {"time_shares": False}
# The price of a GPU's run over several calls' final passes or sentences, across the band it is assumed in
# (voicepipe.simulate.costs.GPU_BATCH), and without batching.
BATCH_BAND = {"one job a run": {"batch": 1}, "a further job 0.1 of the dearest": {"batch_extra": 0.1},
              "0.25 (the default)": {"batch_extra": 0.25}, "0.5": {"batch_extra": 0.5}}
GPU_TOKENS = {**BY_TOKENS, "live_prefill_tokens": 1024, "realtime_prefill_tokens": 512}


def scenario(policy: str, rate: float, duration_s: float, seed: int = 0, max_wait_s: float = 30.0,
             **changes) -> Scenario:
    engine = {**ENGINE, **changes.pop("engine", {})}
    return Scenario(policy, KNOBS, replace(SEED, rate=rate, duration_s=duration_s, seed=seed), engine=engine,
                    slo=SLO, max_wait_s=max_wait_s, name=policy, **changes)


def capacity(device: str, policy: str, efficiency: Efficiency | None = None, seed: int = 0,
             duration_s: float = 90.0) -> dict:
    """Completions per second of a policy kept past saturation (offered 3x what an A100 or H100 can serve)."""
    rate = {"a100-80g": 15.0, "h100": 30.0, "h200": 40.0}[device]
    report = simulate(scenario(policy, rate, duration_s, seed), priced(device, "llama-2-13b", "int8", efficiency))
    text = report["text"]
    return {"policy": policy, "offered_per_s": rate, "requests_per_s": text["steady_requests_per_s"],
            "tok_s": text["steady_tok_s"], "stopped": report["saturated"], "simulated_s": report["duration_s"],
            "wall_s": report["wall_s"]}


def sweep(device: str, rates: list[float], duration_s: float) -> list[dict]:
    rows = []
    target = priced(device, "llama-2-13b", "int8")
    for rate in rates:
        for policy in POLICIES:
            report = simulate(scenario(policy, rate, duration_s), target)
            t = report["text"]
            rows.append({"rate": rate, "policy": policy, "requests_per_s": t["requests_per_s"],
                         "tok_s": t["throughput_tok_s"], "ttft_p50_s": t["ttft_p50_s"], "ttft_p99_s": t["ttft_p99_s"],
                         "tpot_p99_s": t["tpot_p99_s"], "e2e_p99_s": t["latency_p99_s"],
                         "within_slo": t["within_slo"], "saturated": report["saturated"] is not None,
                         "steps": report["steps"], "wall_s": report["wall_s"]})
            log.info("%s %s %.1f/s: %.2f req/s, in SLO %.0f%%", device, policy, rate, t["requests_per_s"],
                     100 * t["within_slo"])
    return rows


def goodput(rows: list[dict], policy: str) -> float:
    """The highest swept rate at which >= 90% of requests met the objective (0 if none did)."""
    good = [r["rate"] for r in rows if r["policy"] == policy and r["within_slo"] >= 0.9 and not r["saturated"]]
    return max(good, default=0.0)


def arithmetic() -> dict:
    """What the article's 3,220 req/s would take: the FLOPs of its mean request, against the peaks."""
    shape = model_shape("llama-2-13b")
    prompt = sum(SEED.prompt_tokens) / 2
    output = sum(SEED.output_tokens) / 2
    prefill = 2 * prompt * shape.linear_params + 4 * shape.layers * shape.heads * shape.head_dim * prompt ** 2 / 2
    decode = 2 * output * (shape.linear_params + shape.head_params)
    per_request = prefill + decode
    need = 3220 * per_request
    return {"mean_prompt_tokens": prompt, "mean_output_tokens": output, "prefill_tflop": prefill / 1e12,
            "request_tflop": per_request / 1e12, "pflop_s_for_3220": need / 1e15,
            "prefill_pflop_s_for_3220": 3220 * prefill / 1e15, "prefill_h100_int8_peaks": 3220 * prefill / 1979e12,
            "h100_int8_peaks": need / 1979e12, "a100_int8_peaks": need / 624e12,
            "offered_at_200_per_s_pflop_s": 200 * per_request / 1e15}


def voice_policies() -> list[tuple[str, str, dict]]:
    """(row name, policy, engine changes) of the voice rows: every policy as it is (o4's shares by time), o4
    with its shares by tokens as sized for this CPU and as sized by hand for a GPU, and o4 with its ASR and
    TTS jobs on a second stream beside the model's steps (the job lane)."""
    return [*((name, name, {}) for name in POLICIES), ("o4-tokens", "o4", BY_TOKENS),
            ("o4-gpu-tokens", "o4", GPU_TOKENS), ("o4-lane", "o4", {"job_threads": 1})]


def voice(device: str, text_rate: float, calls_grid: list[int], duration_s: float, turns: int,
          jobs: dict | None = None, policies: list[tuple[str, str, dict]] | None = None) -> list[dict]:
    """Calls beside the seed's text traffic at `text_rate`, per policy (o4 as it is, and sized for a GPU);
    `jobs` changes the device's job prices (`JobPrices` fields)."""
    target = priced(device, "llama-2-13b", "int8")
    target.jobs = replace(target.jobs, **(jobs or {}))
    rows = []
    for calls in calls_grid:
        for name, policy, engine in policies or voice_policies():
            s = scenario(policy, text_rate, duration_s, calls=CallLoad(calls=calls, turns=turns), engine=engine)
            report = simulate(s, target)
            c, t = report["calls"], report["text"]
            rows.append({"calls": calls, "policy": name, "on_time_rate": c["on_time_rate"], "turns": c["turns"],
                         "ttfa_p50_s": c["ttfa_p50_s"], "ttfa_p99_s": c["ttfa_p99_s"],
                         "text_req_s": t["requests_per_s"],
                         "text_ttft_p99_s": t["ttft_p99_s"], "text_within_slo": t["within_slo"],
                         "saturated": report["saturated"] is not None, "wall_s": report["wall_s"]})
            log.info("%d calls %s: %.1f%% on time", calls, name, 100 * c["on_time_rate"])
    return rows


def most_calls(rows: list[dict], policy: str, share: float = 0.99) -> int:
    ok = [r["calls"] for r in rows if r["policy"] == policy and r["on_time_rate"] >= share and not r["saturated"]]
    return max(ok, default=0)


def experiment(quick: bool = False) -> dict:
    report: dict = {"slo": {"ttft_s": SLO[0], "tpot_s": SLO[1]}, "knobs": KNOBS, "engine": ENGINE,
                    "workload": SEED.describe(), "arithmetic": arithmetic(), "devices": {}}
    duration = 60.0 if quick else 120.0
    for device in ("a100-80g", "h100"):
        caps = {p: capacity(device, p, duration_s=60.0 if quick else 90.0) for p in POLICIES}
        top = caps["o4"]["requests_per_s"]
        fractions = (0.25, 0.5, 0.75, 1.0, 1.25) if quick else (0.2, 0.4, 0.6, 0.8, 0.9, 1.0, 1.2)
        rows = sweep(device, [round(f * top, 2) for f in fractions], duration)
        seeds = (0,) if quick else (0, 1, 2)
        bands = {} if quick else {k: {p: capacity(device, p, e, duration_s=60.0)["requests_per_s"]
                                      for p in ("static", "o4")} for k, e in Efficiency.band().items()}
        by_seed = [capacity(device, "o4", seed=s)["requests_per_s"]
                   / capacity(device, "static", seed=s)["requests_per_s"] for s in seeds]
        report["devices"][device] = {"capacity": caps, "sweep": rows,
                                     "goodput_per_s": {p: goodput(rows, p) for p in POLICIES},
                                     "ratio_o4_static": caps["o4"]["requests_per_s"] / caps["static"]["requests_per_s"],
                                     "ratio_by_seed": by_seed, "capacity_by_efficiency": bands,
                                     "p99_where_static_keeps_up": p99_comparison(rows)}
    h100 = report["devices"]["h100"]["capacity"]["o4"]["requests_per_s"]
    grid = [4, 16, 32] if quick else [8, 16, 24, 32, 40, 48, 64, 72]
    report["voice"] = {"device": "h100", "text_rate_per_s": round(0.5 * h100, 2),
                       "rows": voice("h100", round(0.5 * h100, 2), grid, 40.0 if quick else 90.0, 3 if quick else 4)}
    report["voice"]["most_calls"] = {name: most_calls(report["voice"]["rows"], name) for name, _, _ in voice_policies()}
    if not quick:  # a batch's price is assumed: the calls the lane holds across its band
        lane = [p for p in voice_policies() if p[0] == "o4-lane"]
        report["voice"]["lane_by_batch"] = {
            label: most_calls(voice("h100", round(0.5 * h100, 2), [32, 40, 48, 64, 72, 80, 96], 90.0, 4,
                                 jobs, lane), "o4-lane")
            for label, jobs in BATCH_BAND.items()}
    return report


def p99_comparison(rows: list[dict]) -> dict:
    """o4 and static at the highest swept rate static sustains (not saturated, 90% in SLO or not)."""
    static_ok = [r["rate"] for r in rows if r["policy"] == "static" and not r["saturated"]]
    if not static_ok:
        return {}
    rate = max(static_ok)
    pick = {r["policy"]: r for r in rows if r["rate"] == rate}
    return {"rate": rate, **{f"{p}_e2e_p99_s": pick[p]["e2e_p99_s"] for p in pick},
            **{f"{p}_ttft_p99_s": pick[p]["ttft_p99_s"] for p in pick},
            "o4_vs_static_e2e_p99": pick["o4"]["e2e_p99_s"] / pick["static"]["e2e_p99_s"] - 1}


def print_experiment(report: dict) -> None:
    a = report["arithmetic"]
    print(f"\nThe seed's workload: prompts {SEED.prompt_tokens}, outputs {SEED.output_tokens} tokens; a mean request "
          f"is {a['request_tflop']:.1f} TFLOP (its prefill {a['prefill_tflop']:.1f}).")
    print(f"3,220 req/s would need {a['prefill_pflop_s_for_3220']:.0f} PFLOP/s for the prompts alone "
          f"({a['prefill_h100_int8_peaks']:.0f}x an H100's INT8 peak), {a['pflop_s_for_3220']:.0f} PFLOP/s with the "
          f"outputs ({a['h100_int8_peaks']:.0f}x an H100's, {a['a100_int8_peaks']:.0f}x an A100's INT8 peak); and "
          f"at 200 req/s offered no server completes more than 200 req/s: 3,220 is 16x what was sent.")
    for device, d in report["devices"].items():
        print(f"\n{device}, Llama-2-13B W8A8, max_batch_tokens {KNOBS['max_batch_tokens']}, max_batch_seqs "
              f"{KNOBS['max_batch_seqs']}, static batch {ENGINE['static_batch_size']}")
        for p, c in d["capacity"].items():
            print(f"  capacity {p:7}{c['requests_per_s']:7.2f} req/s {c['tok_s']:8.0f} tok/s  (offered "
                  f"{c['offered_per_s']:.0f}/s, stopped at {c['simulated_s']:.0f} s: the queue grew without bound)")
        ratios = d["ratio_by_seed"]
        print(f"  o4/static throughput at saturation: {d['ratio_o4_static']:.2f} (workload seeds: "
              f"{', '.join(f'{r:.2f}' for r in ratios)}; the article: 3.07)")
        for band, caps in d["capacity_by_efficiency"].items():
            print(f"    efficiency {band:8} static {caps['static']:.2f}, o4 {caps['o4']:.2f} req/s, "
                  f"ratio {caps['o4'] / caps['static']:.2f}")
        print(f"  goodput (>= 90% within TTFT {report['slo']['ttft_s']} s, TPOT {report['slo']['tpot_s']} s): "
              + ", ".join(f"{p} {g:.2f}/s" for p, g in d["goodput_per_s"].items()))
        print(f"  {'rate':>6} {'policy':7} {'req/s':>6} {'TTFT p99':>9} {'TPOT p99':>9} {'E2E p99':>8} {'in SLO':>7}")
        for r in d["sweep"]:
            print(f"  {r['rate']:6.2f} {r['policy']:7} {r['requests_per_s']:6.2f} {r['ttft_p99_s']:9.2f} "
                  f"{r['tpot_p99_s']:9.3f} {r['e2e_p99_s']:8.1f} {r['within_slo']:7.0%}"
                  + ("  saturated" if r["saturated"] else ""))
        p99 = d["p99_where_static_keeps_up"]
        if p99:
            print(f"  at {p99['rate']:.2f}/s (static keeps up): E2E p99 static {p99['static_e2e_p99_s']:.1f} s, o4 "
                  f"{p99['o4_e2e_p99_s']:.1f} s ({p99['o4_vs_static_e2e_p99']:+.0%}; the article: -41%)")
    v = report["voice"]
    print(f"\nvoice on one H100 beside {v['text_rate_per_s']}/s of the seed's text traffic: calls held with >= 99% "
          "of turns on time: " + ", ".join(f"{p} {n}" for p, n in v["most_calls"].items()))
    for label, calls in v.get("lane_by_batch", {}).items():
        print(f"  o4-lane with its jobs batched across calls, {label}: {calls} calls")
    for r in v["rows"]:
        print(f"  {r['calls']:4d} calls {r['policy']:12} on time {r['on_time_rate']:6.1%}  TTFA p50 "
              f"{r['ttfa_p50_s']:.2f} s p99 {r['ttfa_p99_s']:.2f} s  text {r['text_req_s']:.2f} req/s, TTFT p99 "
              f"{r['text_ttft_p99_s']:.2f} s")
    print("\nAll GPU figures are a model's (the roofline, no GPU measured): read them +-25%; docs/simulator.md.")

