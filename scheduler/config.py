"""The engine's settings in one place: the two knobs and everything a user may tune."""

from dataclasses import dataclass
from typing import Literal

# The two knobs a running engine's users may turn, and the values they may take.
KNOBS = {"max_batch_tokens": (1, 8192), "max_batch_seqs": (1, 1024)}


def check_knobs(knobs: dict) -> None:
    """ValueError unless every name is a knob and every value an integer in its range."""
    for name, value in knobs.items():
        if name not in KNOBS:
            raise ValueError(f"unknown knob {name!r}; knobs are {', '.join(KNOBS)}")
        lo, hi = KNOBS[name]
        if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
            raise ValueError(f"{name} must be an integer in [{lo}, {hi}]")


DEFAULT_POLICY = "o4"  # the scheduling policy an engine runs unless told (`scheduler.policies`)
Precision = Literal["fp32", "bf16", "fp16", "int8", "int4"]
Runner = Literal["lean", "transformers"]
KVDtype = Literal["auto", "fp32", "fp16", "bf16", "fp8_e4m3"]


@dataclass(slots=True)
class EngineConfig:
    # The two knobs: how many tokens and how many sequences one model step may carry.
    max_batch_tokens: int = 256
    max_batch_seqs: int = 32
    # Scheduling policy: a name in `scheduler.policies.POLICIES` (o4, the default: classes, deadlines, pacing).
    policy: str = DEFAULT_POLICY
    shard_tokens: int = 64
    # While a realtime request's deadline is within two pressing windows, the prefill tokens a step may
    # carry for other requests (o4): short steps keep a reply's decodes quick when long prompts wait (a
    # waiting prompt that ages to the realtime class is no longer held back, so it cannot starve).
    realtime_prefill_tokens: int = 32
    # While calls are live (`Engine.open_session`), the prefill tokens a step may carry for other requests
    # (o4): a turn's first work waits for the step in flight, so that step must be short.
    live_prefill_tokens: int = 64
    # While a caller may be finishing (a hint, `Engine.expect`: from their first silence until the turn's
    # first audio), each step carries at most this much other work (o4): the end-of-turn pass, the
    # decision and the reply's first steps then wait behind a short step, not a wide one.
    expect_prefill_tokens: int = 16
    expect_background_seqs: int = 8
    # Shares by time: while one of those rules holds, what a step carries besides realtime replies is bounded
    # by the step's predicted duration (the engine's cost model, fitted online to its own steps, `step_cost`),
    # so one rule fits a CPU and a GPU alike; the knobs cap it, and `expect_background_seqs` still caps the
    # other sequences while a caller may be finishing. The token shares above stand in until the
    # model has seen enough steps, and wherever `time_shares` is off. The defaults are what those token
    # shares came to beside a few decodes on a 2-core CPU (docs/engine.md, "Shares by time").
    time_shares: bool = True
    live_step_s: float = 0.125
    deadline_near_step_s: float = 0.075
    expect_step_s: float = 0.045
    static_batch_size: int = 8
    # Model forward: "lean" (our own Llama-family modules, less host work per step; models it cannot compute
    # fall back) or "transformers" (transformers' own modules, the exactness reference).
    runner: Runner = "lean"
    # KV slab pool. A slab is `slab_bytes` of one layer's keys and values; `kv_bytes`, when set, sizes the
    # whole cache over all layers instead of `num_slabs`. The KV dtype decides how many tokens fit:
    # "auto" follows the weights, "fp8_e4m3" (per-page scales) holds about twice bf16's tokens.
    page_tokens: int = 16
    slab_bytes: int = 2 * 1024 * 1024
    num_slabs: int = 24
    kv_bytes: int | None = None
    kv_dtype: KVDtype = "auto"
    reserve_frac: float = 0.08
    compact_threshold: float = 0.15
    # A realtime request becomes pressing when its deadline is this close.
    pressing_window_s: float = 1.0
    # A waiting request climbs one class per aging_s of waiting (multi-level feedback queue).
    aging_s: float = 5.0
    # Output length predicted for admission before enough requests have finished to take a p95.
    default_output_guess: int = 64
    # Grammars (constrained decoding) compile in a worker process: one that takes longer than this, or
    # grows the worker by more than this many bytes, is abandoned and its request refused
    # (grammar_too_complex); compiled ones are kept by their text, this many and this many bytes at most.
    grammar_budget_s: float = 1.5
    grammar_memory_bytes: int = 1 << 30
    grammar_cache_entries: int = 256
    grammar_cache_bytes: int = 256 << 20
    # Weights of the model's linear layers: "fp32", "bf16" or "fp16" (the GPU's), or, CPU only, "int8" (a
    # quarter of the bytes each step reads, one scale per output channel) or "int4" (groups of 32 with a
    # scale and a minimum, times int8 activations) (scheduler.model.quantize, docs/decode.md); None: the device's
    # default (scheduler.model.device.default_precision).
    precision: Precision | None = "fp32"
    # Device jobs (ASR passes, TTS sentences): 0 runs them between model steps on the engine's thread; n >= 1
    # on a lane of their own beside the steps, their runtimes then sized to n threads (scheduler.job_lane).
    # None: 0 in an engine built directly; the server resolves it per device (voicepipe.backends.loading).
    job_threads: int | None = None
    # Where the engine keeps its step-cost fit (scheduler.step_cost.OnlineCost) across starts: read at start,
    # so steps are sized by time from the first; written as it refits (at most every `step_cost_save_s`) and
    # on close. None or "": learned afresh each start (a served engine's is set by the server, "" kept as
    # none). The path names the machine, model and precision it is for.
    step_cost_file: str | None = None
    step_cost_save_s: float = 60.0
    # Where the model and its KV cache live: "auto" (CUDA when torch sees one), "cpu", "cuda", or None to
    # leave the model where it was loaded.
    device: str | None = None
