"""What a client sends, read once for every line that speaks the protocol (the native websocket, `talk` and
both Realtime dialects): each client event checked and made into the pipeline's request for it, or refused
with a `ClientError` that says what is wrong in a word (`code`) and where (`param`)."""

import base64
import binascii
import json
import time
from typing import Any

import numpy as np

from scheduler.grammar.schema_limits import SchemaTooComplex
from voicepipe.audio import to_float32
from voicepipe.constrained import tools
from voicepipe.mcp_servers.spec import McpPolicy, ServerSpec, parse_server
from voicepipe.pipeline.config import CallConfig
from voicepipe.pipeline.detection import check_update
from voicepipe.pipeline.events import AudioIn
from voicepipe.pipeline.requests import (
    ApprovalGiven,
    ItemCreated,
    ItemRequested,
    KeyPressed,
    ReplyTools,
    ResponseRequested,
    SessionUpdate,
    TruncateRequested,
)
from voicepipe.protocol.server_events import function_call_item, function_call_output_item

MAX_TEXT = 8000  # characters of instructions, of a message or of a function's output
MAX_METADATA = 16  # pairs, as OpenAI's
MAX_INPUT = 64  # items a `response.create` may give its reply instead of the conversation
NO_MCP = McpPolicy()  # no server configured, no address allowed


class ClientError(ValueError):
    """A client event refused; nothing of it was applied. `event_id` names the event when the client gave it
    one and it is known where the error is raised (else the session adds the one it is handling)."""

    def __init__(self, message: str, code: str, param: str | None = None, event_id: str | None = None) -> None:
        super().__init__(message)
        self.code, self.param, self.event_id = code, param, event_id


def event_id_of(event: Any) -> str | None:
    """The `event_id` a client gave its event (a string of up to 64 characters), for the errors it causes."""
    cause = event.get("event_id") if isinstance(event, dict) else None
    return cause if isinstance(cause, str) and len(cause) <= 64 else None


def check_size(message: str | bytes, limit: int) -> None:
    """ClientError for a client message of more than `limit` bytes: checked before it is parsed."""
    size = len(message) if isinstance(message, bytes) else len(message.encode())
    if size > limit:
        raise ClientError(f"a message of {size} bytes is over the limit of {limit}", "message_too_large")


def json_event(message: str, limit: int) -> dict:
    """A client's text message as the JSON object it must be (ClientError: too large, not JSON, not an
    object)."""
    check_size(message, limit)
    try:
        event = json.loads(message)
    except (ValueError, RecursionError) as e:  # RecursionError: nesting deeper than the parser goes
        raise ClientError(f"the message is not valid JSON ({type(e).__name__}: {e})", "invalid_json") from None
    if not isinstance(event, dict):
        raise ClientError("an event must be a JSON object with a string 'type'", "invalid_event")
    return event


def audio_bytes(event: dict) -> bytes:
    """The PCM16 bytes of an `input_audio_buffer.append` (base64 in its `audio`), in every dialect."""
    pcm = audio_base64(event)
    check_pcm16(pcm)
    return pcm


KEYS = frozenset("0123456789*#ABCD")


def key_pressed(event: dict) -> KeyPressed:
    """An `input_audio_buffer.dtmf`: one key of the caller's phone keypad."""
    digit = event.get("digit")
    if not (isinstance(digit, str) and digit.upper() in KEYS and len(digit) == 1):
        raise ClientError("input_audio_buffer.dtmf: 'digit' must be one of 0-9, *, #, A-D", "invalid_event", "digit")
    return KeyPressed(digit.upper(), time.time())


def audio_base64(event: dict) -> bytes:
    """The bytes of an `input_audio_buffer.append`'s `audio`, however they are coded."""
    audio = event.get("audio")
    try:
        if not isinstance(audio, str):
            raise ValueError("'audio' must be a base64 string")
        return base64.b64decode(audio, validate=True)
    except (ValueError, binascii.Error) as e:
        raise ClientError(f"input_audio_buffer.append: {e}", "invalid_audio") from None


def check_pcm16(pcm: bytes) -> None:
    if len(pcm) % 2:
        raise ClientError(f"PCM16 audio needs an even number of bytes, got {len(pcm)}", "invalid_audio")


def audio_in(pcm: bytes) -> AudioIn | None:
    """Microphone audio from PCM16 bytes (None for none)."""
    check_pcm16(pcm)
    return AudioIn(to_float32(np.frombuffer(pcm, "<i2"))) if pcm else None


def item_created(item: Any, item_id: str) -> ItemCreated | ApprovalGiven:
    """A `conversation.item.create`'s item: a text message, a function call or a call's output, or the
    client's answer to an MCP call's approval request."""
    try:
        if isinstance(item, dict) and item.get("type") in ("function_call", "function_call_output"):
            return _call_item(item_id, item)
        if isinstance(item, dict) and item.get("type") == "mcp_approval_response":
            return _approval(item_id, item)
        return ItemCreated(item_id, *_message_text(item))
    except ValueError as e:
        raise ClientError(f"conversation.item.create: {e}", "invalid_item") from None


def item_id_of(item: Any) -> str | None:
    """The id a client gave its item, if it is a usable one."""
    given = item.get("id") if isinstance(item, dict) else None
    return given if isinstance(given, str) and len(given) <= 64 else None


def item_requested(kind: str, event: dict, event_id: str | None) -> ItemRequested:
    """A `conversation.item.delete` or `.retrieve`."""
    item_id = event.get("item_id")
    if not isinstance(item_id, str) or not item_id or len(item_id) > 64:
        raise ClientError(f"{kind} needs an item_id string", "invalid_item")
    return ItemRequested(item_id, kind.rsplit(".", 1)[1], event_id)


def truncate_requested(event: dict) -> TruncateRequested:
    item_id, end = event.get("item_id"), event.get("audio_end_ms")
    if not isinstance(item_id, str) or isinstance(end, bool) or not isinstance(end, int) or end < 0:
        raise ClientError("conversation.item.truncate needs an item_id string and an audio_end_ms integer >= 0",
                          "invalid_truncate")
    return TruncateRequested(item_id, end)


def _message_text(item: Any) -> tuple[str, str]:
    """(role, text) of a message item made of text parts; ValueError says what is wrong with it."""
    if not isinstance(item, dict) or item.get("type", "message") != "message":
        raise ValueError("'item' must be an object of type 'message'")
    role = item.get("role")
    if role not in ("user", "assistant", "system"):
        raise ValueError("'role' must be 'user', 'assistant' or 'system'")
    parts = item.get("content")
    if not isinstance(parts, list) or not parts:
        raise ValueError("'content' must be a non-empty list of text parts")
    texts = []
    for part in parts:
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text"):
            raise ValueError("only text parts ('input_text', 'output_text', 'text') are supported")
        text = part.get("text")
        if not is_text(text):
            raise ValueError(f"a part's 'text' must be a string of at most {MAX_TEXT} characters")
        texts.append(text)
    return role, "".join(texts)


def _approval(item_id: str, item: dict) -> ApprovalGiven:
    request_id, approve, reason = item.get("approval_request_id"), item.get("approve"), item.get("reason")
    if not (isinstance(request_id, str) and 0 < len(request_id) <= 64 and isinstance(approve, bool)):
        raise ValueError("an mcp_approval_response needs an 'approval_request_id' string and 'approve' true or false")
    if reason is not None and not is_text(reason):
        raise ValueError(f"'reason' must be a string of at most {MAX_TEXT} characters")
    shown = {"id": item_id, "type": "mcp_approval_response", "approval_request_id": request_id, "approve": approve,
             "reason": reason}
    return ApprovalGiven(item_id, request_id, approve, shown)


def _call_item(item_id: str, item: dict) -> ItemCreated:
    """A function call (history the client replays) or its output (what the client's function returned),
    as the model reads it; ValueError says what is wrong with it."""
    call_id = item.get("call_id")
    if not (isinstance(call_id, str) and 0 < len(call_id) <= 64):
        raise ValueError("a function call item needs a 'call_id' string")
    if item["type"] == "function_call_output":
        output = item.get("output")
        if not is_text(output):
            raise ValueError(f"'output' must be a string of at most {MAX_TEXT} characters")
        return ItemCreated(item_id, "tool", output, function_call_output_item(item_id, call_id, output))
    name, arguments = item.get("name"), item.get("arguments", "{}")
    if not (isinstance(name, str) and name and is_text(arguments)):
        raise ValueError("a function_call item needs a 'name' and its 'arguments' as a JSON string")
    return ItemCreated(item_id, "assistant", tools.call_text(name, arguments),
                       function_call_item(item_id, call_id, name, arguments))


def response_requested(response: Any, event_id: str | None, config: CallConfig, policy: McpPolicy = NO_MCP
                       ) -> ResponseRequested:
    """The parameters of a `response.create`, checked; ClientError names the first bad one. Its `tools` (MCP
    servers among them, under the operator's `policy`) and `tool_choice` hold for this reply alone (a choice
    alone: among the session's tools as they are when the reply starts). The modality it does not give is
    the session's as the LLM stage has it when the reply starts, after any update sent before it."""
    if not isinstance(response, dict):
        raise ClientError("response must be an object", "invalid_response")
    metadata = response.get("metadata")
    if metadata is not None and not (isinstance(metadata, dict) and len(metadata) <= MAX_METADATA and all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
            for k, v in metadata.items())):
        raise ClientError(f"response.metadata must be at most {MAX_METADATA} pairs of strings (keys up to 64 "
                              "characters, values up to 512)", "invalid_metadata")
    instructions = response.get("instructions")
    if instructions is not None and not is_text(instructions):
        raise ClientError(f"response.instructions must be a string of at most {MAX_TEXT} characters",
                          "invalid_response")
    limit = response.get("max_output_tokens", response.get("max_response_output_tokens", "inf"))
    if limit != "inf" and (isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 4096):
        raise ClientError("response.max_output_tokens must be an integer in [1, 4096] or 'inf'", "invalid_response")
    modalities = response.get("output_modalities", response.get("modalities"))
    spoken = None if modalities is None else speaks(modalities, True)
    if modalities is not None and spoken is None:
        raise ClientError("response.output_modalities must be ['audio'] or ['text']", "invalid_response")
    conversation = response.get("conversation", "auto")
    if conversation not in ("auto", "none"):
        raise ClientError("response.conversation must be 'auto' or 'none'", "invalid_response")
    return ResponseRequested(metadata, event_id, instructions, None if limit == "inf" else limit,
                             conversation == "none", spoken, tools=reply_tools(response, config, policy),
                             input=reply_input(response.get("input")))


def reply_input(items: Any) -> tuple[tuple[str, str], ...] | None:
    """A `response.create`'s `input`: the items its reply reads instead of the conversation, each a text
    message as (role, text) or a conversation item by id as ("item_reference", id); None: not given."""
    if items is None:
        return None
    if not isinstance(items, list) or len(items) > MAX_INPUT:
        raise ClientError(f"response.input must be a list of at most {MAX_INPUT} items", "invalid_response",
                          "response.input")
    read = []
    for n, item in enumerate(items):
        if isinstance(item, dict) and item.get("type") == "item_reference":
            if not (isinstance(item.get("id"), str) and 0 < len(item["id"]) <= 64):
                raise ClientError("an item_reference needs an 'id' string", "invalid_response", f"response.input[{n}]")
            read.append(("item_reference", item["id"]))
            continue
        try:
            read.append(_message_text(item))
        except ValueError as e:
            raise ClientError(f"response.input[{n}]: {e}", "invalid_response", f"response.input[{n}]") from None
    return tuple(read)


def reply_tools(response: dict, config: CallConfig, policy: McpPolicy) -> ReplyTools | None:
    """The tools a `response.create` gives its reply (None: the session's). A choice that names a tool of a
    server the response names is checked once that server has listed its tools."""
    if "tools" not in response and "tool_choice" not in response:
        return None
    choice = response.get("tool_choice")
    if "tools" not in response:
        checked_tools(response, "response", "invalid_response", config, choice)
        return ReplyTools(None, choice)
    servers = named_servers(response["tools"], "response", "invalid_response", policy)
    found, _ = checked_tools(response, "response", "invalid_response", config,
                             None if servers and isinstance(choice, dict) else choice, servers=True)
    return ReplyTools(tuple(found), choice, servers)


def checked_tools(fields: dict, where: str, code: str, config: CallConfig, choice: Any, servers: bool = False
                  ) -> tuple[list[tools.Tool], str | None]:
    """The tools `fields` gives (the session's, its servers' included, when it gives none) and `choice` among
    them resolved, checked; ClientError (`code`, or schema_too_complex) names the field at fault under `where`."""
    try:
        found = tools.parse_tools(fields["tools"], f"{where}.tools", nested=False, servers=servers) \
            if "tools" in fields else list(config.offered)
        return found, tools.choose(found, choice, f"{where}.tool_choice")
    except SchemaTooComplex as e:
        raise ClientError(str(e), "schema_too_complex", str(e).split(":")[0]) from None
    except ValueError as e:
        raise ClientError(str(e), code, str(e).split(":")[0]) from None


def speaks(modalities: Any, default: bool) -> bool | None:
    """Whether `output_modalities` asks for speech (`["audio"]`, or the beta's `["audio", "text"]`) or only
    text (`["text"]`); `default` when not given, None when it is neither."""
    if modalities is None:
        return default
    if not (isinstance(modalities, list) and modalities and set(modalities) <= {"audio", "text"}):
        return None
    return "audio" in modalities


def is_text(value: Any) -> bool:
    """A string a message or instructions may be: at most MAX_TEXT characters, encodable."""
    return isinstance(value, str) and len(value) <= MAX_TEXT and is_unicode(value)


def is_unicode(text: str) -> bool:
    """False for text with lone surrogates (JSON can escape them), which no tokenizer can encode."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


SESSION_FIELDS = {"instructions", "scheduler", "turn_detection", "output_modalities", "tools", "tool_choice",
                  "echo_cancellation", "noise_reduction", "truncation", "interrupt_tool_calls"}
NOISE_TYPES = ("near_field", "far_field")


def session_update(update: Any, config: CallConfig, policy: McpPolicy = NO_MCP) -> SessionUpdate:
    """A `session.update`'s fields against the call's `config`, all checked before any applies (the
    scheduler's knobs and the tools' grammars are the engine's to check; MCP servers are checked against
    the operator's `policy`, and listed once the update applies)."""
    if not isinstance(update, dict):
        raise ClientError("'session' must be an object", "invalid_session_update")
    unknown = set(update) - SESSION_FIELDS
    if unknown:
        raise ClientError(f"unknown session fields: {', '.join(sorted(unknown))}", "invalid_session_update")
    instructions = update.get("instructions", config.instructions)
    if not is_text(instructions):
        raise ClientError(f"instructions must be a string of at most {MAX_TEXT} characters, without lone "
                          "surrogates", "invalid_session_update")
    speak = speaks(update.get("output_modalities"), config.spoken)
    if speak is None:
        raise ClientError("output_modalities must be ['audio'] or ['text']", "invalid_session_update")
    try:
        detection = check_update(update["turn_detection"], config.turn_detection) if "turn_detection" in update \
            else {}
    except ValueError as e:
        raise ClientError(str(e), "invalid_session_update") from None
    choice = update.get("tool_choice", config.tool_choice)
    found, _ = checked_tools(update, "session", "invalid_session_update", config, choice, servers=True)
    functions = tuple(found) if "tools" in update else config.tools
    interrupt = update.get("interrupt_tool_calls")
    if interrupt is not None and not isinstance(interrupt, bool):
        raise ClientError("interrupt_tool_calls must be true or false", "invalid_session_update",
                          "interrupt_tool_calls")
    return SessionUpdate(instructions, speak, detection, functions, choice, audio_input(update),
                         session_servers(update, policy), retention(update.get("truncation")), interrupt)


def retention(truncation: Any) -> float | None:
    """The share of the prompt budget a cut keeps, from `truncation`: "auto" (all that fits) or
    {"type": "retention_ratio", "retention_ratio": 0 < r <= 1}; None when not given."""
    if truncation is None:
        return None
    if truncation == "auto":
        return 1.0
    ratio = truncation.get("retention_ratio") if isinstance(truncation, dict) else None
    if (isinstance(truncation, dict) and truncation.get("type") == "retention_ratio"
            and isinstance(ratio, int | float) and not isinstance(ratio, bool) and 0 < ratio <= 1):
        return float(ratio)
    raise ClientError("truncation must be 'auto' or {'type': 'retention_ratio', 'retention_ratio': a number in "
                      "(0, 1]} ('disabled' is not supported: a conversation past the prompt budget must lose its "
                      "oldest messages)", "invalid_session_update", "truncation")


def session_servers(update: dict, policy: McpPolicy) -> tuple[ServerSpec, ...] | None:
    """The MCP servers a session update names in its `tools` (None: it gives no tools)."""
    if "tools" not in update:
        return None
    return named_servers(update["tools"], "session", "invalid_session_update", policy)


def named_servers(entries: Any, where: str, code: str, policy: McpPolicy) -> tuple[ServerSpec, ...]:
    """The MCP servers among `where`'s `tools`, each under the operator's `policy`; their labels unique."""
    specs = []
    for n, entry in enumerate(entries if isinstance(entries, list) else ()):
        if isinstance(entry, dict) and entry.get("type") == "mcp":
            try:
                specs.append(parse_server(entry, f"{where}.tools[{n}]", policy))
            except ValueError as e:
                raise ClientError(str(e), code, str(e).split(":")[0]) from None
    if len({spec.label for spec in specs}) != len(specs):
        raise ClientError(f"{where}.tools: MCP server labels must be unique", code, f"{where}.tools")
    return tuple(specs)


def audio_input(update: dict) -> dict:
    """The audio front end's fields of a session update: `echo_cancellation` (true or false) and
    `noise_reduction` (null, or {"type": "near_field" | "far_field"}, as the Realtime API shapes it)."""
    fields: dict[str, Any] = {}
    if "echo_cancellation" in update:
        if not isinstance(update["echo_cancellation"], bool):
            raise ClientError("echo_cancellation must be true or false", "invalid_session_update", "echo_cancellation")
        fields["echo_cancellation"] = update["echo_cancellation"]
    if "noise_reduction" in update:
        noise = update["noise_reduction"]
        kind = noise.get("type") if isinstance(noise, dict) else None
        if noise is not None and kind not in NOISE_TYPES:
            raise ClientError(f"noise_reduction must be null or {{'type': one of {', '.join(NOISE_TYPES)}}}",
                              "invalid_session_update", "noise_reduction")
        fields["noise_reduction"] = kind
    return fields
