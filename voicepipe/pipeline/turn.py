"""One assistant response: the record its stages share, and what its LLM stage wrote for it."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from voicepipe.ids import new_id

if TYPE_CHECKING:
    from voicepipe.constrained.tools import FunctionCall
    from voicepipe.mcp_servers.toolbox import ToolResult


class Mark:
    """The moments of a turn its `timings` name (seconds from the caller's last voiced frame), roughly in
    order; each is marked by one stage."""

    PAUSE = "pause"  # the endpointer heard the pause the reply started at (LLM stage, from the ASR stage)
    TRANSCRIPT = "transcript"  # the transcript the reply answers was ready (LLM stage)
    END_CONFIRMED = "end_confirmed"  # the end of the caller's turn was decided (LLM stage)
    REPLY_STARTED = "reply_started"  # the LLM request was queued (LLM stage)
    FIRST_TOKEN = "first_token"  # (LLM stage)
    FIRST_PHRASE = "first_phrase"  # the first phrase went to synthesis (sentence aggregator)
    SYNTHESIZED = "synthesized"  # the first phrase's audio came back from synthesis (TTS stage)
    TEXT_DONE = "text_done"  # the LLM's answer was complete (LLM stage)
    FIRST_AUDIO = "first_audio"  # its first audio was sent to the caller (output stage)
    DONE = "done"  # response.done was sent (output stage)


# The waterfall of a turn's first audio: each stage ends at its mark; `waterfall` says how long each took.
WATERFALL = {"pause": Mark.PAUSE, "asr": Mark.TRANSCRIPT, "decision": Mark.END_CONFIRMED,
             "prefill": Mark.FIRST_TOKEN, "first_phrase": Mark.FIRST_PHRASE, "synthesis": Mark.SYNTHESIZED,
             "send": Mark.FIRST_AUDIO}


def waterfall(timings: dict[str, float]) -> dict[str, float]:
    """Where the time to first audio went: the stages a turn passed, in the order they ended, each the
    time since the one before (the first since the caller's last voiced frame), so they add up to the
    first audio. Stages that overlapped another (a speculative reply's prefill runs while the end of the
    turn is decided) take only the time they added to the wait; a stage the turn skipped is left out."""
    if Mark.FIRST_AUDIO not in timings:
        return {}
    first_audio = timings[Mark.FIRST_AUDIO]
    ended = sorted((min(timings[mark], first_audio), order, stage)
                   for order, (stage, mark) in enumerate(WATERFALL.items()) if mark in timings)
    stages, previous = {}, 0.0
    for at, _, stage in ended:
        stages[stage] = max(0.0, at - previous)
        previous = max(previous, at)
    return stages


@dataclass(eq=False)
class Turn:
    """Ids, deadline, timings and cancellation of one response. Each field has one writer: the LLM stage,
    except `finished` (the output stage, when it sends response.done) and each stage's own key of
    `timings`. What the LLM wrote is the LLM stage's own `Reply`, handed on when the turn ends.

    Timings are seconds from the end of the caller's speech as the caller lived it (`speech_end`: their
    last voiced frame), keyed by `Mark`; so is the deadline.
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
    last: bool = False  # the call ends once its audio has played (the goodbye to an idle caller)

    @property
    def active(self) -> bool:
        return not (self.cancelled or self.finished)

    def mark(self, stage: str, now: float | None = None) -> None:
        """Record when a stage first happened (later calls keep the first time)."""
        self.timings.setdefault(stage, (time.monotonic() if now is None else now) - self.speech_end)

    def ended(self, confirmed_at: float | None, transcript_at: float | None = None) -> None:
        """When the end of the caller's speech was confirmed and when its final transcript came (None: not
        known, or, for a reply begun ahead, marked already at the pause)."""
        if transcript_at is not None:
            self.mark(Mark.TRANSCRIPT, transcript_at)
        if confirmed_at is not None:
            self.mark(Mark.END_CONFIRMED, confirmed_at)

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
    cached_tokens: int = 0  # of the prompt's, those read from the KV cache (a call's earlier turns)
    text: str = ""
    output_tokens: int = 0
    calls: list[tuple[str, FunctionCall]] = field(default_factory=list)  # (item id, call), in the order made
    # What the server's MCP calls among them returned, those waiting for the client's approval, and the
    # approval request each approved one waited for, by item id.
    results: dict[str, ToolResult] = field(default_factory=dict)
    awaiting: set[str] = field(default_factory=set)
    approved: dict[str, str] = field(default_factory=dict)
    done: bool = False  # the LLM's request ended

    def copy(self) -> Reply:
        return replace(self, calls=list(self.calls), results=dict(self.results), awaiting=set(self.awaiting),
                       approved=dict(self.approved))


@dataclass(frozen=True, slots=True)
class Carried:
    """A call a reply runs (or whose run it waits out) before it writes its answer: one the client approved
    (or declined) by `approval_request_id`, or one an interrupted reply left `running`, or whose `result`
    it had but whose answer the caller spoke over."""

    call: FunctionCall
    approval_request_id: str | None = None
    approve: bool = True
    running: asyncio.Task[ToolResult] | None = None
    result: ToolResult | None = None
    question: str | None = None  # what the caller asked that the call was made for (left running, or spoken over)
