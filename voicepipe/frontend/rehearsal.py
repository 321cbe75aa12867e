"""The reply audio a linear canceller has heard while learning its room, replayed through it between replies.

An adaptive filter learns a step from each frame it hears and then lets the frame go; a call's first
replies are short, so the filter that must hear the caller over them has had a few seconds of echo, once.
Heard again, the same audio teaches it again: measured in the synthetic rooms, five passes over a first
reply of 2 s took the filter's median echo removal on the next from 14-15 dB to 27 dB (heard once, the
filter reached 19.5-21.5 dB only in the fourth reply). The replay runs while the far end is silent, a few
frames beside each of the call's own, so it neither stalls the call nor meets the next reply's echo in the
filter.

The microphone and the far end are kept as they came, from the first reply on, each frame with the
echo's lag where known, so the far end can be delayed as the filter's is at the replay (the lag is found
some way into the first reply, and a client that starts its queue anew moves it by a buffer's step); what
is kept ends every reply with the far end's silence for longer than any delay and the filter's length
together, so replayed in order, each reply starts on an empty filter line, as it did live.
"""

from collections import deque

import numpy as np

from voicepipe.frontend.speex_echo import SpeexEcho

KEEP_S = 6.0  # the latest reply audio kept
PASSES = 5  # over a short first reply; fewer over more, within BUDGET
BUDGET = 2000  # frames replayed at most, each replay (about 0.1 s of CPU)
PER_FRAME = 20  # frames replayed beside each of the call's own (about 1 ms of CPU)


class Rehearsal:
    """The frames kept for replay (microphone, far end as played), and a replay under way."""

    def __init__(self, frame: int) -> None:
        self._frame = frame
        self._near: deque[np.ndarray] = deque(maxlen=int(KEEP_S * 100))
        self._far: deque[np.ndarray] = deque(maxlen=int(KEEP_S * 100))
        self._lags: deque[int | None] = deque(maxlen=int(KEEP_S * 100))  # the echo's lag in each, where known
        self._kept = 0  # frames kept in all
        self._restarted = 0  # ...when the far end last started playing after a gap
        self._queue: list[tuple[np.ndarray, np.ndarray]] = []
        self._last = 0  # frames in the queue when its last pass starts
        self._tail: list[tuple[np.ndarray, np.ndarray]] = []  # the last pass's trailing silence
        self._new = 0  # frames kept since the last replay

    @property
    def running(self) -> bool:
        return bool(self._queue)

    def keep(self, near: np.ndarray, far: np.ndarray, lag: int | None) -> None:
        self._near.append(near.copy())
        self._far.append(far.copy())
        self._lags.append(lag)
        self._kept += 1
        self._new += 1

    def restarted(self) -> None:
        """The far end starts playing after a gap: the client may have started its queue anew, and the echo's
        lag moved with it."""
        self._restarted = self._kept

    def relag(self, lag: int) -> None:
        """The echo's lag since the far end last started playing, as found some way into it."""
        for i in range(max(0, len(self._lags) - (self._kept - self._restarted)), len(self._lags)):
            self._lags[i] = lag

    def start(self, shift: int, lag: int | None, quiet: int, min_frames: int) -> bool:
        """Queue passes over what is kept, the far end delayed by `shift` samples where the echo's lag is
        `lag` (and as much more or less where it was another), where something new is there and at least
        `min_frames` frames in all; whether it started. The last `quiet` frames kept are the far end's
        silence, as the filter hears it."""
        if not self._new or len(self._near) < min_frames:
            return False
        self._new = 0
        far = np.concatenate(self._far)
        delays = np.array([shift if lag is None or kept is None else max(0, shift + kept - lag)
                           for kept in self._lags])
        at = np.arange(len(delays))[:, None] * self._frame - delays[:, None] + np.arange(self._frame)
        lines = np.where(at >= 0, far[np.clip(at, 0, None)], np.float32(0))
        pairs = list(zip(self._near, lines, strict=True))
        self._last = len(pairs)
        self._tail = pairs[-quiet:]
        self._queue = pairs * int(np.clip(BUDGET // len(pairs), 1, PASSES))
        self._queue.reverse()  # popped from the end
        return True

    def step(self, echo: SpeexEcho) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Replay the next PER_FRAME frames; those of the last pass come back, each with the filter's output
        (the filter's before it learnt from that frame), as evidence of what it has learnt."""
        last = []
        for _ in range(min(PER_FRAME, len(self._queue))):
            near, far = self._queue.pop()
            out = echo.process(near, far)
            if len(self._queue) < self._last:
                last.append((near, far, out))
        return last

    def stop(self, echo: SpeexEcho) -> None:
        """End a replay early (the far end plays again): the kept audio's trailing silence is replayed, so
        the filter's line holds silence, as the live far end's does."""
        if self._queue:
            self._queue.clear()
            for near, far in self._tail:
                echo.process(near, far)

    def clear(self) -> None:
        """What is kept was heard in another room."""
        self._near.clear()
        self._far.clear()
        self._lags.clear()
        self._queue.clear()
        self._new = 0
