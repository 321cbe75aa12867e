"""A linear canceller beside AEC3, whose output replaces AEC3's once it has proven it removes the echo.

AEC3's suppressor cannot tell a caller from the echo when the echo is the louder: measured in the synthetic
rooms (echo 6 dB above the caller), it took a median 15-24 dB off a caller talking over the reply, and in
the interruptions it caught late or missed, 18-46 dB of their first 300 ms; the barge-in rule then heard
them late or not at all (7 in 10 within 300 ms). Speex's linear filter leaves the caller as they were and,
once it has learnt the room, takes 30-35 dB off the echo alone (`frontend/speex_echo.py`). It learns slowly
(12-23 s of reply audio in those rooms), cannot follow an echo path it does not model (a loudspeaker's
distortion, a delay past its tail), and does nothing for a room's noise. So AEC3 runs beside it on the
microphone as before, and the call hears AEC3's output until the linear filter's own output proves clean:
over the last WINDOW frames the far end played loudly in, the echo it removed (the microphone's level over
its output's) stands at PROVEN_DB or more at the 75th percentile, a frame it took down to the room's noise
counting as clean. A quarter of the frames may hold the caller, whose own voice the filter leaves (0 dB
removed) without unproving it. When the latest frames fall under DOUBT_DB (a room that changed, a phone
leg whose delay moved) the filter starts again from nothing and AEC3's output is heard meanwhile.

(Fed AEC3 with the linear filter's output instead, the two did better in a long stream, but in a call of
short replies, cut early, the filter's first seconds left AEC3 an echo path it could not follow: the echo
came through and held the VAD's utterance open over the caller's next five questions.)
"""

from collections import deque

import numpy as np

from voicepipe.frontend.speex_echo import SpeexEcho, library

# The filter's length, from where the echo starts: the far end reaches it delayed by the echo path's lag
# (`EchoPath.lag`, less a margin). Aligned so, with 300 ms of filter, it was trusted after 9.4 s of replies in
# the synthetic rooms, against 19-20 s unaligned with the 600 ms that 300 ms of unknown delay would need.
TAIL_S = 0.3
MARGIN = 5  # frames of the lag left to the filter when aligning: the lag judged may fall either side of the echo
NEAR = 2  # ...and never fewer than these
SLACK = 10  # frames the echo path's lag may move later before the filter is aligned again
WINDOW = 500  # loud far-end frames judged (5 s of the reply at its loudest)
RECENT = 100  # ...and doubted on the latest of them (1-2 s), every DOUBT_EVERY far-end frames
JUDGE_EVERY = 50
DOUBT_EVERY = 10
PROVEN_DB = 20.0
DOUBT_DB = 14.0
LOUD = 2.0  # far-end frames within 20 dB (in log10 of energy) of the loudest of the window
FAR_ACTIVE = 160 * 1e-7
FLOOR_FRAMES = 1000  # the microphone's last 10 s, for its noise floor
AT_FLOOR_DB = 3.0
ABOVE_FLOOR_DB = 6.0
FLOOR = 1e-12


class LinearStage:
    """The linear canceller of one call, and whether its output is trusted."""

    def __init__(self, rate: int, frame: int) -> None:
        lib = library()
        self._echo = SpeexEcho(lib, rate, frame, int(TAIL_S * rate)) if lib is not None else None
        self._frame = frame
        self._shift: int | None = None  # frames the far end is delayed by, once the echo path's lag is known
        self._far: deque[np.ndarray] = deque(maxlen=1)
        self._frames: deque[tuple[float, float]] = deque(maxlen=4 * WINDOW)  # (far's log energy, dB removed)
        self._recent: deque[float] = deque(maxlen=RECENT)  # dB removed in the latest loud frames
        self._loudest = np.inf  # the far end's loudest frame in the window (log10 of energy)
        self._levels: deque[float] = deque(maxlen=FLOOR_FRAMES)  # the microphone's frame energies
        self._floor = 0.0  # their 10th percentile: the room's noise
        self._heard = 0
        self._since = 0
        self.proven = False
        self.wrong = False  # whether the latest frame came out louder than it went in
        self.removed = 0.0  # dB the latest frame lost

    @property
    def available(self) -> bool:
        return self._echo is not None

    @property
    def delay_frames(self) -> int | None:
        """How late the far end reaches the filter (None until the echo path's lag is known)."""
        return self._shift

    def process(self, near: np.ndarray, far: np.ndarray, lag: int | None) -> np.ndarray:
        """The microphone frame less the echo the filter predicts (the frame itself without libspeexdsp);
        `lag` is the echo path's, in frames, where known."""
        if self._echo is None:
            return near
        if lag is not None and not self.proven and self._misaligned(lag):
            self._align(max(0, lag - MARGIN))
        self._far.append(far)
        out = self._echo.process(near, self._far[0])
        before, after = float(np.dot(near, near)), float(np.dot(out, out))
        # Louder out than in: it subtracted an echo that was not there (a filter still learning the delay,
        # or one that learnt another room); the frame is not its to give.
        self.wrong = after > before
        if self.wrong:
            out, after = near, before
        self.removed = 10 * np.log10((before + FLOOR) / (after + FLOOR))
        self._levels.append(before)
        self._heard += 1
        if self._heard % JUDGE_EVERY == 0:
            self._floor = float(np.percentile(self._levels, 10))
        far_energy = float(np.dot(far, far))
        # A frame whose echo is lost in the room's noise says nothing of the filter; one it took down to that
        # noise is as clean as a filter can make it there, and counts as clean.
        if far_energy > FAR_ACTIVE and before > self._floor * 10 ** (ABOVE_FLOOR_DB / 10):
            level = float(np.log10(far_energy))
            at_floor = after <= self._floor * 10 ** (AT_FLOOR_DB / 10)
            removed = max(self.removed, PROVEN_DB) if at_floor else self.removed
            self._frames.append((level, removed))
            if level >= self._loudest - LOUD:
                self._recent.append(removed)
            self._since += 1
            if self._since % DOUBT_EVERY == 0 and self.proven and len(self._recent) >= RECENT // 2 \
                    and np.percentile(self._recent, 75) < DOUBT_DB:
                self._forget()
            if self._since >= JUDGE_EVERY:
                self._since = 0
                self._judge()
        return out

    def _forget(self) -> None:
        """The room changed under the filter: it learns it again from nothing, as at the call's start (what
        it learnt is no nearer the new room than nothing), aligned again to the echo path's lag."""
        self._shift = None
        self._restart()

    def _misaligned(self, lag: int) -> bool:
        """Whether the filter, as delayed now, starts too near an echo `lag` frames late (or after it), or so
        far before it that its length no longer covers the room. The lag judged wanders by a few frames,
        mostly earlier as evidence gathers, and each new start costs seconds of learning: MARGIN absorbs it."""
        return self._shift is None or max(0, lag - NEAR) < self._shift or lag - MARGIN > self._shift + SLACK

    def _align(self, frames: int) -> None:
        """The far end from now on reaches the filter `frames` late: it starts learning again from there."""
        self._shift = frames
        self._far = deque([np.zeros(self._frame, np.float32)] * frames, maxlen=frames + 1)
        self._restart()

    def _restart(self) -> None:
        self._echo.reset()
        self._frames.clear()
        self._recent.clear()
        self.proven = False

    def _judge(self) -> None:
        frames = np.array(self._frames)
        self._loudest = frames[:, 0].max()
        loud = frames[frames[:, 0] >= self._loudest - LOUD][-WINDOW:, 1]
        if len(loud) >= WINDOW // 2 and np.percentile(loud, 75) >= PROVEN_DB \
                and len(self._recent) >= RECENT // 2 and np.percentile(self._recent, 75) >= DOUBT_DB:
            self.proven = True
