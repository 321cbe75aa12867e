"""Cutting streamed text into sentences worth synthesizing: shared by calls and one-shot turns, and light
to import (no models behind it)."""

import re

SENTENCE_ENDS = ".!?…"
CLAUSE_ENDS = ",;:—"
ABBREVIATIONS = {"mr", "mrs", "ms", "dr", "prof", "st", "jr", "sr", "vs", "etc", "inc", "ltd", "no", "approx"}
_MARKUP = re.compile(r"[*#`_~>|]+")


def _abbreviation(piece: str) -> bool:
    """Does the period ending `piece` close an abbreviation ("Dr.", "e.g.", "U.S.") rather than a sentence?"""
    words = piece.split()
    word = words[-1].rstrip(".").lower() if words else ""
    return word in ABBREVIATIONS or len(word) == 1 or "." in word


def split_ready(text: str, clause_chars: int | None) -> tuple[list[str], str]:
    """Cut the pieces that are complete off the front of `text`; return them and the rest.

    A piece ends at a sentence end or a line break followed by whitespace (the next delta may otherwise
    still extend "3." into "3.5"). With `clause_chars`, the first piece may also end at a clause mark once
    it is that long.
    """
    pieces: list[str] = []
    start = 0
    for i in range(len(text) - 1):
        ch = text[i]
        if not text[i + 1].isspace() and ch != "\n":
            continue
        piece = text[start:i + 1]
        sentence = ch == "\n" or (ch in SENTENCE_ENDS and not (ch == "." and _abbreviation(piece)))
        clause = clause_chars is not None and not pieces and ch in CLAUSE_ENDS and len(piece.strip()) >= clause_chars
        ends = sentence or clause
        if ends and piece.strip():
            pieces.append(piece.strip())
            start = i + 1
    return pieces, text[start:]


def speakable(text: str) -> str:
    """The text without markdown marks and extra spaces; empty when nothing in it can be spoken."""
    text = " ".join(_MARKUP.sub(" ", text).split())
    return text if any(ch.isalnum() for ch in text) else ""
