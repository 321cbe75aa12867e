"""What the microphone hears of the loudspeaker, frame by frame: whether the far end may still be echoing,
whether there is an echo path at all, and whether a cancelled frame holds anything but echo.

AEC3 starts out assuming an echo path and suppresses hard until it has found one: measured here with no
echo at all (headphones, a client with its own canceller), it silenced 258 of 437 frames of a caller
speaking over the reply. So the far end is handed to it only where the loudspeaker is heard: the
microphone's level follows the far end's, syllable by syllable, some delay later. (Comparing levels alone
failed in a clean room: a microphone that sends digital silence between the caller's words has a floor any
echo tail stands over, and the far end's loud frames then fell on the tail's quiet ones.)
"""

from collections import deque

import numpy as np

FRAME = 160  # 10 ms at 16 kHz
ECHO_TAIL_S = 0.6  # after the far end falls silent, its echo may still be in the room this long
FAR_ACTIVE = FRAME * 1e-7  # a far-end frame's energy above -70 dBFS: something played
FLOOR = FRAME * 1e-10  # -100 dBFS: digital silence's level, for logarithms
# The echo path is there when the microphone's log level follows the far end's: their correlation over
# the frames the far end played in (the last 10 s of them), at the best delay up to MAX_LAG frames, stands
# over FOLLOWS (measured in synthetic rooms: a caller talking over the reply, pink noise or babble, up to
# 0.33 on the first 50 frames and near 0.1 after; an echo, 6 dB above the caller or 6 dB below with pink
# noise 10 dB below the caller, 0.67-0.82). Until EVIDENCE such frames are seen it is assumed there: a
# speakerphone's first reply is where a missed echo costs most.
FOLLOWS = 0.4
# ...and the echo is there whenever the far end is loud: at that delay, the microphone stands COVER_DB over
# its quietest tenth in COVERS of the frames within LOUD_DB of the far end's loudest. (A caller who talks
# over replies now and then, into a microphone that sends digital silence otherwise, drew correlations up
# to 0.7 from fewer than 150 frames: their words start as the reply plays and stop it.)
COVERS = 0.8
COVER_DB = 3.0
LOUD_DB = 20.0
MAX_LAG = 50  # 500 ms: past AEC3's reach of the delay
# Until then, a microphone that has sent digital silence (under -90 dBFS) for SILENT frames belongs to a client
# that gates or cleans its own input (a client with its own canceller, headphones behind a noise gate): a raw
# microphone in a room never records zeros, its own noise is above them. Its loudspeaker is taken for not
# heard until the evidence says otherwise. Assuming an echo there, AEC3 took 30-70 dB off a caller who spoke
# from the first reply's first syllable (measured on the recorded call), leaving the ASR nothing to
# transcribe.
DIGITAL_SILENCE = FRAME * 1e-9
SILENT = 20
EVIDENCE = 50
HISTORY = 1000
# The residue gate, while AEC3 is still learning the room (its first LEARN_S of echo) and at every onset
# (ONSET_S from the far end's start after a silence, where it lets 100-200 ms through: measured in the
# synthetic rooms, 8-13 dB taken off there against 40-60 dB a moment later). The VAD scores a voice by its
# shape, not its loudness, so there a frame the canceller took more than GATE_DB off is echo alone and is
# silenced (once gating, down to HOLD_DB); while learning, so is a frame no louder than the far end's
# recent loudest times the echo path's usual gain, LEVEL_DB over it. Only then: AEC3 itself takes about
# 9 dB off a caller talking over an echo 6 dB louder than them, and gating on as well lost half of what
# the VAD still heard of them (the level gate, two thirds).
LEARN_S = 3.0
ONSET_S = 0.6
GATE_DB = 12.0
HOLD_DB = 5.0
LEVEL_DB = 3.0


def energy(x: np.ndarray) -> float:
    return float(np.dot(x, x))


class EchoPath:
    def __init__(self) -> None:
        self._far_recent: deque[float] = deque(maxlen=int(ECHO_TAIL_S * 100))  # far-end frame energies
        self._gain: deque[float] = deque(maxlen=300)  # microphone over the far end's loudest, while it plays
        self._learnt = 0  # frames of echo the canceller has had to learn from
        self._echo_frames = 0  # frames to come that the far end may still be echoing in
        self._recent: deque[tuple[float, float]] = deque(maxlen=MAX_LAG + 1)  # (far, mic) log energies
        self._mic: deque[float] = deque(maxlen=HISTORY)  # the microphone's log energies, for its floor
        # The frames the far end played in, each with the microphone's levels over the MAX_LAG frames after it:
        # the evidence gathers across replies however far apart they came.
        self._played: deque[tuple[float, np.ndarray]] = deque(maxlen=HISTORY)
        self._onset_frames = 0  # frames to come of the far end's onset
        self._gating = False
        self._frames = 0
        self._judged: bool | None = None
        self._silent = 0  # frames of digital silence heard before a verdict
        self._judged_at = 0
        self.lag: int | None = None  # frames from the far end to the first delay the microphone follows it at
        # The energy of the quietest tenth of the microphone's frames that no echo can be in: the room's noise
        # (0 until such a frame is heard).
        self.floor = 0.0
        self._unechoed: deque[float] = deque(maxlen=HISTORY)

    def far(self, far: np.ndarray) -> bool:
        """A far-end frame; whether its echo may be in the microphone's frame of the same time."""
        self._frames += 1
        self._far_recent.append(energy(far))
        if self._far_recent[-1] > FAR_ACTIVE:
            if not self._echo_frames:
                self._onset_frames = int(ONSET_S * 100)
            self._echo_frames = int(ECHO_TAIL_S * 100)
        elif self._echo_frames:
            self._echo_frames -= 1
        self._onset_frames = max(0, self._onset_frames - 1)
        return self._echo_frames > 0

    @property
    def present(self) -> bool:
        """Whether the loudspeaker may be heard: assumed until the evidence says otherwise."""
        return self.verdict is not False

    @property
    def verdict(self) -> bool | None:
        """Whether the loudspeaker is heard, None until EVIDENCE frames of the far end have played (judged
        again every EVIDENCE frames: it changes slowly). A verdict holds until new evidence overturns it: going
        back to assuming an echo while the evidence was thin gated away a caller with none."""
        if self._judged_at == 0 or self._frames - self._judged_at >= EVIDENCE:
            judged, self._judged_at = self._judge(), self._frames
            if judged is not None:
                self._judged = judged
        return self._judged

    def _judge(self) -> bool | None:
        if len(self._played) < EVIDENCE:
            return None
        x = np.array([far for far, _ in self._played])
        after = np.stack([mic for _, mic in self._played])
        loud = x > np.percentile(x, 95) - LOUD_DB / 10  # frames whose echo stands out of any room's noise
        quiet = np.percentile(self._mic, 10) + COVER_DB / 10
        for lag in range(MAX_LAG + 1):
            y = after[:, lag]
            if np.std(y) > 0 and np.mean(y[loud] > quiet) >= COVERS and float(np.corrcoef(x, y)[0, 1]) > FOLLOWS:
                self.lag = lag
                return True
        return False

    def near(self, near: np.ndarray) -> None:
        """A microphone frame, its level beside the far end's of the same time."""
        e, loudest = energy(near), max(self._far_recent, default=0.0)
        self._recent.append((np.log10(self._far_recent[-1] + FLOOR), np.log10(e + FLOOR)))
        self._mic.append(self._recent[-1][1])
        if not self._echo_frames:  # no echo can be in it: the room's own noise, and the caller
            self._unechoed.append(self._recent[-1][1])
            if len(self._unechoed) % EVIDENCE == 1 or self._frames % EVIDENCE == 0:  # soon, then every 0.5 s
                self.floor = 10 ** float(np.percentile(self._unechoed, 10))
        if len(self._recent) > MAX_LAG and self._recent[0][0] > np.log10(FAR_ACTIVE):
            self._played.append((self._recent[0][0], np.array([mic for _, mic in self._recent])))
        if loudest > FAR_ACTIVE:
            self._gain.append(e / loudest)
        if self._judged is None and e < DIGITAL_SILENCE:
            self._silent += 1
            if self._silent >= SILENT:
                self._judged = False

    def residue(self, near: np.ndarray, out: np.ndarray) -> bool:
        """Whether the cancelled frame `out` of microphone frame `near` is echo alone; called for the frames
        the far end may be echoing in, while the echo path is present."""
        self._learnt += 1
        learning = self._learnt < LEARN_S * 100
        if not (learning or self._onset_frames):
            self._gating = False
            return False
        before, after = energy(near), energy(out)
        self._gating = before > after * 10 ** ((HOLD_DB if self._gating else GATE_DB) / 10)
        loudest = max(self._far_recent)
        if learning and loudest > FAR_ACTIVE and len(self._gain) >= EVIDENCE:
            self._gating |= before <= float(np.median(self._gain)) * loudest * 10 ** (LEVEL_DB / 10)
        return self._gating
