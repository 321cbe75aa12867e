"""When a caller has said nothing for too long after the assistant spoke, on the clock of their audio.

Counted in milliseconds of microphone audio, as the Realtime API's `audio_start_ms` / `audio_end_ms` are:
a caller whose audio stops coming is not idle but gone (the session's own timeout closes that call). The
countdown starts where the caller's last words ended and moves to where the reply's audio finishes playing,
as each chunk of it goes out; speech stops it. Each timeout that fires counts one unanswered re-prompt,
until the caller speaks again. (A reply slower to begin than the timeout finds the call answering: the
LLM stage lets that timeout pass.)
"""

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class IdleSpan:
    """The silent stretch a timeout covers, in ms of the input audio, and which timeout in a row it is."""

    start_ms: int
    end_ms: int
    unanswered: int  # re-prompts already made since the caller last spoke


class IdleWatch:
    """The idle countdown of one call; `timeout_ms` is read live from the session's settings."""

    def __init__(self) -> None:
        self._from_ms: int | None = None  # where the silence being counted began; None: not counting
        self._unanswered = 0

    def speech(self) -> None:
        """The caller speaks: no countdown until the assistant has answered (or the words proved no turn)."""
        self._from_ms, self._unanswered = None, 0

    def quiet_from(self, at_ms: int) -> None:
        """Silence counts from `at_ms` (the end of speech, or of a reply's audio), unless later already."""
        self._from_ms = at_ms if self._from_ms is None else max(self._from_ms, at_ms)

    def tick(self, now_ms: int, timeout_ms: int | None) -> IdleSpan | None:
        """The span a timeout covers (to where it ran out, inside the audio just fed), once `now_ms` of audio
        is `timeout_ms` past the silence's start."""
        if timeout_ms is None or self._from_ms is None or now_ms - self._from_ms < timeout_ms:
            return None
        span = IdleSpan(self._from_ms, self._from_ms + timeout_ms, self._unanswered)
        self._from_ms, self._unanswered = None, self._unanswered + 1
        return span
