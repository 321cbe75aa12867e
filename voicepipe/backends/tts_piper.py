"""Piper speech synthesis (a VITS voice in ONNX, phonemized by the espeak-ng built into piper-tts)."""

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from voicepipe.backends.models import ModelError, first_line, resolve_tts
from voicepipe.backends.threads import onnx_options


class PiperTTS:
    """Text in, one int16 chunk per sentence out, at the voice's own sample rate.

    The ONNX session is built here rather than by `PiperVoice.load` so its thread pool does not spin:
    a spinning pool fights torch and CTranslate2 for the same cores, and with spinning off the first
    sentence arrived sooner (about 0.3 s against 0.4-0.7 s) on a busy 2-core machine.
    """

    def __init__(self, voice_path: str | Path | None = None, threads: int = 2) -> None:
        import onnxruntime
        from piper import PiperConfig, PiperVoice

        onnx = resolve_tts(voice_path)
        options = onnx_options(threads)
        try:
            config = PiperConfig.from_dict(json.loads(Path(f"{onnx}.json").read_text(encoding="utf-8")))
            session = onnxruntime.InferenceSession(str(onnx), sess_options=options,
                                                   providers=["CPUExecutionProvider"])
        except Exception as e:  # a broken voice file fails in many ways: report it in one line
            raise ModelError(f"cannot load TTS voice {onnx}: {first_line(e)}") from None
        self.voice = PiperVoice(session=session, config=config)
        self.sample_rate: int = config.sample_rate

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        """Yield int16 mono audio, one chunk per sentence of `text`."""
        for chunk in self.voice.synthesize(text):
            yield chunk.audio_int16_array
