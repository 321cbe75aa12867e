"""The two clocks echo cancellation lines up: when the caller's loudspeaker played each reply sample (the
far end), and when the caller's microphone recorded each sample that reached us (the near end).

The server paced every reply sample it sent (the output stage's playback clock says when each chunk was due
to play), so the far end is known on the server's clock, cut where the caller dropped its queue. The near
end is the microphone stream: audio arrives in real time, so a sample's recording time is its arrival less
the network's delay; the smallest delay seen stands for it (a late packet cannot have been recorded later
than it arrived), and the stream's own count of samples times them from there. A sound card of our own
(`talk`) says when its samples were in hand, in its callback, and that is taken instead of their arrival on
the call's event loop, which waits on the models' work: there the smallest delay kept falling as the call
went on (19 ms over a minute, measured through a sound server), and each fall moved the echo under a
canceller that had learnt where it was. What neither clock knows (the client's output buffer, the room, a
phone leg) is a delay of a few hundred milliseconds that the canceller estimates itself.
"""

from collections import deque

import numpy as np

from voicepipe.frontend.run_resampler import RunResampler

RATE = 16000
KEEP_S = 8.0  # far-end audio older than this can no longer be in the microphone
REANCHOR_S = 0.5  # a gap in the microphone stream longer than this (a muted client) starts a new anchor
# A chunk due within this of the last one's end continues it (the output stage queues each at the last one's
# end to the bit; a later one found the client's queue run dry)
CONTINUES_S = 0.001
LATE_S = 0.5  # a start told this late still holds the filter; one older is long past (the far end was not read)
BURST_S = 0.25  # audio arriving this far ahead of real time is no live microphone's (a file streamed fast)


class FarEnd:
    """Reply audio on the server's clock, as the caller's loudspeaker played it, at 16 kHz.

    A client plays the reply's chunks back to back, one stream: a chunk due as the last one ends continues
    it sample after sample, resampled with it as one stream (`RunResampler`), and only a chunk after a gap
    (the client's queue ran dry, a new reply) is placed by its own time. Placed each by its own rounded
    time and resampled on its own, the chunks of one reply stood up to half a sample off the stream the
    loudspeaker played, each its own way; a linear canceller needs its far end within a fraction of one."""

    def __init__(self) -> None:
        # (when its run of back-to-back chunks started playing, its first sample's place in the run, samples):
        # a chunk's samples stand for those of the chunks before it where they overlap
        self._chunks: deque[tuple[float, int, np.ndarray]] = deque()
        self._starts: deque[float] = deque()  # when it started anew after a gap (a client's queue ran dry)
        self._end: float | None = None  # when the last chunk ends
        self._run: tuple[float, RunResampler] | None = None  # the current run's start and its resampler

    def play(self, start: float, samples: np.ndarray, now: float, rate: int = RATE) -> None:
        """`samples` (float32, at `rate`) were due to play from `start`; sent at `now`. What is kept is timed
        from the earlier of the two: a long sentence goes out in several frames at once, queued up to its
        end, and what plays meanwhile must outlast them."""
        gap = self._end is None or start > self._end + CONTINUES_S
        if gap:
            self._starts.append(start)
        if gap or self._run is None or self._run[1].rate != rate or start < self._end - CONTINUES_S:
            self._run = (start, RunResampler(rate))
        place, audio = self._run[1].add(samples.astype(np.float32, copy=False))
        self._chunks.append((self._run[0], place, audio))
        self._end = start + len(samples) / rate
        kept_from = min(start, now) - KEEP_S
        while self._chunks and _start_of(self._chunks[0]) + len(self._chunks[0][2]) / RATE < kept_from:
            self._chunks.popleft()
        while self._starts and self._starts[0] < kept_from:
            self._starts.popleft()

    def started(self, start: float, n: int) -> int | None:
        """The sample of the `n` from `start` (the microphone's next piece, in order) at which the far end
        started anew after a gap, if it did; told once. A start not yet told that lies before the piece is
        told at its first sample: the audio that starts it can reach the front end after the microphone's piece
        it starts in (the call's own work held it up), and a start never told left a filter heard at the last
        reply's lag (the echo came through whole, and barged in)."""
        found = None
        while self._starts and int(round((self._starts[0] - start) * RATE)) < n:
            at = self._starts.popleft()
            if start - at <= LATE_S:
                found = max(0, int(round((at - start) * RATE)))
        return found

    def cut(self, at: float) -> None:
        """The caller dropped what it had queued at `at`: nothing after it played, and what comes next is
        placed afresh."""
        kept: deque[tuple[float, int, np.ndarray]] = deque()
        for chunk in self._chunks:
            if _start_of(chunk) < at:
                kept.append((chunk[0], chunk[1], chunk[2][: max(0, int(round((at - _start_of(chunk)) * RATE)))]))
        self._chunks, self._run = kept, None
        if self._end is not None:
            self._end = min(self._end, at)

    def read(self, start: float, n: int) -> np.ndarray:
        """The `n` samples the loudspeaker played from `start` (silence where it played nothing)."""
        out = np.zeros(n, np.float32)
        for run_start, place, samples in self._chunks:
            offset = int(round((run_start - start) * RATE)) + place  # a run's chunks fall sample after sample
            lo, hi = max(0, offset), min(n, offset + len(samples))
            if lo < hi:
                out[lo:hi] = samples[lo - offset: hi - offset]
        return out


def _start_of(chunk: tuple[float, int, np.ndarray]) -> float:
    return chunk[0] + chunk[1] / RATE


class StreamClock:
    """When sample 0 of a sound stream (at `rate`) was at the sound card, on our clock, from when its pieces
    were seen (a piece can be seen late, never early): its samples are its clock. The pieces of its first
    SETTLE_S place sample 0 (the earliest of them less the samples before it), and after that only a break
    moves it: one the card reports (`restart`), a gap in the stream (a muted client, REANCHOR_S or more),
    or pieces out of line by more than JUMP_S for WINDOW_S on end (a network grown slower, a clock drifted).

    Following the pieces' times further put a wander on the samples that no room has, and a linear
    canceller needs its far end within a fraction of a sample of the echo. Measured through a sound server
    under load, the earliest microphone callback of each second rose 0.1 ms a second and fell back 1.2 ms
    every few seconds, and the speaker's ran 100 ppm ahead of our clock while what it played did not;
    on a websocket call on the same two cores, arrivals held back by the call's own work crept the near
    end's times by up to 3 ms between their resets (followed at 0.2%), and the filter never learnt the room.
    A drift between two clocks is the canceller's to follow (`EchoLag`)."""

    SETTLE_S = 1.0
    WINDOW_S = 2.0
    JUMP_S = 0.02

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.origin: float | None = None
        self._settled_at: float | None = None  # when the first SETTLE_S end
        self._earliest: deque[tuple[float, float]] = deque()  # (time seen, offset), offsets rising: a running min

    def seen(self, position: int, at: float) -> None:
        """Sample `position` of the stream was at the card by `at`."""
        offset = at - position / self.rate
        if self.origin is not None and offset - self.origin > REANCHOR_S:
            self.restart()
        while self._earliest and self._earliest[-1][1] >= offset:
            self._earliest.pop()
        self._earliest.append((at, offset))
        while self._earliest[0][0] < at - self.WINDOW_S:
            self._earliest.popleft()
        earliest = self._earliest[0][1]
        if self._settled_at is None:
            self._settled_at = at + self.SETTLE_S
        if at < self._settled_at or abs(earliest - self.origin) > self.JUMP_S:
            self.origin = earliest

    def time(self, position: int) -> float:
        return self.origin + position / self.rate

    def restart(self) -> None:
        """The stream broke (samples lost or played twice): its next piece sets the origin afresh."""
        self.origin = None
        self._settled_at = None
        self._earliest.clear()


class NearEnd:
    """When each sample of the microphone stream was recorded, on the server's clock."""

    def __init__(self) -> None:
        self.fed = 0  # samples received so far
        self.clock = StreamClock(RATE)  # when each was recorded
        self.card = False  # whether a sound card says so (`recorded_by`), not the samples' arrivals
        self.live = True  # the last samples came no faster than a microphone records them
        self._recent: deque[tuple[float, float]] = deque()  # (arrival, offset) over the last seconds

    def recorded_by(self, position: int, n: int, at: float) -> None:
        """The sound card's word: the `n` samples from `position` on had been recorded by `at` (its callback's
        time). Taken from now on instead of arrivals."""
        if not self.card:
            self.card = True
            self.clock.restart()
        self.clock.seen(position + n, at)

    def feed(self, n: int, now: float) -> float:
        """`n` samples arrived at `now`: when the first of them was recorded."""
        self.fed += n
        offset = now - self.fed / RATE  # position 0's time, were these samples recorded just now
        self._recent.append((now, offset))
        while self._recent[0][0] < now - 2.0:
            self._recent.popleft()
        self.live = offset > max(o for _, o in self._recent) - BURST_S  # not ahead of where it ran lately
        if not self.card:
            self.clock.seen(self.fed, now)
        return self.clock.time(self.fed - n)
