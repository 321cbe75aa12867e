"""Sentence aggregation: the LLM's text deltas cut into pieces worth synthesizing."""

from voicepipe.pipeline.events import Event, ResponseCreated, Sentence, TextDelta, TextDone, TurnCancelled
from voicepipe.pipeline.sentence_split import FirstPhrase, speakable, split_ready
from voicepipe.pipeline.stage import Stage
from voicepipe.pipeline.turn import Mark, Turn


class SentenceAggregator(Stage):
    """Buffers text deltas and emits sentences; text deltas pass on unchanged for the client.

    Only the first piece of a turn may end before its sentence, at a phrase (`FirstPhrase`): it decides
    the time to first audio, while later pieces play behind audio already buffered, where whole sentences
    sound more natural.
    """

    def __init__(self, first: FirstPhrase | None = None) -> None:
        super().__init__()
        self.first = first or FirstPhrase()
        self.buffer = ""
        self.sent = 0  # sentences of the current turn sent on so far

    async def process(self, event: Event) -> None:
        if isinstance(event, TextDone):
            self._send(event.turn, self.buffer)  # the last piece goes before the end of the text
            self.buffer = ""
        self.emit(event)
        if isinstance(event, (ResponseCreated, TurnCancelled)):
            self.buffer, self.sent = "", 0
        elif isinstance(event, TextDelta):
            self.buffer += event.text
            first = None if self.sent else self.first
            pieces, self.buffer = split_ready(self.buffer, first)
            for piece in pieces:
                self._send(event.turn, piece)

    def _send(self, turn: Turn, text: str) -> None:
        text = speakable(text)
        if text:
            turn.mark(Mark.FIRST_PHRASE)
            self.emit(Sentence(turn, text, self.sent))
            self.sent += 1
