"""Shared by the tests of the echo canceller and its replays: the caller's voice, and a long reply in
another."""

from pathlib import Path

import numpy as np

from voicepipe.audio import read_audio
from voicepipe.frontend.processing import RATE

VOICE = read_audio(Path(__file__).parents[2] / "voicepipe" / "samples" / "question.wav", RATE)
CALLER_RMS = 0.05


def reply_audio(seconds: float) -> np.ndarray:
    """A long reply in a voice unlike the caller's: the sample backwards, each repeat at another pitch (a
    loop of one clip is periodic, and a periodic far end is no test of a canceller's delay)."""
    from voicepipe.audio import resample

    parts, n = [], 0
    while sum(map(len, parts)) < seconds * RATE:
        parts += [resample(VOICE[::-1], RATE, int(RATE * (0.8 + 0.07 * (n % 6)))), np.zeros(RATE // 5, np.float32)]
        n += 1
    return np.concatenate(parts)[:int(seconds * RATE)] * np.float32(0.5)


def delayed(audio: np.ndarray, samples: float) -> np.ndarray:
    """`audio` later by `samples`, a fraction included (a phase shift in the spectrum)."""
    size = 1 << int(np.ceil(np.log2(len(audio) + int(samples) + 1)))
    spectrum = np.fft.rfft(audio, size) * np.exp(-2j * np.pi * np.fft.rfftfreq(size) * samples)
    return np.fft.irfft(spectrum, size)[:len(audio)].astype(np.float32)
