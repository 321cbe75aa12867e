"""The benchmark commands run end to end and report what they promise (their figures are not judged here)."""

import json
import subprocess
import sys


def test_bench_calls_reports_turns_of_a_real_call(tmp_path):
    out = tmp_path / "calls.json"
    run = subprocess.run([sys.executable, "-m", "voicepipe", "bench", "calls", "--calls", "1", "--turns", "1",
                          "--policies", "o4", "--deadline", "30", "--json", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(out.read_text())
    level = report["policies"]["o4"]["levels"][0]
    assert level["calls"] == 1 and level["turns"] == 1
    assert 0 < level["ttfa_p50_s"] < 30 and level["deadline_hit_rate"] == 1.0
    assert report["policies"]["o4"]["max_calls_within_deadline"] == 1
    assert "holds 1 calls" in run.stdout


def test_hf_static_counts_each_request_done_at_its_own_length(llm):
    from voicepipe.bench.engine_modes import run_hf_static
    from voicepipe.bench.workload import Workload

    model, tokenizer = llm
    items = Workload(requests=3, prompt_tokens=(20, 40), output_tokens=(2, 6)).items(tokenizer)
    result = run_hf_static(model, tokenizer, items, batch_size=2)
    assert result["tokens"] == sum(w.max_tokens for w in items)
    assert 0 < result["ttft_p50_s"] <= result["latency_p50_s"] <= result["latency_p99_s"] <= result["makespan_s"]


def test_calls_are_timed_from_the_last_speech_sample_not_the_trailing_silence():
    import numpy as np

    from voicepipe.bench.calls import last_voiced

    tone = 0.5 * np.sin(np.arange(8000) / 5.0).astype(np.float32)
    clip = np.concatenate([np.zeros(4800, np.float32), tone, np.zeros(4800, np.float32)])
    assert 4800 + 7990 <= last_voiced(clip) < 4800 + 8000
