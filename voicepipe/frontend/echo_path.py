"""What the microphone hears of the loudspeaker, frame by frame: whether the far end may still be echoing,
whether there is an echo path at all, and whether a cancelled frame holds anything but echo.

AEC3 starts out assuming an echo path and suppresses hard until it has found one: measured here with no
echo at all (headphones, a client with its own canceller), it silenced 258 of 437 frames of a caller
speaking over the reply. So the far end is handed to it only where the loudspeaker is heard: the
microphone's level while the far end plays stands above its level in silence.
"""

from collections import deque

import numpy as np

FRAME = 160  # 10 ms at 16 kHz
ECHO_TAIL_S = 0.6  # after the far end falls silent, its echo may still be in the room this long
FAR_ACTIVE = FRAME * 1e-7  # a far-end frame's energy above -70 dBFS: something played
# The echo path is there when, while the far end plays (the last 10 s of it), the microphone's level
# follows the far end's (their log levels correlate above FOLLOWS: a caller talking over the reply does not
# follow it) and its median stands PATH_DB over its noise floor in silence (the 10th percentile there, so
# the caller's own words do not count); until EVIDENCE frames of each are seen,
# it is assumed there (a speakerphone's first reply is where a missed echo costs most).
PATH_DB = 6.0
FOLLOWS = 0.3
EVIDENCE = 50
# The residue gate: the VAD scores a voice by its shape, not its loudness, so even 25 dB of cancellation
# leaves a residue it calls speech. While the far end may be echoing, a frame the canceller took more than
# GATE_DB off is echo alone and is silenced (once gating, down to HOLD_DB); so is a frame no louder than
# the far end's recent loudest times the echo path's usual gain, LEVEL_DB over it (where the canceller lost
# its grip: a new delay, a tail past its filter). A caller talking over the reply keeps the frame within a
# few dB of the microphone's.
GATE_DB = 12.0
HOLD_DB = 5.0
LEVEL_DB = 3.0


def energy(x: np.ndarray) -> float:
    return float(np.dot(x, x))


class EchoPath:
    def __init__(self) -> None:
        self._far_recent: deque[float] = deque(maxlen=int(ECHO_TAIL_S * 100))  # far-end frame energies
        self._echo_frames = 0  # frames to come that the far end may still be echoing in
        self._quiet: deque[float] = deque(maxlen=500)  # microphone energies, far end silent and its echo gone
        self._busy: deque[tuple[float, float]] = deque(maxlen=1000)  # (microphone, far end) log energies
        self._gain: deque[float] = deque(maxlen=300)  # microphone over the far end's loudest, while it plays
        self._gating = False
        self._frames = 0
        self._judged: bool | None = None
        self._judged_at = 0

    def far(self, far: np.ndarray) -> bool:
        """A far-end frame; whether its echo may be in the microphone's frame of the same time."""
        self._frames += 1
        self._far_recent.append(energy(far))
        if self._far_recent[-1] > FAR_ACTIVE:
            self._echo_frames = int(ECHO_TAIL_S * 100)
        elif self._echo_frames:
            self._echo_frames -= 1
        return self._echo_frames > 0

    @property
    def present(self) -> bool:
        """Whether the loudspeaker is heard (judged again every EVIDENCE frames: it changes slowly)."""
        if self._judged is None or self._frames - self._judged_at >= EVIDENCE:
            self._judged, self._judged_at = self._judge(), self._frames
        return self._judged

    def _judge(self) -> bool:
        if len(self._quiet) < EVIDENCE or len(self._busy) < EVIDENCE:
            return True
        mic, far = np.array(self._busy).T
        floor = np.log10(max(float(np.percentile(self._quiet, 10)), FRAME * 1e-10))
        if np.median(mic) <= floor + PATH_DB / 10:
            return False
        return np.std(mic) > 0 and np.std(far) > 0 and float(np.corrcoef(mic, far)[0, 1]) > FOLLOWS

    def near(self, near: np.ndarray) -> None:
        """A microphone frame, for the level it shows with the far end playing or silent."""
        e, loudest = energy(near), max(self._far_recent, default=0.0)
        if loudest > FAR_ACTIVE:
            self._busy.append((np.log10(e + FRAME * 1e-10), np.log10(loudest)))
            self._gain.append(e / loudest)
        elif not self._echo_frames:
            self._quiet.append(e)

    def residue(self, near: np.ndarray, out: np.ndarray) -> bool:
        """Whether the cancelled frame `out` of microphone frame `near` is echo alone."""
        if not self._echo_frames:
            self._gating = False
            return False
        before, after, loudest = energy(near), energy(out), max(self._far_recent)
        self._gating = before > after * 10 ** ((HOLD_DB if self._gating else GATE_DB) / 10)
        if loudest > FAR_ACTIVE and len(self._gain) >= EVIDENCE:
            self._gating |= before <= float(np.median(self._gain)) * loudest * 10 ** (LEVEL_DB / 10)
        return self._gating
