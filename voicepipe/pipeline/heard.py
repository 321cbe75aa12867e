"""What the caller heard of one reply: its audio chunks as they were scheduled for playback, and the words
they carry (cut at the word where the voice tells where each word ends, else by the share of its audio
played). The LLM stage, owner of the conversation, keeps one per recent turn from the output stage's
feedback (`Played`, `PlaybackPaused`); it is how a reply cut off by the caller, or truncated by the client,
keeps in the conversation only the words that were played."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from voicepipe.pipeline.turn import Turn


WORD_SLACK_S = 0.05  # a word whose last 50 ms were cut off was heard all the same


@dataclass(eq=False)
class Heard:
    sentences: dict[int, str] = field(default_factory=dict)  # sentence index -> its text
    chunks: list[tuple[int, float, float]] = field(default_factory=list)  # (sentence, start, seconds)
    lengths: dict[int, float] = field(default_factory=lambda: defaultdict(float))  # each sentence's audio
    stopped_at: float | None = None  # when the caller's playback of it was cut off
    ends: dict[int, tuple[float, ...]] = field(default_factory=dict)  # sentence -> where each word ends in it

    def add(self, index: int, text: str, start: float, seconds: float, resumed: bool = False,
            ends: tuple[float, ...] | None = None) -> None:
        """A chunk scheduled for playback. `resumed`: played on after a pause; the rest of a sentence cut
        there adds nothing to its length (counted when it first played), a sentence new since does. `ends`:
        where each word of the sentence ends in its audio."""
        self.sentences[index] = text
        if ends is not None and len(ends) == len(text.split()):
            self.ends[index] = ends
        self.chunks.append((index, start, seconds))
        if not resumed or index not in self.lengths:
            self.lengths[index] += seconds

    def cut(self, now: float) -> None:
        """The caller's playback stopped at `now`: chunks keep only what had played."""
        self.chunks = [(index, start, min(seconds, now - start)) for index, start, seconds in self.chunks
                       if start < now]
        self.stop(now)

    def stop(self, now: float) -> None:
        """Nothing after `now` counts as heard (the first stop holds)."""
        if self.stopped_at is None:
            self.stopped_at = now

    def resume(self) -> None:
        """The pause was only a backchannel: the reply plays on from where it stopped."""
        self.stopped_at = None

    def playing(self, now: float) -> bool:
        """Whether some of its audio is still to be heard at `now`."""
        return self.stopped_at is None and any(start + seconds > now for _, start, seconds in self.chunks)

    def played_text(self, now: float) -> str:
        """The reply as far as the caller heard it by `now`: whole sentences, then the words of the sentence
        playing whose audio had ended (or, where the voice does not tell, a share of its words in proportion
        to its audio played, as the Realtime API truncates)."""
        if self.stopped_at is not None:
            now = min(now, self.stopped_at)
        return self._words(lambda start, seconds, before: min(max(now - start, 0.0), seconds))

    def text_until(self, audio_s: float) -> str:
        """The reply as far as its first `audio_s` seconds of audio say (what a client that stopped playing
        there heard)."""
        return self._words(lambda start, seconds, before: min(max(audio_s - before, 0.0), seconds))

    def _words(self, played_of: Callable[[float, float, float], float]) -> str:
        """Words heard, given how many seconds of each chunk (start, seconds, audio before it) were played."""
        played: dict[int, float] = defaultdict(float)
        before = 0.0
        for index, start, seconds in self.chunks:
            played[index] += played_of(start, seconds, before)
            before += seconds
        heard: list[str] = []
        for index in sorted(played):
            words = self.sentences[index].split()
            total = self.lengths[index]
            share = played[index] / total if total else 1.0
            if share >= 0.999:
                keep = len(words)
            elif index in self.ends:
                keep = sum(end <= played[index] + WORD_SLACK_S for end in self.ends[index])
            else:
                keep = int(share * len(words))
            heard += words[:keep]
            if keep < len(words):
                break
        return " ".join(heard)


class RecentReplies:
    """The `Heard` record of each of the last `keep` replies, by their assistant item id: the replies a
    client may still truncate, or whose audio may still be playing."""

    def __init__(self, keep: int = 16) -> None:
        self.keep = keep
        self._replies: dict[str, tuple[Turn, Heard]] = {}

    def add(self, turn: Turn) -> None:
        self._replies[turn.output_item_id] = (turn, Heard())
        while len(self._replies) > self.keep:
            del self._replies[next(iter(self._replies))]

    def of(self, turn: Turn | None) -> Heard | None:
        reply = self._replies.get(turn.output_item_id) if turn is not None else None
        return reply[1] if reply is not None else None

    def turn(self, item_id: str) -> Turn | None:
        reply = self._replies.get(item_id)
        return reply[0] if reply is not None else None

    def cut(self, turn: Turn, now: float, audio_end_ms: int | None = None) -> str:
        """Stop `turn`'s record at `now`; the words heard by then (or in its first `audio_end_ms`)."""
        heard = self.of(turn) or Heard()
        heard.stop(now)
        return heard.played_text(now) if audio_end_ms is None else heard.text_until(audio_end_ms / 1000)

    def playing(self, now: float) -> list[Turn]:
        """The replies whose audio the caller is still to hear at `now`."""
        return [turn for turn, heard in self._replies.values() if heard.playing(now)]
