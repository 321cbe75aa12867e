"""Running a test module's Triton kernel cases under Triton's CPU interpreter, in a child process.

Why a child: TRITON_INTERPRET is read when triton first loads, and other tests have loaded it already. The
test module runs itself as a script (its `__main__` calls its worker with an output path); the child
saves its results there for the parent's tests to read.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def interpreted_outputs(module_file: str, out_dir: Path) -> dict:
    """Run `module_file` as a script under the interpreter; what its worker saved."""
    pytest.importorskip("triton", reason="triton cannot be imported; the Triton kernel is not tested")
    out_path = out_dir / "outputs.pt"
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, module_file, str(out_path)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"interpreted kernel worker failed:\n{proc.stdout}\n{proc.stderr}"
    return torch.load(out_path)
