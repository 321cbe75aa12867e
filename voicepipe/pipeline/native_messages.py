"""The events the caller hears of as they come, in the native protocol: one builder per event type.

What the output stage passes on unchanged is here; the events whose sending depends on the caller's
playback (a reply's audio, a barge-in, a turn's start and end) are the output stage's own."""

from collections.abc import Callable
from typing import Any

from voicepipe.constrained.tools import FunctionCall
from voicepipe.pipeline.events import (
    ApprovalRequested,
    Error,
    Event,
    FunctionCallArguments,
    FunctionCallDone,
    FunctionCallStarted,
    IdleTimedOut,
    InputCleared,
    ItemFound,
    SpeechStopped,
    TextDelta,
    ToolRan,
    TranscriptDelta,
    TranscriptFinal,
)
from voicepipe.pipeline.requests import ItemCreated, KeyPressed
from voicepipe.pipeline.turn import Reply
from voicepipe.protocol import server_events


def call_events(event: Any) -> list[dict]:
    """A reply's call as it goes: a function call the client runs, or a call the server runs on an MCP
    server (its result when it has run), or its approval request."""
    response_id, item_id = event.turn.response_id, event.item_id
    if isinstance(event, FunctionCallArguments):
        return [server_events.mcp_arguments(response_id, item_id, event.delta) if event.server
                else server_events.call_arguments(response_id, item_id, event.call_id, event.delta)]
    call = event.call
    if isinstance(event, ToolRan):
        return server_events.mcp_call_ended(response_id, item_id, call, event.result, event.approval_request_id)
    if isinstance(event, ApprovalRequested):
        return server_events.approval_requested(response_id, item_id, call)
    if isinstance(event, FunctionCallStarted):
        return [server_events.mcp_call_started(response_id, item_id, call) if call.server
                else server_events.call_started(response_id, item_id, call.call_id, call.name)]
    return server_events.mcp_call_running(response_id, item_id, call.arguments) if call.server \
        else server_events.call_done(response_id, item_id, call.call_id, call.name, call.arguments)


def call_item(reply: Reply, item_id: str, call: FunctionCall) -> dict:
    """A call as its response's output lists it."""
    if not call.server:
        return server_events.function_call_item(item_id, call.call_id, call.name, call.arguments)
    if item_id in reply.awaiting:
        return server_events.approval_request_item(item_id, call)
    return server_events.mcp_call_item(item_id, call, reply.results.get(item_id), reply.approved.get(item_id))


def _item_found(event: ItemFound) -> list[dict]:
    if event.action == "delete":
        return [server_events.item_deleted(event.item_id)]
    return [server_events.item_retrieved(event.item_id, event.role, event.text, event.spoken)]


BUILDERS: dict[type[Event], Callable[[Any], list[dict]]] = {
    KeyPressed: lambda e: [server_events.key_received(e.digit, e.received_at)],
    IdleTimedOut: lambda e: [server_events.idle_timeout(e.item_id, e.audio_start_ms, e.audio_end_ms)],
    SpeechStopped: lambda e: server_events.speech_stopped(e.item_id, e.audio_end_ms),
    InputCleared: lambda e: [server_events.audio_cleared()],
    ItemCreated: lambda e: server_events.text_item(e.item_id, e.role, e.text, e.item),
    ItemFound: _item_found,
    TranscriptDelta: lambda e: [server_events.transcript_delta(e.item_id, e.delta, e.partial)],
    TranscriptFinal: lambda e: [server_events.transcript_completed(e.item_id, e.text, e.audio_s)],
    TextDelta: lambda e: [server_events.text_delta(e.turn.response_id, e.turn.output_item_id, e.text)],
    Error: lambda e: [server_events.error(e.code, e.message, e.type, e.event_id)],
    **dict.fromkeys((FunctionCallStarted, FunctionCallArguments, FunctionCallDone, ToolRan, ApprovalRequested),
                    call_events),
}


def native_messages(event: Event) -> list[dict]:
    """The messages `event` reads as (none: the caller does not hear of it)."""
    build = BUILDERS.get(type(event))
    return build(event) if build is not None else []
