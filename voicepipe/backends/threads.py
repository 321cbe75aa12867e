"""How torch, CTranslate2 and onnxruntime share a small CPU: one policy for every entry point.

In the engine (its own process) the model's steps and the device jobs each run one at a time, side by side on a
job lane or taking turns (`EngineConfig.job_threads`), each runtime sized to its share of the cores. What also
decides speed is what the idle threads do between jobs. torch and CTranslate2 each bring
their own GNU OpenMP runtime, whose worker threads spin for a while after each parallel region before they
sleep. Spinning is what keeps back-to-back small ops fast (a model step is hundreds of them); spinning long
after a job has ended steals a core from the next runtime's job. onnxruntime (Piper, Silero) spins unless
told not to, which `onnx_options` does.

`voicepipe bench threads` measures the policies below side by side, each in a fresh process (OpenMP reads
its environment once, when the library loads); `configure` applies one before torch or CTranslate2 load.
On the reference 2-core machine, in two runs, "short-spin" came first in both: a decode step right after
an ASR pass 54.6-56.9 ms against 59.1-62.5 ms for the defaults and 56.5-59.4 ms for "passive", ASR passes
252-261 ms against 272-276 ms and 259-278 ms, small torch ops alike (32-33 us) under all three.
"""

import os
from typing import Any

# Environment for both OpenMP runtimes. GOMP_SPINCOUNT counts spin iterations before a worker sleeps
# (300,000 by default, a few milliseconds); OMP_WAIT_POLICY=PASSIVE makes workers sleep at once.
POLICIES: dict[str, dict[str, str]] = {
    "spin": {},
    "short-spin": {"GOMP_SPINCOUNT": "20000"},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
}
DEFAULT_POLICY = "short-spin"
ENV_VAR = "VOICEPIPE_THREADS"


def configure(policy: str | None = None) -> str:
    """Apply a policy (the argument, else $VOICEPIPE_THREADS, else the default); returns its name.

    Variables the user set explicitly win. Call before torch or CTranslate2 is imported.
    """
    name = policy or os.environ.get(ENV_VAR) or DEFAULT_POLICY
    if name not in POLICIES:
        raise ValueError(f"{ENV_VAR} must be one of {', '.join(POLICIES)}, not {name!r}")
    for key, value in POLICIES[name].items():
        os.environ.setdefault(key, value)
    return name


def onnx_options(threads: int) -> Any:
    """Session options for onnxruntime: `threads` intra-op threads that sleep, never spin, when idle."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 4
    return options
