"""WebRTC's audio processing module for one call: AEC3 against the far end, then its noise suppressor.

Chosen by measurement among PyPI's cancellers (`scripts/echo-candidates.py`, docs/audio-front-end.md):
pywebrtc-audio's AEC3 cancelled 17-26 dB of echo in the synthetic rooms, livekit's APM build of the same
AEC3 12-20 dB, Speex's MDF 2-3 dB; it takes float32 numpy frames with no runtime of its own, in a wheel
under 1 MB, and costs about 1.2% of a core per call. AEC3 finds the echo's delay itself up to about 400 ms
past the far end's timing (measured: 26 dB at 250 ms, 16 dB at 400 ms, none at 550 ms).
"""

from collections import deque
from typing import Literal

import numpy as np
import pywebrtc_audio

RATE = 16000
FRAME = RATE // 100  # the module works in 10 ms frames
NoiseReduction = Literal["near_field", "far_field"] | None
# The residue gate: while the far end may still be echoing (it played within ECHO_TAIL_S), a frame the
# canceller took more than GATE_DB off is echo alone, and what is left of it is silenced. The VAD scores a
# voice by its shape, not its loudness, so a residue 25 dB down still reads as speech to it; a caller
# talking over the reply keeps the frame within a few dB of the microphone's (their voice passes through).
ECHO_TAIL_S = 0.6
GATE_DB = 12.0
HOLD_DB = 5.0  # once gating, a frame is let through only when the canceller took less than this off it
# Where the canceller lost its grip (a new delay, a tail past its filter), the level tells: a frame no louder
# than the far end's recent loudest times the echo path's usual gain (LEVEL_DB of margin) holds no caller.
LEVEL_DB = 3.0
PATH_FRAMES = 50  # far-end frames the echo path's gain is learnt over before the level is trusted
# WebRTC NS levels 0-3 suppress 6, 12, 18 and 21 dB: a close microphone needs less than a room's.
NS_LEVELS = {"near_field": 1, "far_field": 2}


class AudioProcessing:
    """Echo cancellation and noise suppression over a stream of any chunk sizes, in 10 ms frames: what
    comes out lags what went in by less than a frame (the rest of a frame waits for the next chunk)."""

    def __init__(self, echo: bool, noise: NoiseReduction) -> None:
        self.echo, self.noise = echo, noise
        self._near = np.zeros(0, np.float32)
        self._far = np.zeros(0, np.float32)
        self._echo_frames = 0  # frames to come that the far end may still be echoing in
        self._gating = False  # the frames before were echo alone
        self._far_recent: deque[float] = deque(maxlen=int(ECHO_TAIL_S * 100))  # far-end frame energies
        self._path: deque[float] = deque(maxlen=300)  # microphone over far-end energy, frame by frame
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
            out[i:i + FRAME] = self._apm.process(near, far if self.echo else None)
            if self.echo:
                self._gate(near, far, out[i:i + FRAME])
        self._near, self._far = self._near[n:], self._far[n:]
        return out

    def _gate(self, near: np.ndarray, far: np.ndarray, out: np.ndarray) -> None:
        """Silence what is left of the echo in a frame that holds nothing else."""
        self._far_recent.append(float(np.dot(far, far)))
        if self._far_recent[-1] > FRAME * 1e-7:  # the far end played something (above -70 dBFS)
            self._echo_frames = int(ECHO_TAIL_S * 100)
        elif self._echo_frames == 0:
            return
        self._echo_frames = max(0, self._echo_frames - 1)
        before, after, loudest = float(np.dot(near, near)), float(np.dot(out, out)), max(self._far_recent)
        self._gating = before > after * 10 ** ((HOLD_DB if self._gating else GATE_DB) / 10)
        if loudest > FRAME * 1e-7:
            self._path.append(before / loudest)
            if len(self._path) >= PATH_FRAMES:
                gain = float(np.median(self._path))
                self._gating |= before <= gain * loudest * 10 ** (LEVEL_DB / 10)
        if self._gating:
            out[:] = 0.0

    def _make(self) -> "pywebrtc_audio.AudioProcessor | None":
        if not self.active:
            return None
        return pywebrtc_audio.AudioProcessor(sample_rate=RATE, echo_cancellation=self.echo,
                                             noise_suppression=self.noise is not None,
                                             ns_level=NS_LEVELS.get(self.noise or "", 1))
