"""`voicepipe bench engine`: one workload through static batching, FCFS continuous batching, mini-O4 and
transformers' own static (`generate`) and continuous batching, reporting throughput and latency
percentiles for each."""

import logging
import time

import numpy as np
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from scheduler import Engine, EngineConfig, SamplingParams, Sequence
from scheduler.grammar.constraint import Grammar
from voicepipe.bench.workload import WorkItem

log = logging.getLogger(__name__)


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def summarize(tokens: int, makespan: float, ttfts: list[float], latencies: list[float]) -> dict:
    return {"throughput_tok_s": tokens / makespan, "ttft_p50_s": percentile(ttfts, 50),
            "ttft_p99_s": percentile(ttfts, 99), "latency_p50_s": percentile(latencies, 50),
            "latency_p99_s": percentile(latencies, 99), "tokens": tokens, "makespan_s": makespan}


def run_engine(model, tokenizer, items: list[WorkItem], config: EngineConfig,
               grammars: dict[int, Grammar] | None = None) -> dict:
    """Drive the engine step by step on this thread, adding each request at its arrival time; the items
    numbered in `grammars` are constrained to theirs (they end when it is complete)."""
    grammars = grammars or {}
    engine = Engine(model, tokenizer, config)
    pending = sorted(enumerate(items), key=lambda w: w[1].arrival_s)
    seqs: list[Sequence] = []
    numbers: list[int] = []  # each sequence's item
    start = time.monotonic()
    while pending or not engine.planner.idle or engine.planner.grammar_waiters():  # a grammar compiling is work too
        now = time.monotonic()
        while pending and start + pending[0][1].arrival_s <= now:
            n, item = pending.pop(0)
            seq = Sequence(item.prompt_ids, SamplingParams(max_tokens=item.max_tokens, ignore_eos=True,
                                                           grammar=grammars.get(n)))
            seq.arrival = start + item.arrival_s
            seqs.append(engine.add_request(seq))
            numbers.append(n)
        if not engine.step() and pending:
            time.sleep(max(0.0, start + pending[0][1].arrival_s - time.monotonic()))
    makespan = time.monotonic() - start
    engine.planner.check_pool()
    # A static batch keeps computing tokens for members that are done (padding, never shown): not counted.
    result = summarize(sum(min(len(s.output_ids), s.params.max_tokens) for s in seqs), makespan,
                       [s.first_token_at - s.arrival for s in seqs], [s.last_token_at - s.arrival for s in seqs])
    result["steps"] = engine.metrics.steps_run
    result["preemptions"] = sum(s.preemptions for s in seqs)
    if grammars:
        result["outputs"] = {n: (s.text, s.finish_reason) for n, s in zip(numbers, seqs, strict=True)}
        masks = {s.name: s.value for s in engine.metrics.mask_seconds.collect()[0].samples}
        result["mask_ms_per_masked_step"] = 1e3 * masks["voicepipe_grammar_mask_seconds_sum"] / max(
            1, masks["voicepipe_grammar_mask_seconds_count"])
    return result


def run_hf_continuous_batching(model, items: list[WorkItem]) -> dict:
    """transformers' ContinuousBatchingManager on the same work (its own paged cache and scheduler)."""
    from transformers import GenerationConfig

    config = GenerationConfig(do_sample=False, max_new_tokens=max(w.max_tokens for w in items),
                              eos_token_id=None, pad_token_id=0)
    manager = model.init_continuous_batching(generation_config=config)
    manager.start()
    try:
        pending = sorted(items, key=lambda w: w.arrival_s)
        arrivals, first, finish, tokens = {}, {}, {}, 0
        start = time.monotonic()
        while pending or len(finish) < len(items):
            now = time.monotonic()
            while pending and start + pending[0].arrival_s <= now:
                item = pending.pop(0)
                rid = f"r{len(arrivals)}"
                arrivals[rid] = start + item.arrival_s
                manager.add_request(item.prompt_ids, request_id=rid, max_new_tokens=item.max_tokens,
                                    streaming=True, eos_token_id=-1)
            result = manager.get_result(timeout=0.01)
            if result is None:
                continue
            first.setdefault(result.request_id, time.monotonic())
            if result.is_finished():
                finish[result.request_id] = time.monotonic()
                tokens += len(result.generated_tokens)
    finally:
        manager.stop(block=True)
        if hasattr(model, "destroy_cached_continuous_batching_manager"):  # a fresh manager for the next run
            model.destroy_cached_continuous_batching_manager()
    return summarize(tokens, max(finish.values()) - start, [first[r] - arrivals[r] for r in arrivals],
                     [finish[r] - arrivals[r] for r in arrivals])


class _StepClock(LogitsProcessor):
    """Notes when `generate` samples each step's tokens: step k's time is when token k+1 exists."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self.times.append(time.monotonic())
        return scores


def run_hf_static(model, tokenizer, items: list[WorkItem], batch_size: int = 32) -> dict:
    """transformers' own `generate` on fixed batches in arrival order: prompts left-padded, every row run
    for its batch's longest output, each request counted done when its own last token exists."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    pending = sorted(items, key=lambda w: w.arrival_s)
    ttfts, latencies, finish, tokens = [], [], 0.0, 0
    start = time.monotonic()
    for first in range(0, len(pending), batch_size):
        batch = pending[first:first + batch_size]
        time.sleep(max(0.0, start + batch[-1].arrival_s - time.monotonic()))  # a static batch waits to fill
        width = max(len(w.prompt_ids) for w in batch)
        device = next(model.parameters()).device
        ids = torch.tensor([[pad] * (width - len(w.prompt_ids)) + w.prompt_ids for w in batch], device=device)
        mask = torch.tensor([[0] * (width - len(w.prompt_ids)) + [1] * len(w.prompt_ids) for w in batch],
                            device=device)
        longest = max(w.max_tokens for w in batch)
        clock = _StepClock()
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=longest, min_new_tokens=longest,
                           do_sample=False, pad_token_id=pad, logits_processor=LogitsProcessorList([clock]))
        for w in batch:
            arrival = start + w.arrival_s
            ttfts.append(clock.times[0] - arrival)
            latencies.append(clock.times[w.max_tokens - 1] - arrival)
            tokens += w.max_tokens
        finish = clock.times[-1]
    return summarize(tokens, finish - start, ttfts, latencies)


def measure_bandwidth(device: torch.device, nbytes: int, rounds: int = 7) -> float:
    """Bytes per second of an in-place multiply over a buffer of `nbytes` (one read, one write of each), the
    best of `rounds`: a limit is what the memory can do, and one pass swung 2x with the machine's noise."""
    buffer = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    buffer.mul_(1.0001)  # warm up
    best = 0.0
    for _ in range(rounds):
        synchronize(device)
        t0 = time.perf_counter()
        buffer.mul_(1.0001)
        synchronize(device)
        best = max(best, 2 * buffer.numel() * 4 / (time.perf_counter() - t0))
    return best


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_weight_bytes(engine: Engine) -> int:
    """Bytes of weights one decode step reads: every tensor of the lean model's layers, norms and head as
    the engine holds them (quantized codes and their scales), each once, but not the input embedding, of
    which a step reads a row a token. A model the lean forward cannot run counts all its parameters."""
    lean = engine.runner.lean
    if lean is None:
        return sum(p.numel() * p.element_size() for p in engine.runner.model.parameters())
    tensors = {t.data_ptr(): t.numel() * t.element_size() for m in lean.modules() if m is not lean.embed
               for t in (*m.parameters(recurse=False), *m.buffers(recurse=False))}
    return sum(tensors.values())


def decode_roofline(model, tokenizer, precision: str = "fp32", tokens: int = 32,
                    prompt_ids: list[int] | None = None, settings: dict | None = None,
                    batches: tuple[int, ...] = (1, 16), bandwidth: float | None = None) -> dict:
    """Decode speed at each of `batches` next to the limit set by reading every weight once per step.

    The weights are counted as the engine holds them (`step_weight_bytes`): int8 codes read a quarter of
    float32's bytes, int4 codes with their group scales about a sixth, so the limit is that much higher. A
    step of B decodes reads the weights once for all B, so its limit is B times batch 1's (the KV cache's
    reads, small beside the weights at these lengths, are not counted). The bandwidth is measured on the
    model's device over a buffer as large as the model (at most 4 GiB), unless given (`bandwidth`, bytes per
    second: one figure for every precision of a run, so their ratios compare).
    """
    engine = Engine(model, tokenizer, EngineConfig(num_slabs=4, precision=precision, **(settings or {})))
    device = next(model.parameters()).device
    run_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    weight_bytes = step_weight_bytes(engine)
    bandwidth = bandwidth or measure_bandwidth(device, min(run_bytes, 4 << 30))
    prompt = prompt_ids if prompt_ids is not None else tokenizer.encode("Once upon a time")
    limit = bandwidth / weight_bytes
    result = {"precision": precision, "weight_bytes": weight_bytes, "bandwidth_gb_s": bandwidth / 1e9,
              "limit_tok_s": limit}
    for batch in batches:
        seqs = [engine.add_request(Sequence(prompt, SamplingParams(max_tokens=tokens, ignore_eos=True)))
                for _ in range(batch)]
        while min(len(s.output_ids) for s in seqs) < 2:
            engine.step()
        t0 = time.perf_counter()
        while engine.step():
            pass
        tok_s = batch * (tokens - 2) / (time.perf_counter() - t0)
        result[f"batch{batch}_decode_tok_s"] = tok_s
        result["ratio_of_limit" if batch == 1 else f"batch{batch}_ratio_of_limit"] = tok_s / (batch * limit)
    return result
