"""The native protocol's wire format (`/ws`): a client's messages read as the session's inbound events, and
each event the client is told of as the JSON events (and the binary frame after an audio delta) it reads
as. The Realtime serializer renders with it the events whose shape it shares."""

from collections.abc import Callable
from typing import Any

import numpy as np

from voicepipe.call import client_events
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
    ResponseCreated,
    SpeechStarted,
    SpeechStopped,
    TextDelta,
    ToolRan,
    TranscriptDelta,
    TranscriptFinal,
    Truncated,
    UtteranceDropped,
)
from voicepipe.pipeline.outbound import (
    AudioEnded,
    AudioSent,
    McpListing,
    PlaybackCleared,
    ResponseDone,
    SessionDescribed,
    StatsReported,
)
from voicepipe.pipeline.requests import ItemCreated, KeyPressed
from voicepipe.pipeline.turn import Reply
from voicepipe.protocol import ServerEvent, server_events


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


def _response_created(event: ResponseCreated) -> list[dict]:
    turn = event.turn
    return [server_events.response_created(turn.response_id, turn.output_item_id, event.metadata, turn.spoken,
                                           event.out_of_band)]


def _audio_sent(event: AudioSent) -> list[dict | bytes]:
    """The delta announces the binary frame that follows it."""
    turn, pcm = event.turn, event.pcm
    return [server_events.audio_delta(turn.response_id, turn.output_item_id, 2 * len(pcm), event.sample_rate),
            np.asarray(pcm, "<i2").tobytes()]


def _response_done(event: ResponseDone) -> list[dict]:
    turn, reply = event.turn, event.reply
    calls = tuple(call_item(reply, item_id, call) for item_id, call in reply.calls)
    return [server_events.response_done(turn.response_id, event.status, turn.output_item_id, event.said,
                                         (reply.prompt_tokens, reply.output_tokens, reply.cached_tokens), calls,
                                         **event.details)]


def _session(event: SessionDescribed) -> list[dict]:
    kind = ServerEvent.SESSION_CREATED if event.created else ServerEvent.SESSION_UPDATED
    return [server_events.session_event(kind, event.session)]


BUILDERS: dict[type[Event], Callable[[Any], list[dict] | list[dict | bytes]]] = {
    SessionDescribed: _session,
    StatsReported: lambda e: [server_events.scheduler_stats(e.stats)],
    McpListing: lambda e: server_events.mcp_listing(e.item_id, e.label, e.described, e.failure),
    SpeechStarted: lambda e: [server_events.speech_started(e.item_id, e.audio_start_ms)],
    KeyPressed: lambda e: [server_events.key_received(e.digit, e.received_at)],
    IdleTimedOut: lambda e: [server_events.idle_timeout(e.item_id, e.audio_start_ms, e.audio_end_ms)],
    SpeechStopped: lambda e: server_events.speech_stopped(e.item_id, e.audio_end_ms),
    InputCleared: lambda e: [server_events.audio_cleared()],
    ItemCreated: lambda e: server_events.text_item(e.item_id, e.role, e.text, e.item),
    ItemFound: _item_found,
    TranscriptDelta: lambda e: [server_events.transcript_delta(e.item_id, e.delta, e.partial)],
    TranscriptFinal: lambda e: [server_events.transcript_completed(e.item_id, e.text, e.audio_s)],
    UtteranceDropped: lambda e: [server_events.utterance_dropped(e.item_id, e.reason, e.text)],
    ResponseCreated: _response_created,
    TextDelta: lambda e: [server_events.text_delta(e.turn.response_id, e.turn.output_item_id, e.text)],
    AudioSent: _audio_sent,
    AudioEnded: lambda e: [server_events.audio_done(e.turn.response_id)],
    PlaybackCleared: lambda e: [server_events.playback_cleared(e.turn.response_id)],
    Truncated: lambda e: [] if e.audio_end_ms is None else [
        server_events.item_truncated(e.turn.output_item_id, e.audio_end_ms)],
    ResponseDone: _response_done,
    Error: lambda e: [server_events.error(e.code, e.message, e.type, e.event_id, e.param)],
    **dict.fromkeys((FunctionCallStarted, FunctionCallArguments, FunctionCallDone, ToolRan, ApprovalRequested),
                    call_events),
}


def native_messages(event: Event) -> list[dict | bytes]:
    """The messages `event` reads as in the native protocol (none: the client does not hear of it)."""
    build = BUILDERS.get(type(event))
    return build(event) if build is not None else []


class NativeSerializer:
    """The native protocol: JSON text events both ways, the caller's audio as binary PCM16 frames at 16 kHz
    in, the reply's as binary frames at the TTS's rate out (each after the delta that announces it)."""

    def __init__(self, max_message_bytes: int) -> None:
        self.max_message_bytes = max_message_bytes

    def parse(self, message: str | bytes) -> bytes | dict:
        if isinstance(message, bytes):
            client_events.check_size(message, self.max_message_bytes)
            return message
        return client_events.json_event(message, self.max_message_bytes)

    def render(self, event: Event) -> list[dict | bytes]:
        return native_messages(event)
