"""The LLM's command-line options (the model, its weights' precision, the device), declared once: for the
commands, and for `python -m voicepipe.bench`, which runs without the rest of the command line."""

import argparse
from dataclasses import replace
from typing import Any

from voicepipe.backends.loading import CUDA_PRECISION, DEFAULT_PRECISION, DEVICES, PRECISIONS, ModelOptions


def usable_device(name: str) -> str:
    """argparse type of --device: `cuda` where torch sees none is refused while parsing (exit status 2)."""
    if name == "cuda":
        from scheduler.model.device import DeviceUnavailable, resolve_device  # torch: only when CUDA is asked for

        try:
            resolve_device(name)
        except DeviceUnavailable as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return name


def add_llm_model_arguments(parser: argparse.ArgumentParser) -> None:
    """Which LLM, the precision of its weights and the device: every command that loads it takes these."""
    parser.add_argument("--llm-model", metavar="PATH", help="GGUF file or transformers checkpoint directory")
    parser.add_argument("--llm-precision", choices=PRECISIONS, default=None,
                        help=f"weights of the engine's LLM (default: {DEFAULT_PRECISION} on a CPU, {CUDA_PRECISION} "
                             "on CUDA; int8 and int4 run on CPUs only)")
    parser.add_argument("--device", type=usable_device, choices=DEVICES, default="auto",
                        help="where the LLM runs: auto (CUDA when torch sees one, default), cpu or cuda")


def model_options(source: object) -> ModelOptions:
    """The models and engine settings named by a command's options, or by the server's settings, which name
    them alike (`policy`, `job_threads`, and the commands' `--engine-field` among them); one the source
    lacks, or leaves unset, keeps its default."""
    default = ModelOptions()

    def given(name: str) -> Any:
        value = getattr(source, name, None)
        return getattr(default, name) if value is None else value

    engine = replace(default.engine, **getattr(source, "engine_fields", {}))
    for name in ("policy", "job_threads"):
        if getattr(source, name, None) is not None:
            engine = replace(engine, **{name: getattr(source, name)})
    return ModelOptions(llm_model=given("llm_model"), asr_model=given("asr_model"), tts=given("tts"),
                        tts_model=given("tts_model"), device=given("device"), llm_precision=given("llm_precision"),
                        torch_threads=given("torch_threads"), engine=engine)
