"""Audio as clients send and hear it: 16-bit PCM at a rate, or G.711 (μ-law, A-law) at the phone's 8 kHz.

G.711 is coded by libsndfile (through `soundfile`, a dependency): each 8-bit code stands for one 16-bit
sample, so a chunk of any length codes on its own, with no state between chunks.
"""

import io
from dataclasses import dataclass
from typing import Literal

import numpy as np
import soundfile

Coding = Literal["pcm16", "pcmu", "pcma"]
PHONE_RATE = 8000
SUBTYPES = {"pcmu": "ULAW", "pcma": "ALAW"}


@dataclass(frozen=True, slots=True)
class WireAudio:
    """How one direction of a call's audio is coded on the wire."""

    coding: Coding
    rate: int

    @property
    def bytes_per_sample(self) -> int:
        return 2 if self.coding == "pcm16" else 1

    def decode(self, data: bytes) -> np.ndarray:
        """The samples (int16) of `data`; ValueError for PCM16 of an odd length."""
        if self.coding == "pcm16":
            if len(data) % 2:
                raise ValueError("PCM16 audio must have an even number of bytes")
            return np.frombuffer(data, "<i2")
        if not data:
            return np.zeros(0, np.int16)
        raw = soundfile.SoundFile(io.BytesIO(data), format="RAW", subtype=SUBTYPES[self.coding],
                                  samplerate=self.rate, channels=1)
        with raw:
            return raw.read(dtype="int16")

    def encode(self, samples: np.ndarray) -> bytes:
        """`samples` (int16) as the wire carries them."""
        if self.coding == "pcm16":
            return samples.astype("<i2", copy=False).tobytes()
        if not len(samples):
            return b""
        out = io.BytesIO()
        with soundfile.SoundFile(out, "w", format="RAW", subtype=SUBTYPES[self.coding], samplerate=self.rate,
                                 channels=1) as raw:
            raw.write(samples.astype(np.int16, copy=False))
        return out.getvalue()


PCMU, PCMA = WireAudio("pcmu", PHONE_RATE), WireAudio("pcma", PHONE_RATE)
