"""Engine-process factories for the tests (imported by name in the engine process, so they live in a module
of their own): the tiny random-weight engine, and one whose model step fails on a marked prompt."""

from dataclasses import asdict

from voicepipe.bench.random_weights import random_engine

POISON = 7  # a prompt starting with this token id makes the step that carries it raise


def tiny(config):
    """The tiny engine; its info shows the configuration it was handed."""
    engine, info = random_engine(config, "tiny")
    return engine, {**info, "config": asdict(config)}


def faulty(config):
    """The tiny engine, whose steps raise while a prompt that starts with POISON is in them: a stand-in for
    a CUDA OOM or a kernel bug that only one batch meets."""
    engine, info = random_engine(config, "tiny")
    run = engine.runner.run

    def run_or_fail(plan):
        if any(chunk.seq.prompt_ids[0] == POISON for chunk in plan.chunks):
            raise RuntimeError("injected fault")
        return run(plan)

    engine.runner.run = run_or_fail
    return engine, info
