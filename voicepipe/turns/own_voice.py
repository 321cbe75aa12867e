"""The assistant knows its own voice: words heard while it speaks, or just after, that repeat what it just
said are its echo, not the caller. The net under the canceller (a new room, a delay past its reach, a
client whose loudspeaker the server cannot hear), never instead of it.
"""

import re
from collections import deque

# How long after a sentence played its echo may still begin (the caller's playout and uplink delays beyond
# the server's clock, the room's delay and reverberation): an utterance begun later is the caller's.
TAIL_S = 1.0
# An echo is a fragment of what was said: every word of it in order, but for one in MISS_EVERY (a word the
# ASR got wrong). A caller who asks about the reply ("What is the capital of France?" after "Paris is the
# capital of France.") brings a word of their own, and is heard.
MISS_EVERY = 8
WORD = re.compile(r"[a-z0-9']+")


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


class OwnVoice:
    """The sentences the caller's loudspeaker played lately, and whether a transcript repeats them."""

    def __init__(self) -> None:
        self._said: deque[tuple[float, float, str]] = deque()  # (when its audio starts, and ends; sentence)
        # Whether the microphone hears the loudspeaker, once the audio front end has found out: until then the
        # canceller alone stands between the echo and the turns (a caller on headphones is not second-guessed).
        self.heard = False

    def played(self, text: str, start: float, end: float) -> None:
        if self._said and self._said[-1][2] == text:  # the same sentence's next chunk
            first, last, _ = self._said[-1]
            self._said[-1] = (min(start, first), max(end, last), text)
        elif text:
            self._said.append((start, end, text))

    def cut(self, at: float) -> None:
        """The caller's playback stopped at `at`: what was queued after it was never heard."""
        self._said = deque((start, min(end, at), text) for start, end, text in self._said if start < at)

    def over(self, began: float) -> bool:
        """Whether an utterance begun at `began` began over the assistant's voice, or its echo just after,
        where the microphone hears the loudspeaker."""
        return self.heard and any(start <= began <= end + TAIL_S for start, end, _ in self._said)

    def is_echo(self, transcript: str, began: float) -> bool:
        """Whether `transcript`, of an utterance begun at `began` (utterances begin in order), repeats
        sentences that were playing then."""
        self._forget(began)
        heard = words(transcript)
        if not heard or not self._said or not self.heard:
            return False
        said = words(" ".join(text for _, _, text in self._said))
        return in_order(heard, said) >= len(heard) - len(heard) // MISS_EVERY

    def _forget(self, began: float) -> None:
        """Sentences whose echo had left the room before `began`."""
        while self._said and self._said[0][1] + TAIL_S < began:
            self._said.popleft()


def in_order(heard: list[str], said: list[str]) -> int:
    """How many of `heard` appear in `said` in the same order (their longest common subsequence)."""
    row = [0] * (len(said) + 1)
    for word in heard:
        previous = 0
        for j, other in enumerate(said, 1):
            previous, row[j] = row[j], previous + 1 if word == other else max(row[j], row[j - 1])
    return row[-1]
