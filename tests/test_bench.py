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
