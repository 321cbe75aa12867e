"""Token ids to streamed text: incremental detokenizing and stop strings, shared by every LLM backend.

Decoding a request's whole output again for every new token costs time that grows with the answer; here
only a short window is decoded each time. The window starts a few tokens back (at the previous delta's
start), because byte-level and sentencepiece tokenizers render a token differently at the start of a text
(a leading space, half of a multi-byte character) than in the middle of one.
"""

from typing import Any


class StopScanner:
    """Cuts a stream of text deltas at the first stop string.

    A stop string may arrive split over several deltas, so the tail of the text that could still begin
    one is held back until the next delta shows whether it does.
    """

    def __init__(self, stops: list[str] | tuple[str, ...]) -> None:
        self.stops = [s for s in stops if s]
        self.stopped = False
        self._pending = ""

    def feed(self, delta: str) -> str:
        """Add a delta; return the text that is now safe to emit. Sets `stopped` on a stop string."""
        if self.stopped:
            return ""
        text = self._pending + delta
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            self._pending = ""
            return text[: min(hits)]
        longest = max((len(s) for s in self.stops), default=0)
        keep = 0
        for k in range(min(len(text), longest - 1), 0, -1):
            if any(s.startswith(text[-k:]) for s in self.stops):
                keep = k
                break
        self._pending = text[len(text) - keep:]
        return text[: len(text) - keep]

    def flush(self) -> str:
        """The held-back text, at the end of the stream."""
        text, self._pending = ("" if self.stopped else self._pending), ""
        return text


class Detokenizer:
    """One request's output ids in, text deltas out, cut at its stop strings."""

    def __init__(self, tokenizer: Any, stops: list[str] | tuple[str, ...] = ()) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self._prefix = 0  # the window decoded for context starts here
        self._read = 0  # text of ids before this has been emitted
        self.stops = StopScanner(stops)
        self.text = ""  # all the text shown so far

    @property
    def stopped(self) -> bool:
        return self.stops.stopped

    def add(self, token_id: int) -> str:
        """Append a token; return the text now safe to show (empty while a character is incomplete)."""
        self.ids.append(token_id)
        return self._show(self.stops.feed(self._advance(final=False)))

    def flush(self) -> str:
        """Everything still held back, at the end of the request."""
        return self._show(self.stops.feed(self._advance(final=True)) + self.stops.flush())

    def _show(self, delta: str) -> str:
        self.text += delta
        return delta

    def _advance(self, final: bool) -> str:
        decode = self.tokenizer.decode
        before = decode(self.ids[self._prefix:self._read], skip_special_tokens=True)
        after = decode(self.ids[self._prefix:], skip_special_tokens=True)
        if len(after) <= len(before) or (after.endswith("\ufffd") and not final):
            return ""  # nothing new yet, or half of a multi-byte character: wait for the rest
        self._prefix, self._read = self._read, len(self.ids)
        return after[len(before):]
