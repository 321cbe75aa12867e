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
        self._said: deque[tuple[float, str]] = deque()  # (when its audio ends, sentence)
        # Whether the microphone hears the loudspeaker, once the audio front end has found out: until then the
        # canceller alone stands between the echo and the turns (a caller on headphones is not second-guessed).
        self.heard = False

    def played(self, text: str, end: float) -> None:
        if self._said and self._said[-1][1] == text:  # the same sentence's next chunk
            self._said[-1] = (max(end, self._said[-1][0]), text)
        elif text:
            self._said.append((end, text))

    def cut(self, at: float) -> None:
        """The caller's playback stopped at `at`: what was queued after it was never heard."""
        self._said = deque((min(end, at), text) for end, text in self._said)

    def is_echo(self, transcript: str, began: float) -> bool:
        """Whether `transcript`, of an utterance begun at `began` (utterances begin in order), repeats
        sentences that were playing then."""
        while self._said and self._said[0][0] + TAIL_S < began:
            self._said.popleft()
        heard = words(transcript)
        if not heard or not self._said or not self.heard:
            return False
        said = words(" ".join(text for _, text in self._said))
        return in_order(heard, said) >= len(heard) - len(heard) // MISS_EVERY


def in_order(heard: list[str], said: list[str]) -> int:
    """How many of `heard` appear in `said` in the same order (their longest common subsequence)."""
    row = [0] * (len(said) + 1)
    for word in heard:
        previous = 0
        for j, other in enumerate(said, 1):
            previous, row[j] = row[j], previous + 1 if word == other else max(row[j], row[j - 1])
    return row[-1]
