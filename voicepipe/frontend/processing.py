"""WebRTC's audio processing module for one call: AEC3 against the far end, then its noise suppressor.

Chosen by measurement among PyPI's cancellers (`scripts/echo-candidates.py`, docs/audio-front-end.md):
pywebrtc-audio's AEC3 cancelled 17-26 dB of echo in the synthetic rooms, livekit's APM build of the same
AEC3 12-20 dB, Speex's MDF 2-3 dB; it takes float32 numpy frames with no runtime of its own, in a wheel
under 1 MB, and costs 2-2.5% of a core per call (bench room). AEC3 finds the echo's delay itself up to about 400 ms
past the far end's timing (measured: 26 dB at 250 ms, 16 dB at 400 ms, none at 550 ms).
"""

from typing import Literal

import numpy as np
import pywebrtc_audio

from voicepipe.frontend.echo_path import EchoPath

RATE = 16000
FRAME = RATE // 100  # the module works in 10 ms frames
SILENCE = np.zeros(FRAME, np.float32)  # the far end where no loudspeaker is heard
# -100 dBFS of noise under the far end, always: a reply falling to digital silence leaves AEC3's filters
# full of subnormal numbers, and it ran 5 times slower on them (measured: 95-120 ms per second of audio
# over a call in a synthetic room, 19 ms with this).
DITHER = np.random.default_rng(0).standard_normal(FRAME).astype(np.float32) * np.float32(1e-5)
NoiseReduction = Literal["near_field", "far_field"] | None
# WebRTC NS levels 0-3 suppress 6, 12, 18 and 21 dB: a close microphone needs less than a room's.
NS_LEVELS = {"near_field": 1, "far_field": 2}


class AudioProcessing:
    """Echo cancellation and noise suppression over a stream of any chunk sizes, in 10 ms frames: what
    comes out lags what went in by less than a frame (the rest of a frame waits for the next chunk)."""

    def __init__(self, echo: bool, noise: NoiseReduction) -> None:
        self.echo, self.noise = echo, noise
        self._near = np.zeros(0, np.float32)
        self._far = np.zeros(0, np.float32)
        self.path = EchoPath()
        self._apm = self._make()

    @property
    def active(self) -> bool:
        return self.echo or self.noise is not None

    def configure(self, echo: bool, noise: NoiseReduction) -> None:
        """New settings; the canceller keeps what it learnt of the room when only the suppressor changes."""
        if (echo, noise) != (self.echo, self.noise):
            self.echo, self.noise = echo, noise
            self._apm = self._make()

    def process(self, near: np.ndarray, far: np.ndarray) -> np.ndarray:
        """The cleaned microphone audio for `near` (float32), whose loudspeaker audio over the same time was
        `far`; as many whole frames as are complete."""
        if self._apm is None:
            return near
        self._near = np.concatenate([self._near, near.astype(np.float32, copy=False)])
        self._far = np.concatenate([self._far, far.astype(np.float32, copy=False)])
        n = len(self._near) // FRAME * FRAME
        if n == 0:
            return np.zeros(0, np.float32)
        out = np.empty(n, np.float32)
        for i in range(0, n, FRAME):
            near, far = self._near[i:i + FRAME], self._far[i:i + FRAME]
            echoing = self.echo and self.path.far(far) and self.path.present
            out[i:i + FRAME] = self._apm.process(near, (far if echoing else SILENCE) + DITHER if self.echo else None)
            if self.echo:
                self.path.near(near)
                if echoing and self.path.residue(near, out[i:i + FRAME]):
                    out[i:i + FRAME] = 0.0
        self._near, self._far = self._near[n:], self._far[n:]
        return out

    def _make(self) -> "pywebrtc_audio.AudioProcessor | None":
        if not self.active:
            return None
        return pywebrtc_audio.AudioProcessor(sample_rate=RATE, echo_cancellation=self.echo,
                                             noise_suppression=self.noise is not None,
                                             ns_level=NS_LEVELS.get(self.noise or "", 1))
