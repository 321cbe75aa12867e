"""Sentence aggregation: the LLM's text deltas cut into pieces worth synthesizing."""

import re

from voicepipe.events import Event, ResponseCreated, Sentence, TextDelta, TextDone, TurnCancelled
from voicepipe.pipeline.stage import Stage
from voicepipe.pipeline.turn import Turn

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


class SentenceAggregator(Stage):
    """Buffers text deltas and emits sentences; text deltas pass on unchanged for the client.

    Only the first piece of a turn may end at a clause: it decides the time to first audio, while later
    pieces play behind audio already buffered, where whole sentences sound more natural.
    """

    def __init__(self, clause_chars: int = 16) -> None:
        super().__init__()
        self.clause_chars = clause_chars
        self.buffer = ""

    async def process(self, event: Event) -> None:
        if isinstance(event, TextDone):
            self._send(event.turn, self.buffer)  # the last piece goes before the end of the text
            self.buffer = ""
        self.emit(event)
        if isinstance(event, (ResponseCreated, TurnCancelled)):
            self.buffer = ""
        elif isinstance(event, TextDelta):
            self.buffer += event.text
            first = None if event.turn.sentences else self.clause_chars
            pieces, self.buffer = split_ready(self.buffer, first)
            for piece in pieces:
                self._send(event.turn, piece)

    def _send(self, turn: Turn, text: str) -> None:
        text = speakable(text)
        if text:
            turn.sentences.append(text)
            turn.mark("first_sentence")
            self.emit(Sentence(turn, text, len(turn.sentences) - 1))
