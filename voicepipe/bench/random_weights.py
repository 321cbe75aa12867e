"""Llama-family models of named shapes with random weights, for measuring where no checkpoint can be had.

A step's cost depends on the shape (layers, widths, heads, vocabulary), not on the weights' values, so a
seeded random model of a real model's shape measures throughput and latency as that model would, provided
every request runs to a fixed length (`ignore_eos`): random weights would otherwise stop at random places.
The models come with `IdTokenizer`, which has no vocabulary: workloads are token ids (`Workload.token_items`).
"""

from typing import TYPE_CHECKING

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from voicepipe.bench.shapes import SHAPES, IdTokenizer

if TYPE_CHECKING:
    from scheduler import Engine, EngineConfig


def shape_config(shape: str, **changes) -> LlamaConfig:
    """The LlamaConfig of a named shape, with `changes` on top."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r} (choose from {', '.join(SHAPES)})")
    return LlamaConfig(**{**SHAPES[shape], "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, **changes})


@torch.no_grad()
def random_llm(shape: str, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0,
               **changes) -> tuple[LlamaForCausalLM, IdTokenizer]:
    """(model, tokenizer) of a named shape with seeded random weights, built directly on `device` in `dtype`
    (a 13B model would not fit in a CPU's memory as float32 first)."""
    config = shape_config(shape, **changes)
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    model.eval().requires_grad_(False)
    return model, IdTokenizer(config.vocab_size, config.eos_token_id)


def random_engine(config: "EngineConfig", shape: str = "tiny", seed: int = 0) -> tuple["Engine", dict]:
    """An engine over a random-weight model of `shape`, with one device
    job, `echo`, that returns its arguments: an engine process's factory where no checkpoint exists, and
    the probe `bench ipc` times the channel with."""
    from scheduler import Engine
    from scheduler.jobs import JobHandler

    model, tokenizer = random_llm(shape, seed=seed)
    engine = Engine(model, tokenizer, config, {"echo": JobHandler(lambda *args: list(args))})
    return engine, {"model_id": f"random-{shape}"}
