"""What `bench engine` measures on: the model (a checkpoint, or random weights of a named shape), the device
and precision it runs in, the KV cache's dtype and size, and the workload's requests for that model."""

import argparse
import gc
from typing import Any

from voicepipe.bench.shapes import SHAPES, IdTokenizer
from voicepipe.bench.workload import WorkItem, Workload

KV_DTYPES = ("auto", "fp32", "fp16", "bf16", "fp8_e4m3")
CUDA_KV_GIB = 16.0  # the KV cache on CUDA unless --kv-gib says otherwise: room for 32 long requests at 13B


def add_engine_setup_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--random-weights", choices=tuple(SHAPES), metavar="SHAPE",
                        help=f"a Llama-family model of a named shape ({', '.join(SHAPES)}) with seeded random "
                             "weights instead of a checkpoint; prompts are token ids, outputs fixed lengths")
    parser.add_argument("--kv-dtype", choices=KV_DTYPES, default="auto",
                        help="KV-cache dtype (default auto: the weights'; fp8_e4m3 holds twice bf16's tokens)")
    parser.add_argument("--kv-gib", type=float, metavar="GIB",
                        help=f"KV-cache size over all layers (default: {CUDA_KV_GIB:g} on CUDA, the engine's "
                             "24 slabs a layer on a CPU)")
    parser.add_argument("--static-batch-size", type=int, metavar="N",
                        help="batch size of the static mode (default: the engine's)")


def engine_settings(args: argparse.Namespace) -> dict[str, Any]:
    """EngineConfig fields from the options: device, precision, KV dtype and size, static batch size."""
    from voicepipe.backends.arguments import model_options
    from voicepipe.backends.loading import placement

    settings: dict[str, Any] = {**placement(model_options(args)), "kv_dtype": args.kv_dtype}
    kv_gib = args.kv_gib if args.kv_gib is not None else CUDA_KV_GIB if settings["device"] == "cuda" else None
    if kv_gib is not None:
        settings["kv_bytes"] = int(kv_gib * (1 << 30))
    if args.static_batch_size is not None:
        settings["static_batch_size"] = args.static_batch_size
    return settings


def load_bench_model(args: argparse.Namespace, settings: dict[str, Any]) -> tuple[Any, Any]:
    """(model, tokenizer): random weights built directly on the device in the precision's dtype, or the
    checkpoint (the engine moves it)."""
    if args.random_weights is None:
        from voicepipe.backends.models import load_llm

        return load_llm(args.llm_model)
    from scheduler.model.device import WEIGHT_DTYPES
    from voicepipe.bench.random_weights import random_llm

    return random_llm(args.random_weights, settings["device"], WEIGHT_DTYPES[settings["precision"]])


def items_for(workload: Workload, tokenizer: Any) -> list[WorkItem]:
    """The workload's requests: chat prompts for a real tokenizer, token ids for a model without one."""
    if isinstance(tokenizer, IdTokenizer):
        return workload.token_items(tokenizer.vocab_size)
    return workload.items(tokenizer)


def roofline_prompt(tokenizer: Any) -> list[int]:
    return list(range(3, 11)) if isinstance(tokenizer, IdTokenizer) else tokenizer.encode("Once upon a time")


def release_device_memory() -> None:
    """Free the last engine's KV cache before the next one allocates its own (engines hold reference cycles)."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
