"""`voicepipe bench decode`: where a decode step's time goes, part by part, at a fixed batch.

Every part of the step (the linear layers, norms, rotary embedding, KV writes, attention, the layers' own
glue, the runner's step metadata, sampling, the planner and the step records) is timed by wall clock, each
part's time exclusive of the parts it calls, by wrapping the engine's own objects in this process only.
The wrappers cost about a microsecond each, which the report shows as the instrumented step's time beside the
plain one. The cost of calling into torch and the C++ kernels from Python is estimated apart: the step's
calls (functions and methods of torch and of the kernels' module; tensor operators such as `+` are not
counted) times the cost of the cheapest such call, measured in the same run. Where the engine runs a decode
step's layers in one C++ call (quantized weights), the parts are timed layer by layer (the same ops, called
from Python), and the plain step is timed both ways.
"""

import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

import kernels
import scheduler.engine
import scheduler.model.llama
from kernels import decode_ops, native
from scheduler import Engine, EngineConfig, SamplingParams, Sequence

PARTS = ("linear", "norm", "rotary", "kv write", "rotary + kv write", "attention", "silu * up", "layer glue",
         "runner host", "sampling", "planning", "postprocess", "step records", "engine host")


class PartClock:
    """Exclusive wall time per part: time in a part's callees is charged to the callee's part."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._stack: list[list] = []  # [part, started, time charged to callees]

    def wrap(self, fn: Callable, part: str) -> Callable:
        def timed(*args: Any, **kwargs: Any) -> Any:
            frame = [part, time.perf_counter(), 0.0]
            self._stack.append(frame)
            try:
                return fn(*args, **kwargs)
            finally:
                self._stack.pop()
                spent = time.perf_counter() - frame[1]
                self.seconds[part] += spent - frame[2]
                if self._stack:
                    self._stack[-1][2] += spent

        return timed


def _patch(obj: Any, attr: str, clock: PartClock, part: str, undo: list) -> None:
    undo.append((obj, attr, obj.__dict__.get(attr)))
    setattr(obj, attr, clock.wrap(getattr(obj, attr), part))


def _instrument(engine: Engine, clock: PartClock) -> list:
    """Wrap every part of `engine`'s step; returns what `_restore` needs to undo it."""
    undo: list = []
    lean = engine.runner.lean
    for module in lean.modules():
        name = type(module).__name__
        if name == "RMSNorm":  # its C++ op too, called inside it
            _patch(module, "forward", clock, "norm", undo)
        elif name in ("Block", "Attention", "MLP", "LeanLlama"):
            _patch(module, "forward", clock, "layer glue", undo)
        elif hasattr(module, "in_features"):  # every kind of linear layer
            _patch(module, "forward", clock, "linear", undo)
    _patch(lean, "rotary", clock, "rotary", undo)
    for owner, attr, part in ((scheduler.model.llama, "rotate", "rotary"), (kernels, "write_kv", "kv write"),
                              (kernels, "paged_attention", "attention"),
                              (decode_ops, "rotary_write_kv", "rotary + kv write"),
                              (decode_ops, "decode_attention", "attention"), (decode_ops, "silu_mul", "silu * up"),
                              (engine.runner, "run", "runner host"),
                              (scheduler.engine, "sample_rows", "sampling"),
                              (scheduler.engine, "probe_rows", "sampling"),
                              (engine.planner, "plan", "planning"), (engine.planner, "postprocess", "postprocess"),
                              (engine.metrics, "record_step", "step records"),
                              (engine, "_model_step", "engine host")):
        _patch(owner, attr, clock, part, undo)
    return undo


def _restore(undo: list) -> None:
    for obj, attr, old in reversed(undo):
        if old is None:
            delattr(obj, attr)
        else:
            setattr(obj, attr, old)


def _calls_from_python(engine: Engine) -> int:
    """Calls one step makes from Python into torch or the kernels' module."""
    calls = 0

    def count(frame, event: str, fn) -> None:
        nonlocal calls
        if event == "c_call" and (isinstance(getattr(fn, "__self__", None), torch.Tensor)
                                  or (getattr(fn, "__module__", None) or "").startswith(("torch", native.MODULE))):
            calls += 1

    sys.setprofile(count)
    try:
        engine.step()
    finally:
        sys.setprofile(None)
    return calls


def _decoding_engine(model, tokenizer, precision: str, batch: int, context: int, steps: int) -> Engine:
    """An engine whose `batch` requests have prefilled a `context`-token prompt and decode from here on."""
    engine = Engine(model, tokenizer, EngineConfig(precision=precision, max_batch_seqs=max(batch, 1),
                                                   num_slabs=max(4, batch * (context + steps) // 256 + 2)))
    prompt = [3 + i % 200 for i in range(context)]  # any ids: a decode step's cost does not depend on them
    seqs = [engine.add_request(Sequence(prompt, SamplingParams(max_tokens=steps, ignore_eos=True)))
            for _ in range(batch)]
    while min(len(s.output_ids) for s in seqs) < 2:
        engine.step()
    return engine


def _steps_per_second(engine: Engine, steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    return steps / (time.perf_counter() - t0)


def _dispatch_cost(repeats: int = 2000) -> float:
    """Seconds of one call of the cheapest torch op from Python (an add of one-element tensors)."""
    a, b = torch.ones(1), torch.ones(1)
    for _ in range(100):
        torch.add(a, b)
    t0 = time.perf_counter()
    for _ in range(repeats):
        torch.add(a, b)
    return (time.perf_counter() - t0) / repeats


def profile_decode(model, tokenizer, precision: str, batch: int, context: int = 64, steps: int = 16,
                   rounds: int = 3) -> dict:
    """Milliseconds per decode step by part, for `batch` sequences `context` tokens into their answer; the
    plain step's time is the best of `rounds`, the parts' the mean over all instrumented steps."""
    engine = _decoding_engine(model, tokenizer, precision, batch, context, steps * (3 * rounds + 1) + 8)
    lean = engine.runner.lean
    if lean is None:
        raise ValueError("the decode profile reads the lean forward; this model runs transformers' modules")
    one_call = lean.one_call
    clock, plain, by_layer, instrumented = PartClock(), [], [], []
    with torch.inference_mode():
        _steps_per_second(engine, 4)  # warm up
        plain_calls = _calls_from_python(engine)
        lean.one_call = None
        calls = _calls_from_python(engine)  # the parts' path
        lean.one_call = one_call
        for _ in range(rounds):  # alternated, so that a noisy neighbour falls on all alike
            plain.append(1e3 / _steps_per_second(engine, steps))
            if one_call is not None:
                lean.one_call = None
                by_layer.append(1e3 / _steps_per_second(engine, steps))
            undo = _instrument(engine, clock)
            try:
                instrumented.append(1e3 / _steps_per_second(engine, steps))
            finally:
                _restore(undo)
                lean.one_call = one_call
        dispatch = _dispatch_cost()
    parts = {p: 1e3 * clock.seconds.get(p, 0.0) / (steps * rounds) for p in PARTS}
    return {"precision": precision, "batch": batch, "context": context, "step_ms": min(plain),
            "layer_by_layer_step_ms": min(by_layer) if by_layer else None,
            "instrumented_step_ms": sum(parts.values()), "parts_ms": parts, "calls_per_step": calls,
            "plain_calls_per_step": plain_calls,
            "dispatch_ms_estimate": 1e3 * calls * dispatch}


def print_profile(result: dict) -> None:
    step = result["instrumented_step_ms"]
    by_layer = result["layer_by_layer_step_ms"]
    how = (f" with the layers in one C++ call, {by_layer:.2f} ms layer by layer, the parts' path"
           if by_layer is not None else "")
    print(f"\n{result['precision']} batch {result['batch']}: {result['step_ms']:.2f} ms a step "
          f"({result['batch'] * 1e3 / result['step_ms']:.1f} tok/s){how}; {step:.2f} ms instrumented")
    for part, ms in result["parts_ms"].items():
        print(f"  {part:14}{ms:8.2f} ms  {100 * ms / step:5.1f}%")
    if result["plain_calls_per_step"] != result["calls_per_step"]:
        print(f"  calls into torch and the kernels a step in one call: {result['plain_calls_per_step']}")
    print(f"  calls into torch and the kernels a step: {result['calls_per_step']}, their dispatch about "
          f"{result['dispatch_ms_estimate']:.2f} ms ({100 * result['dispatch_ms_estimate'] / step:.0f}%, within the "
          "parts above)")
