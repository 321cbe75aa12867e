"""Shared fixtures: spoken test audio, and the real embedded models, each loaded once per session."""

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import pytest_asyncio

from voicepipe import threads

threads.configure()  # as the CLI does, before torch or CTranslate2 loads


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
def llm():
    """The embedded LLM as (model, tokenizer), float32."""
    from voicepipe.models import load_llm

    return load_llm()


@pytest.fixture(scope="session")
def hf_llm(llm):
    """The transformers `generate` backend over the session's LLM."""
    from voicepipe.stages.llm_hf import HFLLM

    return HFLLM(*llm)


@pytest.fixture(scope="session")
def asr():
    """The embedded Whisper tiny.en."""
    from voicepipe.stages.asr_whisper import WhisperASR

    return WhisperASR()


@pytest.fixture(scope="session")
def tts():
    """The embedded Piper voice."""
    from voicepipe.stages.tts_piper import PiperTTS

    return PiperTTS()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def runtime(llm, asr, tts):
    """An engine over the session's models, started and warmed up, on the test module's event loop."""
    from voicepipe.runtime import Runtime

    runtime = Runtime.start(*llm, asr, tts)
    await runtime.warm_up()
    yield runtime
    runtime.close()
