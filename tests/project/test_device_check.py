"""scripts/device-check.sh end to end on the CPU with the tiny shape: CUDA tests skip, the benchmark and the
summary are written."""

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_device_check_runs_on_the_cpu_with_the_tiny_shape(tmp_path: Path):
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "device-check.sh")], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env=dict(os.environ, DEVICE="cpu", OUT=str(tmp_path)))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "skipped" in (tmp_path / "cuda-tests.txt").read_text()
    report = json.loads((tmp_path / "bench-tiny.json").read_text())
    assert set(report["modes"]) == {"static", "fcfs", "o4"} and report["engine"]["device"] == "cpu"
    summary = (tmp_path / "summary.md").read_text()
    assert "## tiny" in summary and "| fp8 / bf16 KV tokens, same bytes | 2.00 | >= 1.9 | met |" in summary
