"""A builder for each server event of the native call protocol: the native serializer renders the pipeline's
events with these, the Realtime serializer those whose shape it shares, and the replicas' proxy its own
errors."""

from typing import Any

from voicepipe.constrained.tools import FunctionCall
from voicepipe.mcp_servers.toolbox import ToolResult
from voicepipe.protocol.names import ServerEvent


def error(code: str, message: str, kind: str = "invalid_request_error", event_id: str | None = None,
          param: str | None = None) -> dict:
    """An error; `event_id` names the client event that caused it, when the client gave its events ids, and
    `param` the field of it at fault, when one is."""
    body = {"type": kind, "code": code, "message": message, "event_id": event_id}
    return {"type": ServerEvent.ERROR, "error": {**body, "param": param} if param else body}


def session_event(kind: str, session: dict) -> dict:
    return {"type": kind, "session": session}


def speech_started(item_id: str, audio_start_ms: int) -> dict:
    return {"type": ServerEvent.SPEECH_STARTED, "item_id": item_id, "audio_start_ms": audio_start_ms}


def speech_stopped(item_id: str, audio_end_ms: int) -> list[dict]:
    """The end of an utterance, and its commitment to the conversation, which follows at once."""
    return [{"type": ServerEvent.SPEECH_STOPPED, "item_id": item_id, "audio_end_ms": audio_end_ms},
            {"type": ServerEvent.AUDIO_COMMITTED, "item_id": item_id}]


def idle_timeout(item_id: str, audio_start_ms: int, audio_end_ms: int) -> dict:
    """The caller said nothing from `audio_start_ms` (the last reply's end) to `audio_end_ms`; a re-prompt
    follows."""
    return {"type": ServerEvent.AUDIO_TIMEOUT, "item_id": item_id, "audio_start_ms": audio_start_ms,
            "audio_end_ms": audio_end_ms}


def key_received(digit: str, received_at: float) -> dict:
    """A key of the caller's phone keypad (OpenAI's shape for its SIP calls)."""
    return {"type": ServerEvent.KEY_RECEIVED, "event": digit, "received_at": int(received_at)}


def audio_cleared() -> dict:
    return {"type": ServerEvent.AUDIO_CLEARED}


def transcript_delta(item_id: str, delta: str, partial: str) -> dict:
    return {"type": ServerEvent.TRANSCRIPT_DELTA, "item_id": item_id, "delta": delta, "partial": partial}


def transcript_completed(item_id: str, transcript: str, audio_s: float) -> dict:
    """An utterance's final transcript; `usage` as the Realtime API bills Whisper: seconds of audio."""
    return {"type": ServerEvent.TRANSCRIPT_COMPLETED, "item_id": item_id, "transcript": transcript,
            "usage": {"type": "duration", "seconds": round(audio_s, 3)}}


def message_item(item_id: str, role: str, text: str, spoken: bool = False) -> dict:
    """A message of the conversation, as the client reads it: a spoken one is audio with its transcript
    (the audio itself is not kept)."""
    side = "output" if role == "assistant" else "input"
    part = {"type": f"{side}_audio", "transcript": text} if spoken else {"type": f"{side}_text", "text": text}
    return {"id": item_id, "type": "message", "role": role, "status": "completed", "content": [part]}


def text_item(item_id: str, role: str, text: str, item: dict | None = None) -> list[dict]:
    """An item the client added (a text message, or `item` as given: a function call or its output):
    announced, and done at once."""
    item = item or message_item(item_id, role, text)
    return [{"type": ServerEvent.ITEM_ADDED, "item": item}, {"type": ServerEvent.ITEM_DONE, "item": item}]


def function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict:
    return {"id": item_id, "type": "function_call", "status": status, "call_id": call_id, "name": name,
            "arguments": arguments}


def function_call_output_item(item_id: str, call_id: str, output: str) -> dict:
    return {"id": item_id, "type": "function_call_output", "call_id": call_id, "output": output}


def call_started(response_id: str, item_id: str, call_id: str, name: str) -> dict:
    """A reply's function call begins: its item joins the conversation (`response_id` says whose)."""
    return {"type": ServerEvent.ITEM_ADDED, "response_id": response_id,
            "item": function_call_item(item_id, call_id, name, "", "in_progress")}


def call_arguments(response_id: str, item_id: str, call_id: str, delta: str) -> dict:
    return {"type": ServerEvent.CALL_ARGUMENTS_DELTA, "response_id": response_id, "item_id": item_id,
            "call_id": call_id, "delta": delta}


def call_done(response_id: str, item_id: str, call_id: str, name: str, arguments: str) -> list[dict]:
    """A reply's function call is complete: the client runs it, then sends a function_call_output item."""
    return [{"type": ServerEvent.CALL_ARGUMENTS_DONE, "response_id": response_id, "item_id": item_id,
             "call_id": call_id, "name": name, "arguments": arguments},
            {"type": ServerEvent.ITEM_DONE, "response_id": response_id,
             "item": function_call_item(item_id, call_id, name, arguments)}]


def mcp_call_item(item_id: str, call: FunctionCall, result: ToolResult | None = None,
                  approval_request_id: str | None = None) -> dict:
    """A call the server runs on an MCP server: its output or error once it has run."""
    return {"id": item_id, "type": "mcp_call", "server_label": call.server, "name": call.name,
            "arguments": call.arguments, "approval_request_id": approval_request_id,
            "output": None if result is None else result.output, "error": None if result is None else result.error}


def approval_request_item(item_id: str, call: FunctionCall) -> dict:
    return {"id": item_id, "type": "mcp_approval_request", "server_label": call.server, "name": call.name,
            "arguments": call.arguments}


def mcp_call_started(response_id: str, item_id: str, call: FunctionCall) -> dict:
    return {"type": ServerEvent.ITEM_ADDED, "response_id": response_id, "item": mcp_call_item(item_id, call)}


def mcp_arguments(response_id: str, item_id: str, delta: str) -> dict:
    return {"type": ServerEvent.MCP_ARGUMENTS_DELTA, "response_id": response_id, "item_id": item_id, "delta": delta}


def mcp_call_running(response_id: str, item_id: str, arguments: str) -> list[dict]:
    """The call's arguments are complete and the server is running it."""
    return [{"type": ServerEvent.MCP_ARGUMENTS_DONE, "response_id": response_id, "item_id": item_id,
             "arguments": arguments},
            {"type": ServerEvent.MCP_CALL_IN_PROGRESS, "response_id": response_id, "item_id": item_id}]


def mcp_call_ended(response_id: str, item_id: str, call: FunctionCall, result: ToolResult,
                   approval_request_id: str | None = None) -> list[dict]:
    kind = ServerEvent.MCP_CALL_COMPLETED if result.error is None else ServerEvent.MCP_CALL_FAILED
    return [{"type": kind, "response_id": response_id, "item_id": item_id},
            {"type": ServerEvent.ITEM_DONE, "response_id": response_id,
             "item": mcp_call_item(item_id, call, result, approval_request_id)}]


def approval_requested(response_id: str, item_id: str, call: FunctionCall) -> list[dict]:
    """A call that waits for the client's `mcp_approval_response` before the server runs it."""
    item = approval_request_item(item_id, call)
    return [{"type": ServerEvent.ITEM_ADDED, "response_id": response_id, "item": item},
            {"type": ServerEvent.ITEM_DONE, "response_id": response_id, "item": item}]


def mcp_listing(item_id: str, label: str, described: tuple[dict, ...] | None, failure: str | None = None
                ) -> list[dict]:
    """A session's MCP server is being listed (`described` None), or its listing ended."""
    item = {"id": item_id, "type": "mcp_list_tools", "server_label": label, "tools": list(described or ())}
    if described is None and failure is None:
        return [{"type": ServerEvent.MCP_LIST_IN_PROGRESS, "item_id": item_id},
                {"type": ServerEvent.ITEM_ADDED, "item": item}]
    if failure is not None:
        return [{"type": ServerEvent.MCP_LIST_FAILED, "item_id": item_id},
                error("mcp_list_tools_failed", failure, param="session.tools")]
    return [{"type": ServerEvent.ITEM_DONE, "item": item}, {"type": ServerEvent.MCP_LIST_COMPLETED, "item_id": item_id}]


def item_deleted(item_id: str) -> dict:
    return {"type": ServerEvent.ITEM_DELETED, "item_id": item_id}


def utterance_dropped(item_id: str, reason: str, transcript: str) -> dict:
    """The caller's audio item is gone unanswered, as the assistant's own voice or a sound over it: the
    deletion a client already handles, with why and what was heard, for those that show it."""
    return {**item_deleted(item_id), "reason": reason, "transcript": transcript}


def item_retrieved(item_id: str, role: str, text: str, spoken: bool) -> dict:
    return {"type": ServerEvent.ITEM_RETRIEVED, "item": message_item(item_id, role, text, spoken)}


def item_truncated(item_id: str, audio_end_ms: int) -> dict:
    return {"type": ServerEvent.ITEM_TRUNCATED, "item_id": item_id, "content_index": 0,
            "audio_end_ms": audio_end_ms}


def response_created(response_id: str, item_id: str, metadata: dict[str, str] | None = None, spoken: bool = True,
                     out_of_band: bool = False) -> dict:
    """A reply begins: spoken (`output_modalities` audio, with its transcript) or text only; in the
    conversation (`conversation: "auto"`) or outside it ("none")."""
    output = [{"id": item_id, "type": "message", "role": "assistant"}]
    return {"type": ServerEvent.RESPONSE_CREATED,
            "response": {"id": response_id, "status": "in_progress", "output": output, "metadata": metadata,
                         "output_modalities": ["audio" if spoken else "text"],
                         "conversation": "none" if out_of_band else "auto"}}


def text_delta(response_id: str, item_id: str, delta: str) -> dict:
    return {"type": ServerEvent.RESPONSE_TEXT_DELTA, "response_id": response_id, "item_id": item_id, "delta": delta}


def audio_delta(response_id: str, item_id: str, size: int, sample_rate: int) -> dict:
    """Announces the binary frame of `size` bytes that follows it."""
    return {"type": ServerEvent.RESPONSE_AUDIO_DELTA, "response_id": response_id, "item_id": item_id,
            "bytes": size, "sample_rate": sample_rate}


def audio_done(response_id: str) -> dict:
    return {"type": ServerEvent.RESPONSE_AUDIO_DONE, "response_id": response_id}


def playback_cleared(response_id: str) -> dict:
    return {"type": ServerEvent.PLAYBACK_CLEARED, "response_id": response_id}


def response_done(response_id: str, status: str, item_id: str, text: str, usage: tuple[int, int, int],
                  calls: tuple[dict, ...] = (), **details: Any) -> dict:
    """The end of a reply: its item's final text, then its calls' items, token usage (prompt, output, and
    of the prompt's those read from the KV cache), and voicepipe's own details (timings, waterfall,
    deadline_met, underruns, status_details)."""
    response = {"id": response_id, "status": status,
                "output": [{"id": item_id, "type": "message", "role": "assistant", "text": text}, *calls],
                "usage": token_usage(*usage), **details}
    return {"type": ServerEvent.RESPONSE_DONE, "response": response}


def token_usage(prompt: int, output: int, cached: int) -> dict:
    """A response's tokens: of its prompt (and of those, the ones read from the KV cache), and its output."""
    return {"input_tokens": prompt, "output_tokens": output, "total_tokens": prompt + output,
            "input_token_details": {"cached_tokens": cached}}


def scheduler_stats(stats: dict) -> dict:
    return {"type": ServerEvent.SCHEDULER_STATS, "stats": stats}
