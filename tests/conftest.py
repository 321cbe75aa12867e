"""Shared fixtures: spoken test audio, and the real embedded models, each loaded once per session."""

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import pytest_asyncio

from voicepipe.backends import threads

threads.configure()  # as the CLI does, before torch or CTranslate2 loads

# Fixtures that load the real embedded models (`executed`: the walkthrough, run): a test using one is in the
# slow lane, whatever its own time.
MODEL_FIXTURES = {"llm", "hf_llm", "asr", "tts", "runtime", "server", "spoken_questions", "executed"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def speech_wav(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Factory: a WAV file of `text` spoken by espeak-ng (22.05 kHz, so readers must resample)."""
    folder = tmp_path_factory.mktemp("speech")
    made: dict[str, Path] = {}

    def make(text: str) -> Path:
        if text not in made:
            path = folder / f"speech-{len(made)}.wav"
            subprocess.run(["espeak-ng", "-w", str(path), text], check=True, capture_output=True)
            made[text] = path
        return made[text]

    return make


@pytest.fixture(scope="session")
def words() -> Callable[[str], set[str]]:
    """The lower-case words of a text, for comparing what was said with what was heard."""
    return lambda text: set(re.findall(r"[a-z0-9']+", text.lower()))


@pytest.fixture(scope="session")
def native_kernels():
    """The C++ CPU kernels, built here if set-up did not (skipped only where no compiler exists)."""
    from kernels import native

    if native.compiler() is None:
        pytest.skip("no C++ compiler: the kernels cannot be built on this machine")
    native.build()
    native.lib.cache_clear()
    assert native.lib() is not None


@pytest.fixture(scope="session")
def llm():
    """The embedded LLM as (model, tokenizer), float32."""
    from voicepipe.backends.models import load_llm

    return load_llm()


@pytest.fixture(scope="session")
def hf_llm(llm):
    """The transformers `generate` backend over the session's LLM."""
    from voicepipe.backends.llm_hf import HFLLM

    return HFLLM(*llm)


@pytest.fixture(scope="session")
def asr():
    """The embedded Whisper tiny.en."""
    from voicepipe.backends.asr_whisper import WhisperASR

    return WhisperASR()


@pytest.fixture(scope="session")
def tts():
    """The embedded Piper voice."""
    from voicepipe.backends.tts_piper import PiperTTS

    return PiperTTS()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def runtime(llm, asr, tts):
    """An engine over the session's models, started and warmed up, on the test module's event loop."""
    from voicepipe.call.runtime import Runtime

    runtime = Runtime.start(*llm, asr, tts)
    yield runtime
    await runtime.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(runtime):
    """A voice server on a loopback port over the module's runtime (a module may define its own)."""
    from voicepipe.call.limits import Limits
    from voicepipe.server import VoiceServer

    server = VoiceServer(runtime, Limits(max_calls=3))
    await server.start("127.0.0.1", 0)
    yield server
    await server.close()


SPOKEN_QUESTIONS = Path(__file__).parent / "data" / "spoken_questions.txt"
ESPEAK_VOICES = ("en-us", "en-gb", "en+f3")


@pytest.fixture(scope="session")
def spoken_questions(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, str, str, Path]]:
    """Every question of tests/data/spoken_questions.txt in three espeak-ng voices and the Piper voice.

    Rows are (voice, question, expected answer keyword, 16 kHz WAV file), synthesized once per session. The
    Piper voice draws noise as it speaks, so each session heard a different set (its answers counted 16 to
    19 of 24): this one is its own voice, seeded, and says the set the same way every session.
    """
    import numpy as np
    from support.helpers import seeded_piper

    from voicepipe.audio import resample, to_float32, write_wav

    tts = seeded_piper()

    folder = tmp_path_factory.mktemp("spoken")
    rows = [line.split("\t") for line in SPOKEN_QUESTIONS.read_text(encoding="utf-8").splitlines() if line]
    spoken = []
    for n, (question, answer) in enumerate(rows):
        for voice in ESPEAK_VOICES:
            path = folder / f"{voice}-{n}.wav"
            subprocess.run(["espeak-ng", "-v", voice, "-w", str(path), question], check=True, capture_output=True)
            spoken.append((voice, question, answer, path))
        path = folder / f"piper-{n}.wav"
        pcm = np.concatenate(list(tts.synthesize(question)))
        write_wav(path, resample(to_float32(pcm), tts.sample_rate, 16000), 16000)
        spoken.append(("piper", question, answer, path))
    return spoken
