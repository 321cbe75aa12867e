"""Cutting streamed text into sentences worth synthesizing: shared by calls and one-shot turns, and light
to import (no models behind it)."""

import re
from dataclasses import dataclass

SENTENCE_ENDS = ".!?…"
CLAUSE_ENDS = ",;:—"
ABBREVIATIONS = {"mr", "mrs", "ms", "dr", "prof", "st", "jr", "sr", "vs", "etc", "inc", "ltd", "no", "approx"}
_MARKUP = re.compile(r"[*#`_~>|]+")


def _abbreviation(piece: str) -> bool:
    """Does the period ending `piece` close an abbreviation ("Dr.", "e.g.", "U.S.") rather than a sentence?"""
    words = piece.split()
    word = words[-1].rstrip(".").lower() if words else ""
    return word in ABBREVIATIONS or len(word) == 1 or "." in word


# Words a phrase may end before: conjunctions and relative words, where a speaker takes a breath too.
BREAK_WORDS = {"and", "but", "or", "so", "because", "which", "who", "whose", "where", "when", "while",
               "although", "though", "since", "unless", "until", "if", "then"}


@dataclass(frozen=True, slots=True)
class FirstPhrase:
    """Where a reply's first piece may end before its sentence does, so synthesis starts on a few words:
    at a clause mark once it is `clause_chars` long, before a break word ("and", "which") once it has
    `min_words`, or after `max_words` whatever follows. Always after a whole word."""

    clause_chars: int = 16
    min_words: int = 3
    max_words: int = 9

    def ends(self, piece: str, mark: str, following: str) -> bool:
        """Whether the first piece may end as `piece`, whose last character is `mark`, with `following`
        (starting with whitespace) the text streamed after it so far."""
        if mark in CLAUSE_ENDS and len(piece.strip()) >= self.clause_chars:
            return True
        words = len(piece.split())
        if words >= self.max_words:
            return True
        after = following.split(maxsplit=1)
        complete = len(after) == 2 or (after and following.rstrip() != following)  # the next word is whole
        return bool(words >= self.min_words and after and complete
                    and after[0].lower().strip(",;:") in BREAK_WORDS)


def split_ready(text: str, first: FirstPhrase | None, later: FirstPhrase | None = None) -> tuple[list[str], str]:
    """Cut the pieces that are complete off the front of `text`; return them and the rest.

    A piece ends at a sentence end or a line break followed by whitespace (the next delta may otherwise
    still extend "3." into "3.5"). With `first`, the first piece may also end early, at a phrase; with
    `later`, so may the others, at theirs.
    """
    pieces: list[str] = []
    start = 0
    for i in range(len(text) - 1):
        ch = text[i]
        if not text[i + 1].isspace() and ch != "\n":
            continue
        piece = text[start:i + 1]
        sentence = ch == "\n" or (ch in SENTENCE_ENDS and not (ch == "." and _abbreviation(piece)))
        rule = later if pieces or first is None else first
        phrase = rule is not None and not ch.isspace() and rule.ends(piece, ch, text[i + 1:])
        if (sentence or phrase) and piece.strip():
            pieces.append(piece.strip())
            start = i + 1
    return pieces, text[start:]


def speakable(text: str) -> str:
    """The text without markdown marks and extra spaces; empty when nothing in it can be spoken."""
    text = " ".join(_MARKUP.sub(" ", text).split())
    return text if any(ch.isalnum() for ch in text) else ""
