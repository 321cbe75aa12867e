"""The typed events that flow through one call's pipeline, from microphone audio to reply audio.

Events are immutable records; the one mutable thing they may carry is the `Turn` they belong to, the shared
record of one assistant response (its ids, timings and cancellation); what the LLM wrote for it travels as a
copy (`Reply`) when the turn ends. Each stage handles the events it knows and passes every other event on
unchanged, so the last stage sees everything the client should hear about. `Feedback` events flow the other
way, from a later stage to the earlier ones that act on them (the LLM's verdict that the caller's message is
over goes up to the endpointer; the audio the caller was sent goes up to the TTS and LLM stages), so the
stage list stays the whole truth of who tells whom what.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from voicepipe.constrained.tools import FunctionCall
    from voicepipe.mcp_servers.toolbox import ToolResult
    from voicepipe.pipeline.turn import Reply, Turn


@dataclass(frozen=True, slots=True)
class Event:
    """Base of every pipeline event."""


@dataclass(frozen=True, slots=True)
class Feedback(Event):
    """An event that flows upstream: each stage before its sender is offered it until one takes it."""


# -- the caller ----------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class AudioIn(Event):
    """Microphone audio: float32 mono at 16 kHz. After the front end's noise suppressor, `unsuppressed` is
    the same audio before it: the VAD and the endpointer's level rule judge that, the ASR hears `samples`."""

    samples: np.ndarray
    unsuppressed: np.ndarray | None = None


@dataclass(frozen=True, slots=True)
class SpeechStarted(Event):
    """The VAD heard speech begin; `audio_start_ms` includes the prefix padding kept before it.

    `heard` is False under manual turns, where the utterance is simply the client's audio buffer.
    """

    item_id: str
    audio_start_ms: int
    at: float  # time.monotonic() when it was detected
    heard: bool = True


@dataclass(frozen=True, slots=True)
class EchoPathJudged(Event):
    """The audio front end's verdict, first given or changed, on whether the caller's microphone hears the
    loudspeaker (`heard`; True too while echo cancellation is off and nothing is known): only where it does
    can what the caller says be the assistant's own voice."""

    heard: bool


@dataclass(frozen=True, slots=True)
class BargeIn(Event):
    """The caller has spoken long enough over the assistant (more than a click or a cough) that its reply
    audio stops; whether the reply is cancelled waits for the words (`BargeInResolved`)."""

    item_id: str


@dataclass(frozen=True, slots=True)
class SpeechAudio(Event):
    """Audio of the utterance in progress (prefix padding first), with the VAD's verdict on it."""

    item_id: str
    samples: np.ndarray
    is_speech: bool


@dataclass(frozen=True, slots=True)
class SpeechPaused(Event):
    """Silence began after speech: the utterance may be over, so its final transcription can start early.

    `speech_samples` is how much of the utterance's audio holds all the speech heard so far; `speech_end`
    is when the caller's last voiced frame came in (the caller's clock: every turn figure counts from it);
    `voiced_ms`, as `SpeechStopped`'s, so far.
    """

    item_id: str
    speech_samples: int
    at: float
    speech_end: float
    voiced_ms: int | None = None


@dataclass(frozen=True, slots=True)
class SpeechResumed(Event):
    """Speech came back after a pause (or the first silence, `SpeechQuiet`), before the end of the
    utterance was confirmed."""

    item_id: str


@dataclass(frozen=True, slots=True)
class SpeechStopped(Event):
    """The end of the utterance is confirmed (enough silence, the LLM's verdict, a commit, or the length
    limit) at `at`; the caller stopped speaking at `speech_end` (their last voiced frame, or the commit
    under manual turns), which every turn timing and deadline counts from. `voiced_ms`: how much of it the
    VAD heard as speech, in its windows (the padding before the start counts as one; None where no VAD
    judged it)."""

    item_id: str
    audio_end_ms: int
    at: float
    speech_samples: int
    truncated: bool = False
    speech_end: float | None = None  # None: `at`
    voiced_ms: int | None = None

    @property
    def voiced_end(self) -> float:
        return self.at if self.speech_end is None else self.speech_end


@dataclass(frozen=True, slots=True)
class IdleTimedOut(Event):
    """The caller has said nothing for the session's `idle_timeout_ms` since the assistant last spoke (the
    input audio from `audio_start_ms` to `audio_end_ms`); `unanswered`: re-prompts made since they last
    spoke. The LLM stage re-prompts them, or says goodbye; while a reply is in progress it lets this pass."""

    item_id: str
    audio_start_ms: int
    audio_end_ms: int
    unanswered: int
    at: float


@dataclass(frozen=True, slots=True)
class TranscriptDelta(Event):
    """A partial transcription pass: newly committed words, and the whole current partial text."""

    item_id: str
    delta: str
    partial: str


@dataclass(frozen=True, slots=True)
class TranscriptFinal(Event):
    """The final transcript of an utterance."""

    item_id: str
    text: str
    speech_end: float  # the caller's last voiced frame (SpeechStopped.voiced_end)
    ready_s: float  # seconds from the end of speech to this transcript
    audio_s: float = 0.0  # the utterance's audio, transcribed
    confirmed_at: float | None = None  # when the end of speech was confirmed (SpeechStopped.at)


@dataclass(frozen=True, slots=True)
class UtteranceDropped(Event):
    """An utterance taken for the assistant's own voice (`reason` "own_voice": its words repeat what was
    playing) or for a sound begun over it ("sound": too short to have barged in): in place of its final
    transcript, as it is no turn and never joins the conversation; the client is told the item is gone."""

    item_id: str
    text: str  # what the ASR heard in it
    reason: str


@dataclass(frozen=True, slots=True)
class TranscriptEarly(Event):
    """The transcript of an utterance at its first pause, before its end is confirmed: what the final
    transcript will be unless the caller speaks again (`paused_at` is when the pause was heard)."""

    item_id: str
    text: str
    paused_at: float
    speech_end: float  # SpeechPaused.speech_end


@dataclass(frozen=True, slots=True)
class SpeechQuiet(Event):
    """The first silence after speech (`Endpointer.quiet_ms`): the caller may be about to finish, so the
    engine hears of it (a hint to keep its steps short) before the pause is even certain."""

    item_id: str
    speech_end: float


@dataclass(frozen=True, slots=True)
class EndOfTurn(Feedback):
    """The LLM's verdict on the transcript at the pause at `paused_at`: end the utterance once its silence
    has lasted `silence_ms` (at once if it has), unless the caller speaks again."""

    item_id: str
    paused_at: float
    probability: float
    silence_ms: int


@dataclass(frozen=True, slots=True)
class PlaybackPaused(Feedback):
    """The caller's speech `item_id` paused the reply `turn`; it waits for the verdict. `at`: when its
    audio stopped playing (None: none was playing)."""

    item_id: str
    turn: Turn | None = None
    at: float | None = None


@dataclass(frozen=True, slots=True)
class Paced(Feedback):
    """When the turn's LLM request must deliver its next sentence (`due`, a monotonic time), as the TTS
    stage works it out from the caller's playback and the sentences on their way (see `Pacing`)."""

    turn: Turn
    due: float


@dataclass(frozen=True, slots=True)
class Playout(Feedback):
    """Reply audio the caller's loudspeaker was due to play from `start` (the output stage's playback clock):
    the far end the audio front end cancels from the microphone. `text` is the sentence it speaks."""

    samples: np.ndarray  # PCM16 at `sample_rate`
    sample_rate: int
    start: float
    text: str = ""


@dataclass(frozen=True, slots=True)
class ReplyEnded(Feedback):
    """The client heard that a response ended (its `response.done` went out): what waited for the reply under
    way to end may go on."""

    turn: Turn


@dataclass(frozen=True, slots=True)
class PlayoutCut(Feedback):
    """The caller dropped its queued reply audio at `at`: nothing after it played."""

    at: float


@dataclass(frozen=True, slots=True)
class Played(Feedback):
    """A chunk of the turn's audio was scheduled for playback: `seconds` of sentence `index` (whose text is
    `text`) from `start`, the caller's buffered audio now running out at `until`; `resumed` after a pause.
    The TTS stage reads the clock from it on its way; the LLM stage keeps it as what the caller heard."""

    turn: Turn
    index: int
    text: str
    start: float
    seconds: float
    until: float
    resumed: bool = False
    ends: tuple[float, ...] | None = None  # where each word of the sentence ends in its audio (seconds)


@dataclass(frozen=True, slots=True)
class BargeInResolved(Event):
    """What the caller said over the reply: words (`real`: the reply is cancelled) or only a backchannel,
    a cough or noise (the reply's audio goes on where it stopped)."""

    item_id: str
    real: bool
    turn: Turn | None = None  # the reply it paused


@dataclass(frozen=True, slots=True)
class InputCleared(Event):
    """The input audio was dropped; `item_id` names the utterance in progress that went with it, if any."""

    item_id: str | None


@dataclass(frozen=True, slots=True)
class ItemFound(Event):
    """The answer to an ItemRequested: the item as it was (its role, text, and whether it was spoken), now
    deleted if asked."""

    item_id: str
    action: str
    role: str
    text: str
    spoken: bool = False


@dataclass(frozen=True, slots=True)
class Truncated(Event):
    """A reply was cut off, and its conversation item now says only `said`, what the caller heard (None:
    it is not in the conversation). Its audio stops; `audio_end_ms`: the client asked, and is answered."""

    turn: Turn
    said: str | None
    audio_end_ms: int | None = None


# -- the assistant -------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ResponseCreated(Event):
    """A turn began: the LLM request for it is queued.

    `held`: a speculative turn, whose events must not reach the caller before its `TurnConfirmed`. It is
    carried by the event, not read off the turn later, since the turn may be confirmed while this event
    is still on its way downstream.
    """

    turn: Turn
    held: bool = False
    metadata: dict[str, str] | None = None  # the client's, from its response.create
    out_of_band: bool = False  # outside the conversation


@dataclass(frozen=True, slots=True)
class TurnConfirmed(Event):
    """A speculative turn's utterance ended as transcribed: what it held back may now reach the caller."""

    turn: Turn


@dataclass(frozen=True, slots=True)
class TextDelta(Event):
    """New text from the LLM."""

    turn: Turn
    text: str


@dataclass(frozen=True, slots=True)
class FunctionCallStarted(Event):
    """The LLM began a function call (its arguments follow); `item_id` is the call's conversation item."""

    turn: Turn
    item_id: str
    call: FunctionCall


@dataclass(frozen=True, slots=True)
class FunctionCallArguments(Event):
    """More of a function call's arguments (JSON text, as the model writes it)."""

    turn: Turn
    item_id: str
    call_id: str
    delta: str
    server: str = ""  # the MCP server that runs the call; "": the client


@dataclass(frozen=True, slots=True)
class FunctionCallDone(Event):
    """A function call is complete: it is not spoken; the client runs it and sends its output."""

    turn: Turn
    item_id: str
    call: FunctionCall


@dataclass(frozen=True, slots=True)
class ToolRan(Event):
    """A call the server ran on an MCP server has its result (the reply goes on after it);
    `approval_request_id` names the approval it waited for, if any."""

    turn: Turn
    item_id: str
    call: FunctionCall
    result: ToolResult
    approval_request_id: str | None = None


@dataclass(frozen=True, slots=True)
class ApprovalRequested(Event):
    """A call the server runs only once the client approves it (`mcp_approval_request`)."""

    turn: Turn
    item_id: str
    call: FunctionCall


@dataclass(frozen=True, slots=True)
class TextDone(Event):
    """The LLM finished writing this turn's text."""

    turn: Turn
    reply: Reply


@dataclass(frozen=True, slots=True)
class Sentence(Event):
    """A sentence or clause of the reply, ready to be spoken."""

    turn: Turn
    text: str
    index: int


@dataclass(frozen=True, slots=True)
class AudioOut(Event):
    """Reply audio: int16 mono at the TTS rate, synthesized from sentence `index`, whose `text` it says;
    `ends`: where each word of the sentence ends in the sentence's audio, when the voice tells."""

    turn: Turn
    pcm: np.ndarray
    index: int
    text: str
    ends: tuple[float, ...] | None = None


@dataclass(frozen=True, slots=True)
class TurnCancelled(Event):
    """The turn was cancelled (barge-in, client request, or the call ending), with what it had written."""

    turn: Turn
    reason: str
    reply: Reply


@dataclass(frozen=True, slots=True)
class TurnDone(Event):
    """All of the turn's audio has been synthesized and sent; its timings are final."""

    turn: Turn
    reply: Reply


@dataclass(frozen=True, slots=True)
class Error(Event):
    """Something the client should be told about; the call goes on."""

    code: str
    message: str
    type: str = "invalid_request_error"
    event_id: str | None = None  # the client event that caused it
    param: str | None = None  # the field of that event at fault
