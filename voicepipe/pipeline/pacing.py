"""The caller's playback clock (the output stage's), and the deadlines the TTS stage works out from it for
a turn's LLM and TTS work.

The output stage keeps the clock and reports each chunk it schedules upstream (`Played`, with when the
caller's buffered audio will run out); the TTS stage, which knows the sentences on their way, reads that
as it passes and tells the LLM stage when its request must deliver (`Paced`). The LLM stage alone moves
its request's deadline in the engine.
"""

from voicepipe.pipeline.turn import Turn


class PlaybackClock:
    """When the audio sent to this caller will run out, assuming it plays in real time from arrival:
    each chunk starts when it arrives or when the one before it ends, whichever is later."""

    def __init__(self) -> None:
        self.playout_end = 0.0

    def buffered(self, now: float) -> float:
        return max(0.0, self.playout_end - now)

    def schedule(self, seconds: float, now: float) -> tuple[float, float]:
        """Queue a chunk for playback; returns its start and the gap the caller heard before it."""
        gap = max(0.0, now - self.playout_end)
        start = max(now, self.playout_end)
        self.playout_end = start + seconds
        return start, gap

    def clear(self, now: float) -> None:
        """The caller dropped its queued audio."""
        self.playout_end = min(self.playout_end, now)


class Pacing:
    """The deadlines of a turn's work, from when the caller's audio runs out.

    The LLM must have the next sentence before that moment, less the time a sentence takes to synthesize
    (before any audio, the turn's time-to-first-audio deadline stands in for it). Sentences already
    waiting for synthesis count as audio to come, at their estimated length: until they are spoken the
    LLM is not what the caller waits for, so their synthesis is not kept waiting behind its decodes.
    """

    def __init__(self, tts_estimate_s: float = 0.4, chars_per_s: float = 15.0) -> None:
        self.playout_end = 0.0  # as the output stage last reported it
        self._playing: Turn | None = None  # the turn whose audio was scheduled last
        self.tts_estimate_s = tts_estimate_s  # time to synthesize a sentence
        self.chars_per_s = chars_per_s  # characters of text per second of speech
        self._turn: Turn | None = None  # the turn whose sentences are being synthesized
        self._pending: dict[int, float] = {}  # its sentences handed to synthesis -> estimated seconds

    # -- the caller's playback, as reported ------------------------------------------------------------------
    def played(self, turn: Turn, until: float) -> None:
        """Audio of `turn` was scheduled: the caller's buffer now runs out at `until`."""
        self._playing, self.playout_end = turn, until

    def stopped(self, at: float) -> None:
        """The caller's playback was cut at `at`."""
        self.playout_end = min(self.playout_end, at)

    def ahead(self, turn: Turn, now: float) -> float:
        """How much of `turn`'s audio the caller has still to hear, in seconds."""
        return max(0.0, self.playout_end - now) if turn is self._playing else 0.0

    # -- sentences -------------------------------------------------------------------------------------------
    def expect(self, turn: Turn, index: int, text: str) -> None:
        """A sentence was handed to synthesis: its audio is on the way."""
        if turn is not self._turn:
            self._turn, self._pending = turn, {}
        self._pending[index] = len(text) / self.chars_per_s

    def synthesized(self, turn: Turn, index: int, text: str, audio_s: float, work_s: float) -> None:
        """A sentence became `audio_s` of audio in `work_s` (both smoothed into the estimates)."""
        if turn is self._turn:
            self._pending.pop(index, None)
        if audio_s > 0:
            self.chars_per_s = 0.7 * self.chars_per_s + 0.3 * len(text) / audio_s
            self.tts_estimate_s = 0.7 * self.tts_estimate_s + 0.3 * work_s

    # -- deadlines -------------------------------------------------------------------------------------------
    def tts_deadline(self, turn: Turn) -> float:
        return self.playout_end if turn is self._playing else turn.deadline

    def llm_deadline(self, turn: Turn, now: float) -> float:
        audio_end = self.tts_deadline(turn)
        pending = self._pending if turn is self._turn else {}
        if pending:
            audio_end = max(audio_end, now + self.tts_estimate_s) + sum(pending.values())
        return audio_end - self.tts_estimate_s
