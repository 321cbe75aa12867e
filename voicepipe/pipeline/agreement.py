"""Committing partial transcripts: words that two passes in a row agree on stop changing (LocalAgreement-2)."""

import re

_NOT_WORD = re.compile(r"[^\w']+")


def _norm(word: str) -> str:
    """Compare words without case or punctuation: Whisper re-punctuates as the utterance grows."""
    return _NOT_WORD.sub("", word.lower())


class Agreement:
    """Keeps the committed words of one utterance across partial passes."""

    def __init__(self) -> None:
        self.committed: list[str] = []
        self._previous: list[str] = []

    def update(self, hypothesis: str) -> tuple[str, str]:
        """Add a pass; returns (newly committed text, the whole current partial text)."""
        words = hypothesis.split()
        agreed = 0
        for a, b in zip(self._previous, words, strict=False):
            if _norm(a) != _norm(b):
                break
            agreed += 1
        self._previous = words
        delta = words[len(self.committed):agreed]
        self.committed += delta
        partial = self.committed + words[len(self.committed):]
        return " ".join(delta), " ".join(partial)
