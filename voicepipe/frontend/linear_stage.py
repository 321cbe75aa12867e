"""A linear canceller beside AEC3, whose output replaces AEC3's once it has proven it removes the echo.

AEC3's suppressor cannot tell a caller from the echo when the echo is the louder: measured in the synthetic
rooms (echo 6 dB above the caller), it took a median 15-24 dB off a caller talking over the reply, and in
the interruptions it caught late or missed, 18-46 dB of their first 300 ms; the barge-in rule then heard
them late or not at all (7 in 10 within 300 ms). Speex's linear filter leaves the caller as they were and,
once it has learnt the room, takes 30-35 dB off the echo alone (`frontend/speex_echo.py`). It learns slowly
(12-23 s of reply audio in those rooms; so, until proven, it hears each reply again in the silence after
it, `frontend/rehearsal.py`), cannot follow an echo path it does not model (a loudspeaker's
distortion, a delay past its tail), and does nothing for a room's noise. So AEC3 runs beside it on the
microphone as before, and the call hears AEC3's output until the linear filter's own output proves clean:
over the last WINDOW frames the far end played loudly in, the echo it removed (the microphone's level over
its output's) stands at PROVEN_DB or more at the 75th percentile and MEDIAN_DB at the median, a frame it
took down to the room's noise counting as clean. A quarter of the frames may hold the caller, whose own
voice the filter leaves (0 dB removed) without unproving it. When the latest frames fall under DOUBT_DB (a
room that changed, a phone leg whose delay moved) the filter starts again from nothing and AEC3's output is
heard meanwhile. Where the far end starts anew after a gap, it is not heard until the echo's lag is found
again (`restarted`), from the new audio alone where the filter was proven (`_quick`): 0.1-0.3 s into the
reply, by the echo's delay, where the usual half-second window waited 0.4 s for the old audio to leave it
and AEC3, heard meanwhile, let the echo's start through.

(Fed AEC3 with the linear filter's output instead, the two did better in a long stream, but in a call of
short replies, cut early, the filter's first seconds left AEC3 an echo path it could not follow: the echo
came through and held the VAD's utterance open over the caller's next five questions.)
"""

from collections import deque

import numpy as np

from voicepipe.frontend.echo_lag import EchoLag
from voicepipe.frontend.rehearsal import Rehearsal
from voicepipe.frontend.speex_echo import SpeexEcho, library

# The filter's length, from where the echo starts: the far end reaches it delayed by the echo's lag, less a
# margin. Aligned so, with 300 ms of filter, it was trusted after 9.4 s of replies in the synthetic rooms,
# against 19-20 s unaligned with the 600 ms that 300 ms of unknown delay would need. The lag is the sample's
# (`EchoLag`) once two estimates in a row agree, and the filter's far end follows it when it moves, keeping
# what it learnt; until then the frames' (`EchoPath.lag`), to 10 ms.
TAIL_S = 0.3
LEAD = 160  # samples of the echo's lag left to the filter when aligning: a loudspeaker's own delay spread
AGREE = 16  # samples two estimates in a row may differ by and still be one lag
# Samples the lag must move by for the far end to follow, a whole sample at a time. One sample out of line
# leaves a filter 10-15 dB of the echo instead of 30-35 (a 500 Hz tone's phase is 11 degrees out), and
# the echo barged in: 5 of the 7 false barge-ins of 54 recorded calls came where the lag had moved by one
# sample between replies and the far end, asked to move by two, had stayed, the other 2 later in two of
# those calls (replayed with this rule: none of the 7). Under a whole sample, a lag halfway between two
# (two clocks drifting apart) does not move it back and forth.
MOVED = 0.75
FOLLOWED = 800  # ...and may move by at most (50 ms: a client's buffer's steps); further, another path: learnt anew
HELD = 200  # frames held at most (a reply whose echo's lag is never clear teaches the filter nothing)
FRESH = 40  # frames since the far end started, for two estimates in a row to be of its new audio
QUICK_FROM = 8  # ...and, over that audio alone, from this many frames on
QUICK_EVERY = 2
QUICK_AGREE = 1.0
MARGIN = 5  # frames of the frames' lag left to the filter: the lag judged may fall either side of the echo
NEAR = 2  # ...and never fewer than these
SLACK = 10  # frames the frames' lag may move later before the filter is aligned again
WINDOW = 250  # loud far-end frames judged (2.5 s of the reply at its loudest)
RECENT = 100  # ...and doubted on the latest of them (1-2 s), every DOUBT_EVERY far-end frames
JUDGE_EVERY = 50
DOUBT_EVERY = 10
PROVEN_DB = 20.0
MEDIAN_DB = 15.0  # (asked of a filter taught by replays: with the 75th percentile alone, it was trusted with
# a quarter of its frames at 5 dB, and the echo barged in)
DOUBT_DB = 14.0
# How much louder than the microphone the filter's output may come out and still be its to give. A caller over
# the echo can stand louder alone than with it (their voice and the echo cancel in part within a frame): at
# once louder (the rule as it was), a tenth of the first 300 ms of interruptions over the echo went to AEC3,
# which takes the caller down, and they were heard late.
WRONG = 10 ** (3.0 / 10)
LOUD = 2.0  # far-end frames within 20 dB (in log10 of energy) of the loudest of the window
FAR_ACTIVE = 160 * 1e-7
FLOOR_FRAMES = 1000  # the microphone's last 10 s, for its noise floor
AT_FLOOR_DB = 3.0
ABOVE_FLOOR_DB = 6.0
FLOOR = 1e-12
QUIET_MARGIN = 10  # frames of the far end's silence past the filter's length: the reply and its echo have ended
MAX_SHIFT_FRAMES = 50  # the far end's delay at most (EchoLag's reach)
REHEARSED = 100  # frames kept, at least, before a replay


def removed_db(before: float, after: float) -> float:
    """What the filter took off a frame, in dB, from its energy `before` and `after` (a frame it made
    louder counts as left alone)."""
    return float(10 * np.log10((before + FLOOR) / (min(after, before) + FLOOR)))


class LinearStage:
    """The linear canceller of one call, and whether its output is trusted."""

    def __init__(self, rate: int, frame: int) -> None:
        lib = library()
        self._tail = int(TAIL_S * rate)
        self._echo = SpeexEcho(lib, rate, frame, self._tail) if lib is not None else None
        self._frame = frame
        self._shift: int | None = None  # samples the far end is delayed by, once the echo's lag is known
        self._lag = EchoLag(rate, frame)
        self._estimate: float | None = None  # the latest lag estimated, in samples
        # The lag the filter's far end is aligned to, a fraction of a sample included: the far end moves from it
        # by whole samples, and it with them.
        self._anchor: float | None = None
        self._frames: deque[tuple[float, float]] = deque(maxlen=4 * WINDOW)  # (far's log energy, dB removed)
        self._recent: deque[float] = deque(maxlen=RECENT)  # dB removed in the latest loud frames
        self._loudest = np.inf  # the far end's loudest frame in the window (log10 of energy)
        self._levels: deque[float] = deque(maxlen=FLOOR_FRAMES)  # the microphone's frame energies
        self._floor = 0.0  # their 10th percentile: the room's noise
        self._heard = 0
        self._since = 0
        self._rehearsal = Rehearsal(frame)
        self._since_start = 0  # frames since the far end started after a gap
        self._confirmed = True  # whether the echo's lag is known since then
        self._fresh: float | None = None  # the latest estimate of the echo's lag over that audio alone
        self._held: list[tuple[np.ndarray, np.ndarray]] = []  # the frames since then, until it is
        # The far end's latest samples, as far back as any delay of it reaches; and as they were when it started.
        self._played = np.zeros(frame + MAX_SHIFT_FRAMES * frame + self._tail, np.float32)
        self._before = self._played
        self._silent = 1 << 30  # frames since the far end was last played
        self._quiet = 1 << 30  # frames since the far end (as played, or as it reaches the filter) was last heard
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

    def process(self, near: np.ndarray, far: np.ndarray, lag: int | None, heard: bool = True) -> np.ndarray:
        """The microphone frame less the echo the filter predicts (the frame itself without libspeexdsp);
        `lag` is the echo path's, in frames, where known; `heard`: whether the loudspeaker may be heard at
        all (where not, there is nothing to replay)."""
        if self._echo is None:
            return near
        self._since_start += 1
        self._follow(self._lag.add(near, far))
        if not self._confirmed and self.proven and self._since_start >= QUICK_FROM \
                and self._since_start % QUICK_EVERY == 0:
            self._quick(self._lag.now(self._since_start))
        if self._anchor is None and lag is not None and not self.proven and self._misaligned(lag):
            self._align(max(0, lag - MARGIN) * self._frame)
        self._played = np.concatenate([self._played, far])[-len(self._played):]
        line = self._delayed(self._played, len(self._played))
        far_energy = float(np.dot(far, far))
        playing = far_energy > FAR_ACTIVE
        self._silent = 0 if playing else self._silent + 1
        self._quiet = 0 if playing or float(np.dot(line, line)) > FAR_ACTIVE else self._quiet + 1
        filtered = False
        if self._rehearse(near, far, playing, heard):
            out = near  # the replay has the filter: this is the far end's silence, nothing for it to learn
        elif not self._confirmed:
            if len(self._held) < HELD:
                self._held.append((near.copy(), far.copy()))
            out = near
        else:
            out, filtered = self._echo.process(near, line), True
        before, after = float(np.dot(near, near)), float(np.dot(out, out))
        # Well louder out than in: it subtracted an echo that was not there (a filter still learning the delay,
        # or one that learnt another room); the frame is not its to give.
        self.wrong = after > before * WRONG
        if self.wrong:
            out, after = near, before
        self.removed = removed_db(before, after)
        self._levels.append(before)
        self._heard += 1
        if self._heard % JUDGE_EVERY == 0:
            self._floor = float(np.percentile(self._levels, 10))
        if filtered:
            self._weigh(before, after, far_energy)
        return out

    def _delayed(self, played: np.ndarray, end: int) -> np.ndarray:
        """The frame of `played` (the far end, as played) that reaches the filter with the one ending at `end`."""
        at = end - self._frame - (self._shift or 0)
        return played[at:at + self._frame] if at >= 0 else np.zeros(self._frame, np.float32)

    def _catch_up(self) -> bool:
        """The frames held since the far end started, through the filter now the echo's lag is known; whether
        it took the echo out of them: MEDIAN_DB off a quarter of those the far end played in (a caller talking
        over the reply's start keeps the rest; a filter out of line takes nothing off any)."""
        played = np.concatenate([self._before, *(far for _, far in self._held)])
        removed = []
        for i, (near, far) in enumerate(self._held):
            out = self._echo.process(near, self._delayed(played, len(self._before) + (i + 1) * self._frame))
            before, after, far_energy = float(np.dot(near, near)), float(np.dot(out, out)), float(np.dot(far, far))
            self._weigh(before, after, far_energy)
            if far_energy > FAR_ACTIVE:
                removed.append(removed_db(before, after))
        self._held.clear()
        self._before = self._played.copy()
        return not removed or float(np.percentile(removed, 75)) >= MEDIAN_DB

    def _weigh(self, before: float, after: float, far_energy: float, live: bool = True) -> None:
        """One frame's evidence: the microphone's energy `before` the filter and `after` it, the far end's
        in the same frame; judged every JUDGE_EVERY frames the far end played in (`live`: a frame of the call,
        not of a replay, and so one that may bring doubt)."""
        # A frame whose echo is lost in the room's noise says nothing of the filter; one it took down to that
        # noise is as clean as a filter can make it there, and counts as clean.
        if far_energy <= FAR_ACTIVE or before <= self._floor * 10 ** (ABOVE_FLOOR_DB / 10):
            return
        level = float(np.log10(far_energy))
        at_floor = after <= self._floor * 10 ** (AT_FLOOR_DB / 10)
        removed = max(removed_db(before, after), PROVEN_DB) if at_floor else removed_db(before, after)
        self._frames.append((level, removed))
        if level >= self._loudest - LOUD:
            self._recent.append(removed)
        self._since += 1
        if live and self._since % DOUBT_EVERY == 0 and self.proven and len(self._recent) >= RECENT // 2 \
                and np.percentile(self._recent, 75) < DOUBT_DB:
            # The echo moved before two estimates agreed on it (the filter unlearns while out of line),
            # or the room changed.
            lag = self._lag.now(self._since_start)  # (of the far end's current audio alone)
            if lag is None or self._anchor is None or not self._move(lag):
                self._forget()
        if self._since >= JUDGE_EVERY:
            self._since = 0
            self._judge()

    def _rehearse(self, near: np.ndarray, far: np.ndarray, playing: bool, heard: bool) -> bool:
        """Until the filter is proven, keep the frames the echo may be in and replay them once the reply has
        ended; whether this frame is the replay's (the far end silent: nothing for the filter)."""
        rehearsal, quiet = self._rehearsal, self._tail // self._frame + QUIET_MARGIN
        if rehearsal.running:
            if not playing:
                for kept, line, out in rehearsal.step(self._echo):
                    before, after = float(np.dot(kept, kept)), float(np.dot(out, out))
                    self._weigh(before, after, float(np.dot(line, line)), live=False)
                return True
            rehearsal.stop(self._echo)
        if self.proven or not heard:
            return False
        if self._silent < quiet + MAX_SHIFT_FRAMES:  # the echo may be in it, however late the far end
            rehearsal.keep(near, far, self._aligned)
        return self._shift is not None and self._quiet == quiet \
            and rehearsal.start(self._shift, self._aligned, quiet, REHEARSED)

    @property
    def trusted(self) -> bool:
        """Whether the call hears the filter's output: proven, and the echo's lag confirmed since the far end
        last started after a gap."""
        return self.proven and self._confirmed

    def restarted(self) -> None:
        """The far end starts anew after a gap (the server's playback ran dry: a reply's start, or a late
        sentence). So may the client's queue, on its own next buffer, and the echo then comes a buffer's step
        earlier or later than before (measured on websocket calls: 20 ms, the client's frame, at every other
        reply). The filter out of line by that lets the echo through and unlearns the room, so from here it
        is neither heard nor taught until estimates made in the new audio say where the echo is: the frames
        are held meanwhile, and heard by the filter then."""
        self._since_start = 0
        self._fresh = None
        self._confirmed = self._anchor is None
        self._before = self._played.copy()
        self._held.clear()
        self._rehearsal.restarted()

    def _follow(self, lag: float | None) -> None:
        """An estimate of the echo's lag, to a fraction of a sample (None: none due, or none clear). Two in a
        row agreeing align the filter there, where it was not yet; once aligned, the far end moves with the
        lag, and the filter keeps what it learnt, unless the echo has left its reach."""
        if lag is None or (self._anchor is not None and self._since_start < FRESH):
            return  # (a window mostly of the audio before the far end started anew: the echo's old place)
        estimate, self._estimate = self._estimate, lag
        if estimate is None or abs(lag - estimate) > AGREE:
            return
        if self._anchor is None:
            self._anchor = lag
            # (where the frames' lag put it well before the echo, it stays)
            if self._shift is None or not 0 <= round(lag) - self._shift < self._tail // 2:
                self._align(max(0, round(lag) - LEAD))
        else:
            self._move(lag)
        if not self._confirmed and self._since_start >= FRESH:  # both mostly of the audio since it started
            self._confirm()

    def _quick(self, lag: float | None) -> None:
        """An estimate over the audio since the far end started anew alone: two in a row agreeing say where
        the echo is now, well before the usual estimates are of that audio."""
        estimate, self._fresh = self._fresh, lag
        if lag is None or estimate is None or abs(lag - estimate) > QUICK_AGREE or self._confirmed \
                or abs(lag - self._anchor) > FOLLOWED:
            return
        self._move(lag)
        self._confirm()

    def _confirm(self) -> None:
        """The echo's lag found since the far end started anew: the held frames through the filter there.
        (Where they came out unclean, the lag found was not the echo's: held on, to the next.)"""
        self._rehearsal.relag(self._aligned)
        self._confirmed = self._catch_up()

    def _move(self, lag: float) -> bool:
        """Whether the echo's lag has moved from where the filter's far end is aligned; if so the far end
        moves with it."""
        if abs(lag - self._anchor) < MOVED:
            return False
        moved = round(lag - self._anchor)
        shift = self._shift + moved
        if shift >= 0 and abs(moved) <= FOLLOWED:
            self._anchor, self._shift = self._anchor + moved, shift
            self._recent.clear()  # the doubt's evidence was of frames out of line
        else:
            self._anchor = lag
            self._align(max(0, round(lag) - LEAD))
        return True

    @property
    def _aligned(self) -> int | None:
        """The lag the far end is aligned to, to the sample (None until it is known)."""
        return None if self._anchor is None else round(self._anchor)

    def _forget(self) -> None:
        """The room changed under the filter: it learns it again from nothing, as at the call's start (what
        it learnt is no nearer the new room than nothing), aligned again to the echo's lag."""
        if self._anchor is None:
            self._shift = None
        self._rehearsal.clear()
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
        if len(loud) >= WINDOW // 2 and np.percentile(loud, 75) >= PROVEN_DB and np.median(loud) >= MEDIAN_DB \
                and len(self._recent) >= RECENT // 2 and np.percentile(self._recent, 75) >= DOUBT_DB:
            self.proven = True
