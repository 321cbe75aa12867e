"""One call's audio processing: Speex's linear canceller and WebRTC's AEC3 side by side, then WebRTC's noise
suppressor.

AEC3 was chosen by measurement among PyPI's cancellers (`scripts/echo-candidates.py`,
docs/audio-front-end.md): pywebrtc-audio's AEC3 cancelled 17-26 dB of echo in the synthetic rooms within
one reply, livekit's APM build of the same AEC3 12-20 dB; it takes float32 numpy frames with no runtime of
its own, in a wheel under 1 MB. It finds the echo's delay itself up to about 400 ms past the far end's timing
(measured: 26 dB at 250 ms, 16 dB at 400 ms, none at 550 ms). The linear canceller beside it keeps a
caller talking over a louder echo, which AEC3's suppressor takes down (`frontend/linear_stage.py`).

WebRTC's noise suppressor was chosen the same way (`scripts/noise-candidates.py`): in steady noise it helps
Whisper as much as RNNoise or DeepFilterNet3 do, for a thirtieth of their CPU or less, and none of them
helps in babble. Its output is for the ASR, and only where the room is noisy; the VAD judges the audio
before it (`unsuppressed`). After it, an expander takes what stands well under the caller's voice further
down (`frontend/expander.py`), for the ASR too.
"""

from collections import deque
from typing import Literal

import numpy as np
import pywebrtc_audio

from voicepipe.frontend.echo_path import EchoPath
from voicepipe.frontend.expander import Expander
from voicepipe.frontend.linear_stage import LinearStage

RATE = 16000
FRAME = RATE // 100  # the module works in 10 ms frames
SILENCE = np.zeros(FRAME, np.float32)  # the far end where no loudspeaker is heard
# -100 dBFS of noise under the far end, always: a reply falling to digital silence leaves AEC3's filters
# full of subnormal numbers, and it ran 5 times slower on them (measured: 95-120 ms per second of audio
# over a call in a synthetic room, 19 ms with this).
DITHER = np.random.default_rng(0).standard_normal(FRAME).astype(np.float32) * np.float32(1e-5)
# A frame the trusted linear filter took more than this off was echo, and what is left its residue (25 dB
# down, still a voice to the VAD): a caller talking over an echo even 10 dB louder loses about 10 dB there.
RESIDUE_DB = 15.0
NoiseReduction = Literal["near_field", "far_field"] | None
# WebRTC NS levels 0-3 suppress 6, 12, 18 and 21 dB: a close microphone needs less than a room's.
NS_LEVELS = {"near_field": 1, "far_field": 2}
# The suppressor's output is heard only while the room's noise floor (the 10th percentile of the last
# NOISE_FRAMES frames' levels, before it) stands above NOISY_DBFS, until it falls QUIETER_DB under that.
# Measured with the default Whisper (scripts/noise-candidates.py' streams, the call's padding around each
# question): at 10 dB SNR (a floor near -40 dBFS under a voice at -26) it took word error from 0.38 to 0.35
# in pink noise and 0.53 to 0.45 in babble; at 20 and 30 dB SNR it neither helped nor harmed; in a quiet room
# (-70 dBFS) it harmed, 0.20 to 0.24: it bends a clean voice too ("Romeo and Juliet" -> "Robodo and do it").
NOISY_DBFS = -45.0
QUIETER_DB = 5.0
NOISE_FRAMES = 500
NOISE_EVERY = 50


class AudioProcessing:
    """Echo cancellation and noise suppression over a stream of any chunk sizes, in 10 ms frames: what
    comes out lags what went in by less than a frame (the rest of a frame waits for the next chunk).

    Where the loudspeaker is heard, the linear canceller and AEC3 each cancel every frame; the call hears
    the linear canceller's output once it has proven clean (less the frames it found to be echo), AEC3's
    (with the residue gate) until then and whenever it is in doubt (`frontend/linear_stage.py`). The
    suppressor comes last, and the expander after it (`frontend/expander.py`), both heard in a noisy room
    only."""

    def __init__(self, echo: bool, noise: NoiseReduction) -> None:
        self.echo, self.noise = echo, noise
        self._near = np.zeros(0, np.float32)
        self._far = np.zeros(0, np.float32)
        self.path = EchoPath()
        self.linear = LinearStage(RATE, FRAME)
        self._aec, self._ns = self._make_aec(), self._make_ns()
        self._expander = Expander()
        self._rng = np.random.default_rng(1)
        self._restart: int | None = None  # where the far end starts anew, in the samples not yet processed
        self.unsuppressed: np.ndarray | None = None  # the last output as it was before the suppressor
        self._levels: deque[float] = deque(maxlen=NOISE_FRAMES)  # frames' mean squares, before the suppressor
        self.noisy = False  # whether the room's noise floor calls for the suppressor
        self._judged = 0

    @property
    def active(self) -> bool:
        return self.echo or self.noise is not None

    @property
    def canceller(self) -> str:
        """What the call hears of the cancellers: "off", "aec3" (the linear filter learning the room, in
        doubt, held at a fresh start, or without libspeexdsp), or "linear" (its output, trusted)."""
        if not self.echo:
            return "off"
        return "linear" if self.linear.trusted else "aec3"

    def configure(self, echo: bool, noise: NoiseReduction) -> None:
        """New settings; the canceller keeps what it learnt of the room when only the suppressor changes."""
        if echo != self.echo:
            self.echo = echo
            self.linear = LinearStage(RATE, FRAME)
            self._aec = self._make_aec()
        if noise != self.noise:
            self.noise = noise
            self._ns = self._make_ns()

    def process(self, near: np.ndarray, far: np.ndarray, restart: int | None = None) -> np.ndarray:
        """The cleaned microphone audio for `near` (float32), whose loudspeaker audio over the same time was
        `far` (which starts anew after a gap at sample `restart`, where it does); as many whole frames as are
        complete. Where the suppressor ran, `unsuppressed` holds the same frames before it."""
        self.unsuppressed = None
        if not self.active:
            return near
        if restart is not None:
            self._restart = len(self._near) + restart
        self._near = np.concatenate([self._near, near.astype(np.float32, copy=False)])
        self._far = np.concatenate([self._far, far.astype(np.float32, copy=False)])
        n = len(self._near) // FRAME * FRAME
        cancelled = np.empty(n, np.float32)
        for i in range(0, n, FRAME):
            frame = self._near[i:i + FRAME]
            if self._restart is not None and self._restart < i + FRAME:
                self._restart = None
                self.linear.restarted()
            cancelled[i:i + FRAME] = self._cancel(frame, self._far[i:i + FRAME]) if self._aec else frame
        self._near, self._far = self._near[n:], self._far[n:]
        if self._restart is not None:
            self._restart -= n
        if not self._ns:
            return cancelled
        self.unsuppressed = cancelled
        out = np.empty(n, np.float32)
        for i in range(0, n, FRAME):
            frame = cancelled[i:i + FRAME]
            # every frame through both, so the suppressor's noise and the expander's voice stay current
            expanded = self._expander.process(self._ns.process(frame))
            out[i:i + FRAME] = expanded if self.noisy else frame
            self._judge_noise(frame)
        return out

    def _cancel(self, near: np.ndarray, far: np.ndarray) -> np.ndarray:
        echoing = self.path.far(far) and self.path.present
        self.path.near(near)
        # every frame: its lag and far end run unbroken
        linear = self.linear.process(near, far, self.path.lag, self.path.present)
        if not echoing:
            return self._aec.process(near, SILENCE + DITHER)
        cancelled = self._aec.process(near, far + DITHER)
        if self.linear.trusted and not self.linear.wrong:
            return linear if self.linear.removed < RESIDUE_DB else self._room()
        return self._room() if self.path.residue(near, cancelled) else cancelled

    def _judge_noise(self, frame: np.ndarray) -> None:
        """Whether the room is noisy, by its noise floor before the suppressor (which the suppressor's own
        output would hide), judged every NOISE_EVERY frames."""
        self._levels.append(float(np.dot(frame, frame)) / FRAME)
        self._judged += 1
        if self._judged % NOISE_EVERY:
            return
        floor = 10 * np.log10(np.percentile(self._levels, 10) + 1e-12)
        self.noisy = floor > NOISY_DBFS - (QUIETER_DB if self.noisy else 0.0)

    def _room(self) -> np.ndarray:
        """What stands for a frame silenced as echo: the room's own noise at its quiet level (comfort noise).
        Digital silence there set the VAD's level floor to -100 dBFS, and any residue of the echo then stood
        far enough over it to count as speech (a false barge-in in the first reply of the 250 ms room)."""
        noise = self._rng.standard_normal(FRAME, np.float32)
        return noise * np.float32(np.sqrt(self.path.floor / FRAME))

    def _make_aec(self) -> "pywebrtc_audio.AudioProcessor | None":
        return pywebrtc_audio.AudioProcessor(sample_rate=RATE, echo_cancellation=True) if self.echo else None

    def _make_ns(self) -> "pywebrtc_audio.NoiseSuppressor | None":
        if self.noise is None:
            return None
        return pywebrtc_audio.NoiseSuppressor(sample_rate=RATE, level=NS_LEVELS[self.noise])
