"""What the TurnTaking stage tells the LLM stage: answer now, answer ahead, drop what was begun ahead.

Turn-taking decides when the assistant speaks; the LLM stage decides nothing of the sort, it writes the
reply it is asked for. `Probed` goes the other way: what a reply begun ahead read of the end-of-turn
probability in its own prefill (or that it could not, so turn-taking asks with a request of its own).
"""

from dataclasses import dataclass

from voicepipe.pipeline.events import Event, Feedback, TranscriptEarly, TranscriptFinal


@dataclass(frozen=True, slots=True)
class TurnEnded(Event):
    """The caller's utterance is over and it is more than a backchannel: it joins the conversation, and
    with `answer` the assistant replies now (not when the caller already speaks again, nor when the client
    creates its responses itself)."""

    final: TranscriptFinal
    answer: bool


@dataclass(frozen=True, slots=True)
class Speculate(Event):
    """The caller paused: begin the reply to the words so far, before the end of their turn is confirmed."""

    early: TranscriptEarly


@dataclass(frozen=True, slots=True)
class DropSpeculation(Event):
    """The caller speaks on (or cleared their audio): a reply begun ahead of them is dropped unsent."""


@dataclass(frozen=True, slots=True)
class Probed(Feedback):
    """The end-of-turn probability the reply begun at this pause read in its prefill; None when it cannot
    (the prompts do not line up), and turn-taking asks the model with a request of its own."""

    early: TranscriptEarly
    probability: float | None
