"""The engine port the call's stages see (`pipeline/engine_port.py`) is a seam with two sides: the real
client (`EngineClient`, a thread or a process behind it) and the tests' fake engine. Both must implement
every method of the port with a signature the stages can call the same way, or a stage tested against the
fake breaks on the real engine."""

import inspect

import pytest
from support.fakes import FakeEngine

from scheduler.channel.client import EngineClient
from voicepipe.pipeline.engine_port import Engine

PORT = [name for name, member in vars(Engine).items() if inspect.isfunction(member) and not name.startswith("_")]


def shape(function) -> tuple:
    """What a caller depends on: the parameters' names, kinds and defaults, and whether it is awaited."""
    signature = inspect.signature(function)
    params = tuple((p.name, p.kind, p.default) for p in signature.parameters.values())
    return params, inspect.iscoroutinefunction(function), inspect.isasyncgenfunction(function)


def test_the_port_names_what_the_stages_call():
    assert {"generate", "run_job", "set_deadline", "promote", "expect", "mean_job_seconds", "busy"} <= set(PORT)


@pytest.mark.parametrize("implementation", [EngineClient, FakeEngine])
@pytest.mark.parametrize("name", PORT)
def test_the_real_client_and_the_fake_implement_the_port_alike(implementation, name):
    method = getattr(implementation, name, None)
    assert method is not None, f"{implementation.__name__} lacks {name}"
    port_params, _, _ = shape(getattr(Engine, name))
    params, awaited, streamed = shape(method)
    assert params == port_params, f"{implementation.__name__}.{name}{inspect.signature(method)}"
    # `generate` streams (an async generator, or a method returning one); the rest are called or awaited as
    # the port says.
    if name != "generate":
        assert awaited == inspect.iscoroutinefunction(getattr(Engine, name)), name
