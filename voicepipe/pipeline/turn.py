"""One assistant response: the record its stages share, and what its LLM stage wrote for it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from voicepipe.ids import new_id

if TYPE_CHECKING:
    from voicepipe.tools import Call


class Mark:
    """The moments of a turn its `timings` name (seconds from the end of the caller's speech), in order;
    each is marked by one stage."""

    REPLY_STARTED = "reply_started"  # the LLM request was queued (LLM stage)
    FINAL_TRANSCRIPT = "final_transcript"  # the utterance's final transcript was ready (LLM stage)
    FIRST_TOKEN = "first_token"  # (LLM stage)
    FIRST_SENTENCE = "first_sentence"  # the first piece went to synthesis (sentence aggregator)
    TEXT_DONE = "text_done"  # the LLM's answer was complete (LLM stage)
    FIRST_AUDIO = "first_audio"  # its first audio was sent to the caller (output stage)
    DONE = "done"  # response.done was sent (output stage)


@dataclass(eq=False)
class Turn:
    """Ids, deadline, timings and cancellation of one response. Each field has one writer: the LLM stage,
    except `finished` (the output stage, when it sends response.done) and each stage's own key of
    `timings`. What the LLM wrote is the LLM stage's own `Reply`, handed on when the turn ends.

    Timings are seconds from the end of the caller's speech (`speech_end`), keyed by `Mark`.
    """

    response_id: str
    request_id: str
    item_id: str | None  # the user utterance it answers (None: asked for with response.create)
    speech_end: float
    deadline: float  # when its first audio is due
    spoken: bool = True  # False: a text-only reply
    speculative: bool = False  # started at a pause, before the end of the utterance was confirmed
    timings: dict[str, float] = field(default_factory=dict)
    output_item_id: str = field(default_factory=lambda: new_id("item"))  # its assistant message's id
    cancelled: bool = False
    finished: bool = False  # response.done was sent

    @property
    def active(self) -> bool:
        return not (self.cancelled or self.finished)

    def mark(self, stage: str, now: float | None = None) -> None:
        """Record when a stage first happened (later calls keep the first time)."""
        self.timings.setdefault(stage, (time.monotonic() if now is None else now) - self.speech_end)

    def confirm(self, speech_end: float, deadline: float) -> None:
        """The speculation held: time the turn from the confirmed end of speech, as any other."""
        shift = self.speech_end - speech_end
        self.timings = {stage: seconds + shift for stage, seconds in self.timings.items()}
        self.speech_end, self.deadline, self.speculative = speech_end, deadline, False


@dataclass(eq=False)
class Reply:
    """What the LLM wrote for one turn: the LLM stage's own record while it writes; a copy goes downstream
    with the turn's end (`TextDone`, `TurnCancelled`) for its response.done."""

    prompt_tokens: int = 0
    text: str = ""
    output_tokens: int = 0
    calls: list[tuple[str, Call]] = field(default_factory=list)  # (item id, call), in the order made
    done: bool = False  # the LLM's request ended

    def copy(self) -> Reply:
        return replace(self, calls=list(self.calls))
