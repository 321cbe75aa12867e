"""The runs this CPU is measured on: the calibration set the step-cost fit reads, and the validation set it
never sees (other arrival processes and rates, both knobs at two settings, the three policies, calls), and
workloads unlike the calibration in kind (bursts, long outputs, prompts chunked at a small budget, calls).

The model is SmolLM2-135M's shape with seeded random weights (`voicepipe.bench.random_weights`): a step
costs what the embedded model's would, without loading the GGUF, and every request runs to its length.
Workloads are short: the 2 cores are shared, so each run takes seconds, not minutes.
"""

from dataclasses import replace
from typing import Any

from voicepipe.simulate.calls import CallLoad
from voicepipe.simulate.costs import FITTED
from voicepipe.simulate.run import Scenario
from voicepipe.simulate.text import TextLoad

MODEL, PRECISION = FITTED  # the embedded model's shape; the fit and its validation measure int8
SHORT = TextLoad("all_at_once", requests=12, prompt_tokens=(32, 128), output_tokens=(8, 48), seed=11)

# What the fit reads: a spread of step shapes (long and short prompts, small and large decode batches).
CALIBRATION: dict[str, Scenario] = {
    "cal-mixed": Scenario("fcfs", {"max_batch_tokens": 256, "max_batch_seqs": 16},
                          TextLoad("all_at_once", requests=12, prompt_tokens=(16, 256), output_tokens=(4, 40),
                                   seed=101), max_wait_s=None),
    "cal-small-steps": Scenario("o4", {"max_batch_tokens": 48, "max_batch_seqs": 6},
                                TextLoad("all_at_once", requests=8, prompt_tokens=(24, 96), output_tokens=(16, 40),
                                         seed=102), engine={"shard_tokens": 16}, max_wait_s=None),
    "cal-prompts": Scenario("fcfs", {"max_batch_tokens": 512, "max_batch_seqs": 1},
                            TextLoad("all_at_once", requests=8, prompt_tokens=(32, 512), output_tokens=(2, 2),
                                     seed=105), max_wait_s=None),  # one prompt a step, whole: prefill alone
    "cal-wide-decode": Scenario("fcfs", {"max_batch_tokens": 512, "max_batch_seqs": 24},
                                TextLoad("all_at_once", requests=24, prompt_tokens=(8, 40), output_tokens=(24, 32),
                                         seed=103), max_wait_s=None),
}

# Measured again before each validation run: how fast the shared machine is right then (a calibration run,
# so the factor read from it is the machine's, not the validated scenario's).
PROBE = {"cal-probe": Scenario("fcfs", {"max_batch_tokens": 128, "max_batch_seqs": 8},
                               TextLoad("all_at_once", requests=6, prompt_tokens=(48, 160), output_tokens=(8, 16),
                                        seed=104), max_wait_s=None)}

# Unlike the calibration in kind, not only in seed: arrivals in bursts, outputs three to five times the
# calibration's longest, prompts of 400-600 tokens chunked at a small budget, and more calls than text.
UNLIKE = {
    "bursts": Scenario("o4", {}, TextLoad("burst", rate=1.5, duration_s=20.0, requests=18, burst_size=6,
                                          prompt_tokens=(32, 160), output_tokens=(8, 48), seed=21), max_wait_s=None),
    "fcfs-long-out": Scenario("fcfs", {}, TextLoad("poisson", rate=0.5, duration_s=16.0, requests=8,
                                                   prompt_tokens=(16, 64), output_tokens=(120, 200), seed=22),
                              max_wait_s=None),
    "long-prompts": Scenario("o4", {"max_batch_tokens": 48}, TextLoad("all_at_once", requests=4,
                                                                     prompt_tokens=(400, 600), output_tokens=(4, 12),
                                                                     seed=23), max_wait_s=None),
    "3-calls+text": Scenario("o4", {}, TextLoad("poisson", rate=0.3, duration_s=20.0, requests=6,
                                                prompt_tokens=(32, 128), output_tokens=(16, 64), seed=24),
                             calls=CallLoad(calls=3, turns=3, reply_tokens=32, question_tokens=16, sentence_tokens=8,
                                            instructions_tokens=96, seed=6), max_wait_s=None),
}

# What it is judged on: none of these workloads, seeds or settings is in the calibration set.
VALIDATION = {
    "all-at-once": Scenario("o4", {}, SHORT, max_wait_s=None),
    "poisson-1/s": Scenario("o4", {}, replace(SHORT, arrivals="poisson", rate=1.0, duration_s=30.0), max_wait_s=None),
    "poisson-3/s": Scenario("o4", {}, replace(SHORT, arrivals="poisson", rate=3.0, duration_s=30.0), max_wait_s=None),
    "tokens=64": Scenario("o4", {"max_batch_tokens": 64}, SHORT, max_wait_s=None),
    "tokens=512": Scenario("o4", {"max_batch_tokens": 512}, SHORT, max_wait_s=None),
    "seqs=3": Scenario("o4", {"max_batch_seqs": 3}, SHORT, max_wait_s=None),
    "fcfs": Scenario("fcfs", {}, SHORT, max_wait_s=None),
    "static": Scenario("static", {}, SHORT, max_wait_s=None),
    "calls+text": Scenario("o4", {}, replace(SHORT, arrivals="poisson", rate=0.5, duration_s=20.0, requests=8),
                           calls=CallLoad(calls=2, turns=3, reply_tokens=24, question_tokens=16, sentence_tokens=8,
                                          instructions_tokens=64, seed=5), max_wait_s=None),
    **UNLIKE,
}
QUICK = ("all-at-once", "poisson-3/s", "tokens=64", "static", "calls+text", *UNLIKE)


def calibration_set() -> dict[str, Scenario]:
    return {**CALIBRATION, **PROBE}


def load_model() -> tuple[Any, Any]:
    """The model, with torch on one thread: on 2 cores that others use too, two threads that wait for each
    other at every op made the same run 4-5x slower (64-70 s against 13-18 s at a load average of 5)."""
    import torch

    from voicepipe.bench.random_weights import random_llm

    torch.set_num_threads(1)
    return random_llm("default")


def engine_fields() -> dict[str, Any]:
    """The measured engine's setup besides the scenario's: the CPU, int8 weights, the default pool."""
    return {"device": "cpu", "precision": PRECISION}


def named(scenarios: dict[str, Scenario]) -> dict[str, Scenario]:
    return {name: s.with_(name=name) for name, s in scenarios.items()}
