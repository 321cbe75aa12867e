"""A phone line between a speakerphone and the server, as the bench's stand-in for a phone network (which
cannot exist here): what G.711 leaves of the audio each way, the band a phone carries (under 3.4 kHz) and
μ-law's 8-bit companding, coded by the server's own codec (`wire_audio`).

The server's far end is the reply as it sent it; the speakerphone plays what the line delivered of it, and
sends what the line makes of its microphone. So the echo the canceller meets has passed the line twice,
and its reference never did, as on a call through a phone network.
"""

import numpy as np

from voicepipe.audio import to_pcm16
from voicepipe.wire_audio import WireAudio

CUTOFF_HZ = 3400.0
TAPS = 101  # a windowed-sinc low-pass: 6 ms of delay at 16 kHz, as a phone's own filters add


def band_taps(rate: int) -> np.ndarray:
    """The low-pass filter's taps at `rate`, unit gain in the band."""
    n = np.arange(TAPS) - (TAPS - 1) / 2
    taps = 2 * CUTOFF_HZ / rate * np.sinc(2 * CUTOFF_HZ / rate * n) * np.hamming(TAPS)
    return (taps / taps.sum()).astype(np.float32)


class PhoneLine:
    """One direction of the line, a chunk at a time (its filter keeps the last chunk's end)."""

    def __init__(self, rate: int) -> None:
        self._taps = band_taps(rate)
        self._history = np.zeros(TAPS - 1, np.float32)
        self._codec = WireAudio("pcmu", rate)

    def process(self, audio: np.ndarray) -> np.ndarray:
        """`audio` (float32) as it comes out of the line."""
        audio = np.concatenate([self._history, np.asarray(audio, np.float32)])
        self._history = audio[len(audio) - (TAPS - 1):]
        banded = np.convolve(audio, self._taps, mode="valid")
        return self._codec.decode(self._codec.encode(to_pcm16(banded))).astype(np.float32) / 32768.0


def down_the_line(audio: np.ndarray, rate: int) -> np.ndarray:
    """A whole stream through a fresh line: what the far side hears of it."""
    return PhoneLine(rate).process(audio)
