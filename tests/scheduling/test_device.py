"""Device selection: auto falls back to the CPU, CUDA where there is none is a clear error (exit status 2),
int8 and int4 are refused on CUDA, and the engine places and casts the model as asked."""

import os

import pytest
import torch

from scheduler import Engine, EngineConfig, SamplingParams, Sequence
from scheduler.model.device import DeviceUnavailable, check_precision, place_model, resolve_device
from scheduler.model.quantize import Int4Linear
from voicepipe.backends.loading import ModelOptions, engine_config, job_threads, placement
from voicepipe.backends.models import ModelError
from voicepipe.bench.random_weights import random_llm
from voicepipe.cli import main


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch says a CUDA device exists (nothing may touch it: only the choice is tested)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def test_auto_falls_back_to_the_cpu(no_cuda):
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")


def test_auto_takes_cuda_when_torch_sees_it(fake_cuda):
    assert resolve_device("auto") == torch.device("cuda")


def test_cuda_without_cuda_is_refused(no_cuda):
    with pytest.raises(DeviceUnavailable, match="no CUDA device"):
        resolve_device("cuda")
    with pytest.raises(DeviceUnavailable, match="unknown device"):
        resolve_device("tpu")


@pytest.mark.parametrize("argv", [["bench", "engine", "--device", "cuda"], ["chat", "hello", "--device", "cuda"],
                                  ["turn", "in.wav", "-o", "out.wav", "--device", "cuda"]])
def test_the_cli_exits_2_on_cuda_without_cuda(no_cuda, capsys, argv: list[str]):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--device" in err and "no CUDA device" in err


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_quantized_weights_are_refused_on_cuda(fake_cuda, precision):
    check_precision(torch.device("cpu"), precision)
    with pytest.raises(DeviceUnavailable, match="CPUs only"):
        check_precision(torch.device("cuda"), precision)
    with pytest.raises(ModelError, match="CPUs only"):
        placement(ModelOptions(device="cuda", llm_precision=precision))


def test_the_default_precision_follows_the_device(no_cuda):
    assert placement(ModelOptions(device="auto", llm_precision=None)) == {"device": "cpu", "precision": "int4"}
    assert placement(ModelOptions(device="cpu", llm_precision="fp32"))["precision"] == "fp32"


def test_the_default_precision_on_cuda_is_bf16(fake_cuda):
    assert placement(ModelOptions(device="auto", llm_precision=None)) == {"device": "cuda", "precision": "bf16"}


def test_device_jobs_get_a_lane_of_their_own_on_cuda_and_run_between_steps_on_a_cpu(no_cuda, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert (job_threads(EngineConfig(), "cuda"), job_threads(EngineConfig(), "cpu")) == (7, 0)
    assert job_threads(EngineConfig(job_threads=1), "cpu") == 1
    assert engine_config(ModelOptions(device="cpu")).job_threads == 0  # resolved, never left to the engine
    assert engine_config(ModelOptions(device="cpu", engine=EngineConfig(job_threads=2))).job_threads == 2


def test_place_model_casts_and_keeps_the_device_when_none_is_given():
    model, _ = random_llm("tiny")
    assert place_model(model, None, "bf16") == "bf16"
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert place_model(model, "cpu", None) == "int4"  # the CPU's default; int4 keeps float32 storage
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_an_engine_without_a_precision_takes_the_devices_default():
    model, tokenizer = random_llm("tiny")
    engine = Engine(model, tokenizer, EngineConfig(precision=None, num_slabs=1))
    assert engine.runner.precision == "int4"
    assert any(isinstance(m, Int4Linear) for m in engine.runner.lean.modules())


def test_bf16_engine_gives_generates_greedy_tokens_in_bf16():
    """The mixed-precision path end to end on the CPU: weights, activations and KV in bf16."""
    model, tokenizer = random_llm("tiny", dtype=torch.bfloat16, eos_token_id=None)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 512, (n,), generator=gen).tolist() for n in (5, 40, 17)]
    expected = []
    for p in prompts:
        ids = torch.tensor([p])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False)
        expected.append(out[0, len(p):].tolist())
    engine = Engine(model, tokenizer, EngineConfig(precision="bf16", shard_tokens=16, num_slabs=4))
    assert engine.runner.kv.dtype == torch.bfloat16
    seqs = [engine.add_request(Sequence(p, SamplingParams(max_tokens=16, ignore_eos=True))) for p in prompts]
    while engine.step():
        pass
    assert [s.output_ids for s in seqs] == expected
