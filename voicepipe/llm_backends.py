"""Which LLM stage runs a loaded model: the mini-O4 engine (default), or transformers' own `generate`."""

from typing import Any

from voicepipe.stages.base import LLM

BACKENDS = ("hf", "engine")


def make_llm(name: str, model: Any, tokenizer: Any, precision: str = "fp32") -> LLM:
    """The LLM stage called `name` over `model` and `tokenizer`; `precision` is the engine's weights (the
    `generate` backend always runs the model as loaded)."""
    if name == "hf":
        from voicepipe.stages.llm_hf import HFLLM

        return HFLLM(model, tokenizer)
    if name == "engine":
        from scheduler import Engine, EngineConfig
        from voicepipe.stages.llm_engine import EngineLLM

        return EngineLLM(Engine(model, tokenizer, EngineConfig(precision=precision)))
    raise ValueError(f"unknown LLM backend {name!r} (choose from {', '.join(BACKENDS)})")
