"""Which LLM backend runs a loaded model: the mini-O4 engine (default), or transformers' own `generate`."""

from typing import Any

from voicepipe.backends.base import LLM

BACKENDS = ("hf", "engine")


def make_llm(name: str, model: Any, tokenizer: Any, precision: str | None = "fp32", device: str | None = None) -> LLM:
    """The LLM backend called `name` over `model` and `tokenizer`; `precision` is the engine's weights (None: the
    device's default) and `device` the engine's (None: where the model is); the `generate` backend always
    runs the model as loaded."""
    if name == "hf":
        from voicepipe.backends.llm_hf import HFLLM

        return HFLLM(model, tokenizer)
    if name == "engine":
        from scheduler import Engine, EngineConfig
        from voicepipe.backends.llm_engine import EngineLLM

        return EngineLLM(Engine(model, tokenizer, EngineConfig(precision=precision, device=device)))
    raise ValueError(f"unknown LLM backend {name!r} (choose from {', '.join(BACKENDS)})")
