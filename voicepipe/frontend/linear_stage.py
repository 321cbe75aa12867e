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

from voicepipe.frontend.echo_lag import EchoLag
from voicepipe.frontend.speex_echo import SpeexEcho, library

# The filter's length, from where the echo starts: the far end reaches it delayed by the echo's lag, less a
# margin. Aligned so, with 300 ms of filter, it was trusted after 9.4 s of replies in the synthetic rooms,
# against 19-20 s unaligned with the 600 ms that 300 ms of unknown delay would need. The lag is the sample's
# (`EchoLag`) once two estimates in a row agree, and the filter's far end follows it when it moves, keeping
# what it learnt; until then the frames' (`EchoPath.lag`), to 10 ms.
TAIL_S = 0.3
LEAD = 160  # samples of the sample-exact lag left to the filter when aligning: a loudspeaker's own delay spread
AGREE = 16  # samples two estimates in a row may differ by and still be one lag
MOVED = 2  # samples the lag must move by for the far end to follow
FOLLOWED = 320  # ...and may move by at most (20 ms: a buffer's step); further, another path: learnt anew
MARGIN = 5  # frames of the frames' lag left to the filter: the lag judged may fall either side of the echo
NEAR = 2  # ...and never fewer than these
SLACK = 10  # frames the frames' lag may move later before the filter is aligned again
WINDOW = 250  # loud far-end frames judged (2.5 s of the reply at its loudest)
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
        self._tail = int(TAIL_S * rate)
        self._echo = SpeexEcho(lib, rate, frame, self._tail) if lib is not None else None
        self._frame = frame
        self._shift: int | None = None  # samples the far end is delayed by, once the echo's lag is known
        self._line = np.zeros(frame, np.float32)  # the far end's latest samples, as far back as the shift
        self._lag = EchoLag(rate, frame)
        self._estimate: int | None = None  # the latest sample-exact lag estimated
        self._anchor: int | None = None  # the sample-exact lag the filter's far end is aligned to
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
    def delay_frames(self) -> float | None:
        """How late the far end reaches the filter, in frames (None until the echo's lag is known)."""
        return None if self._shift is None else self._shift / self._frame

    def process(self, near: np.ndarray, far: np.ndarray, lag: int | None) -> np.ndarray:
        """The microphone frame less the echo the filter predicts (the frame itself without libspeexdsp);
        `lag` is the echo path's, in frames, where known."""
        if self._echo is None:
            return near
        self._follow(self._lag.add(near, far))
        if self._anchor is None and lag is not None and not self.proven and self._misaligned(lag):
            self._align(max(0, lag - MARGIN) * self._frame)
        self._line = np.concatenate([self._line, far])[-(self._frame + (self._shift or 0)):]
        out = self._echo.process(near, self._line[:self._frame])
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
                # The echo moved before two estimates agreed on it (the filter unlearns while out of line),
                # or the room changed.
                lag = self._lag.now()
                if lag is None or self._anchor is None or not self._move(lag):
                    self._forget()
            if self._since >= JUDGE_EVERY:
                self._since = 0
                self._judge()
        return out

    def _follow(self, lag: int | None) -> None:
        """A sample-exact estimate of the echo's lag (None: none due, or none clear). Two in a row agreeing
        align the filter there, where it was not yet; once aligned, the far end moves with the lag, and the
        filter keeps what it learnt, unless the echo has left its reach."""
        if lag is None:
            return
        estimate, self._estimate = self._estimate, lag
        if estimate is None or abs(lag - estimate) > AGREE:
            return
        if self._anchor is None:
            self._anchor = lag
            if self._shift is None or not 0 <= lag - self._shift < self._tail // 2:
                self._align(max(0, lag - LEAD))  # (where the frames' lag put it well before the echo, it stays)
        else:
            self._move(lag)

    def _move(self, lag: int) -> bool:
        """Whether the echo's lag has moved from where the filter's far end is aligned; if so the far end
        moves with it."""
        moved = lag - self._anchor
        if abs(moved) < MOVED:
            return False
        self._anchor, shift = lag, self._shift + moved
        if shift >= 0 and abs(moved) <= FOLLOWED:
            self._shift = shift
            self._recent.clear()  # the doubt's evidence was of frames out of line
        else:
            self._align(max(0, lag - LEAD))
        return True

    def _forget(self) -> None:
        """The room changed under the filter: it learns it again from nothing, as at the call's start (what
        it learnt is no nearer the new room than nothing), aligned again to the echo's lag."""
        if self._anchor is None:
            self._shift = None
        self._restart()

    def _misaligned(self, lag: int) -> bool:
        """Whether the filter, as delayed now, starts too near an echo `lag` frames late (or after it), or so
        far before it that its length no longer covers the room. The lag judged wanders by a few frames,
        mostly earlier as evidence gathers, and each new start costs seconds of learning: MARGIN absorbs it."""
        if self._shift is None:
            return True
        shift = self._shift // self._frame
        return max(0, lag - NEAR) < shift or lag - MARGIN > shift + SLACK

    def _align(self, samples: int) -> None:
        """The far end from now on reaches the filter `samples` late: it starts learning again from there."""
        self._shift = samples
        self._line = np.zeros(self._frame + samples, np.float32)
        self._restart()

    def _restart(self) -> None:
        self._echo.reset()
        self._frames.clear()
        self._recent.clear()
        self._since = 0
        self.proven = False

    def _judge(self) -> None:
        frames = np.array(self._frames)
        self._loudest = frames[:, 0].max()
        loud = frames[frames[:, 0] >= self._loudest - LOUD][-WINDOW:, 1]
        if len(loud) >= WINDOW // 2 and np.percentile(loud, 75) >= PROVEN_DB \
                and len(self._recent) >= RECENT // 2 and np.percentile(self._recent, 75) >= DOUBT_DB:
            self.proven = True
