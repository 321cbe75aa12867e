"""The client's requests, as the pipeline carries them: each made from a client event (voicepipe.call.client_events)
and handled by the stage that owns what it asks about."""

from dataclasses import dataclass, field
from typing import Any

from voicepipe.pipeline.events import Event


@dataclass(frozen=True, slots=True)
class CancelRequested(Event):
    """The client asked to cancel the response in progress."""


@dataclass(frozen=True, slots=True)
class CommitRequested(Event):
    """The client declared its utterance over (`input_audio_buffer.commit`), before the VAD heard silence."""

    event_id: str | None = None  # the client's, for an error it causes


@dataclass(frozen=True, slots=True)
class ClearRequested(Event):
    """The client asked to drop the audio it sent that no utterance has taken yet."""


@dataclass(frozen=True, slots=True)
class KeyPressed(Event):
    """The caller pressed a key of the phone's keypad (DTMF: 0-9, *, #, A-D), as a telephony line reports it."""

    digit: str
    received_at: float  # Unix time


@dataclass(frozen=True, slots=True)
class ItemCreated(Event):
    """An item the client added to the conversation (`conversation.item.create`): a text message, or a
    function call and its output (`item`: how the client reads it back; None for a message)."""

    item_id: str
    role: str
    text: str  # as the model reads it
    item: dict | None = None


@dataclass(frozen=True, slots=True)
class ReplyTools:
    """The tools one reply may call instead of the session's, and `tool_choice` among them as the client
    gave it (None: "auto"). `tools` None: the session's as they are when the reply starts (a choice alone);
    else the reply's functions, and the tools of the MCP `servers` it names once they have listed them."""

    tools: tuple[Any, ...] | None
    choice: Any = None
    servers: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class ResponseRequested(Event):
    """The client asked for a reply to the conversation as it stands (`response.create`); `metadata` comes
    back in its `response.created` (clients match their request to its reply by it)."""

    metadata: dict[str, str] | None = None
    event_id: str | None = None  # the client's, for an error it causes
    instructions: str | None = None  # for this reply only
    max_tokens: int | None = None
    out_of_band: bool = False  # `conversation: "none"`: the reply does not join the conversation
    audio: bool | None = None  # False: a text-only reply, nothing synthesized; None: as the session is
    # Messages read after the conversation for this reply only, never added to it (the conversation's prefix
    # stays in the KV cache, where other instructions would change its very start).
    pending: tuple[dict[str, str], ...] = ()
    last: bool = False  # the call ends once this reply has played
    tools: ReplyTools | None = None  # None: the session's
    words_only: bool = False  # held to plain words: no call, nor anything that looks like one, is written
    # What the reply reads instead of the conversation: (role, text) messages, or ("item_reference", id) for
    # a conversation item; None: the conversation.
    input: tuple[tuple[str, str], ...] | None = None
    say: str | None = None  # the reply's words, given (a set phrase): no model step


@dataclass(frozen=True, slots=True)
class ItemRequested(Event):
    """The client asked to delete (`conversation.item.delete`) or read (`.retrieve`) a conversation item."""

    item_id: str
    action: str  # "delete" | "retrieve"
    event_id: str | None = None


@dataclass(frozen=True, slots=True)
class TruncateRequested(Event):
    """The client stopped playing an assistant item at `audio_end_ms`: the conversation keeps what it heard."""

    item_id: str
    audio_end_ms: int


@dataclass(frozen=True, slots=True)
class SessionUpdate(Event):
    """A `session.update`, checked whole (nothing of a refused one applies): each stage applies what it
    owns (the VAD stage the turn detection, the LLM stage the instructions, tools and output), and the
    output stage answers `session.updated` once they have."""

    instructions: str
    spoken: bool
    turn_detection: dict  # the fields that change
    tools: tuple
    tool_choice: Any
    audio_input: dict = field(default_factory=dict)  # the audio front end's fields that change
    servers: tuple | None = None  # the MCP servers the session names (None: the same as before)
    retention: float | None = None  # the share of the prompt budget a cut keeps (None: the same as before)
    interrupt_tool_calls: bool | None = None  # whether a barge-in cancels the server's calls (None: unchanged)


@dataclass(frozen=True, slots=True)
class ToolsListed(Event):
    """An MCP server the session names has listed its tools (none, if it could not): the replies from now
    on may call them."""

    label: str
    tools: tuple


@dataclass(frozen=True, slots=True)
class ApprovalGiven(Event):
    """The client's answer to an `mcp_approval_request`: the call runs (or is declined) and the reply goes on."""

    item_id: str
    request_id: str
    approve: bool
    item: dict | None = None  # the `mcp_approval_response` item, as the client sees it in the conversation
