"""Choosing the TTS backend by name, so the CLI and the server share one switch.

Piper is the default and always installed; Coqui is an optional extra, imported only when chosen.
"""

from pathlib import Path

from voicepipe.backends.base import TTS

TTS_CHOICES = ("piper", "coqui")


def make_tts(name: str = "piper", path: str | Path | None = None, threads: int = 2) -> TTS:
    """Load the TTS backend `name` from `path`: a Piper voice (.onnx, or None for the embedded one), with
    `threads` for onnxruntime, or a Coqui model directory (required).

    Raises ValueError for an unknown name and `ModelError` for a missing or unusable model, including
    Coqui not being installed (the message then says how to install the coqui extra).
    """
    if name == "piper":
        from voicepipe.backends.tts_piper import PiperTTS

        return PiperTTS(path, threads)
    if name == "coqui":
        from voicepipe.backends.models import ModelError
        from voicepipe.backends.tts_coqui import CoquiTTS

        if path is None:
            raise ModelError("the coqui TTS has no embedded model: give a Coqui model directory (--tts-model DIR)")
        return CoquiTTS(path)
    raise ValueError(f"unknown TTS {name!r}: choose one of {', '.join(TTS_CHOICES)}")
