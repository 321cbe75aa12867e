"""Sentence aggregation: the LLM's text deltas cut into pieces worth synthesizing."""

from voicepipe.pipeline.events import Event, ResponseCreated, Sentence, TextDelta, TextDone, TurnCancelled
from voicepipe.pipeline.sentence_split import FirstPhrase, speakable, split_ready
from voicepipe.pipeline.stage import Stage
from voicepipe.pipeline.turn import Mark, Turn

# A later piece ends before its sentence only once it is long: at a clause mark past 40 characters, before a
# break word past 10 words, after 20 words whatever follows. Whole sentences sound more natural, but a run-on
# sentence (a small LLM's story can run one on for a hundred tokens) would keep the caller waiting for its
# end while the audio before it runs out.
LATER = FirstPhrase(clause_chars=40, min_words=10, max_words=20)


class SentenceAggregator(Stage):
    """Buffers text deltas and emits sentences; text deltas pass on unchanged for the client.

    The first piece of a turn may end early, at a phrase (`FirstPhrase`): it decides the time to first
    audio. Later pieces play behind audio already buffered and end at their sentence's end, unless the
    sentence runs long (`LATER`).
    """

    def __init__(self, first: FirstPhrase | None = None, later: FirstPhrase = LATER) -> None:
        super().__init__()
        self.first = first or FirstPhrase()
        self.later = later
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
            pieces, self.buffer = split_ready(self.buffer, None if self.sent else self.first, self.later)
            for piece in pieces:
                self._send(event.turn, piece)

    def _send(self, turn: Turn, text: str) -> None:
        text = speakable(text)
        if text:
            turn.mark(Mark.FIRST_PHRASE)
            self.emit(Sentence(turn, text, self.sent))
            self.sent += 1
