"""One call: its pipeline, the client's messages, and cleaning everything up when the client goes away."""

import asyncio
import base64
import binascii
import copy
import json
import logging
from dataclasses import asdict
from typing import Any

import numpy as np

from scheduler import KNOBS
from scheduler.channel.client import EngineUnavailable
from scheduler.grammar.schema_limits import SchemaTooComplex
from voicepipe.audio import to_float32
from voicepipe.call.limits import Limits
from voicepipe.call.runtime import Runtime
from voicepipe.constrained import grammars, tools
from voicepipe.constrained.grammars import FieldRefused
from voicepipe.ids import new_id
from voicepipe.pipeline import CallConfig, Conversation, build_pipeline
from voicepipe.pipeline.events import AudioIn
from voicepipe.pipeline.requests import (
    CancelRequested,
    ClearRequested,
    CommitRequested,
    ItemCreated,
    ItemRequested,
    ResponseRequested,
    TruncateRequested,
)
from voicepipe.pipeline.turn_metrics import turn_metrics
from voicepipe.protocol import ClientEvent, ServerEvent, client_events, server_events
from voicepipe.protocol.transport import Disconnected, Transport
from voicepipe.turns.detection import check_update
from voicepipe.turns.endpointer import SAMPLE_RATE

log = logging.getLogger(__name__)
STATS_INTERVAL_S = 0.5
MAX_INSTRUCTIONS = 8000
MAX_METADATA = 16


class InvalidUpdate(ValueError):
    """A session.update the session refuses; nothing of it was applied. `code` and `param` say why in a
    word and where, when a field of it is at fault."""

    def __init__(self, message: str, code: str = "invalid_session_update", param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.param = code, param


class InvalidResponse(ValueError):
    """A response.create the session refuses, with the error code to say so."""

    def __init__(self, message: str, code: str = "invalid_response") -> None:
        super().__init__(message)
        self.code = code


class Session:
    """One websocket client and the pipeline answering it.

    Every malformed message gets an `error` event and the call goes on. When the client goes away, the
    pipeline's tasks are cancelled (which aborts the turn's LLM request and skips its unstarted jobs) and
    the call's conversation prefix is released from the KV pool.
    """

    def __init__(self, transport: Transport, runtime: Runtime, limits: Limits, config: CallConfig | None = None,
                 may_tune: bool = True) -> None:
        self.transport, self.runtime, self.limits = transport, runtime, limits
        self.may_tune = may_tune  # may turn the engine's knobs, which every call shares
        self.id = new_id("sess")
        self.config = copy.deepcopy(config) if config is not None else CallConfig()  # this call's own settings
        self.config.max_utterance_s = limits.max_utterance_s
        self.conversation = Conversation(self.config.instructions, runtime.tokenizer, limits.max_conversation_items,
                                         limits.max_conversation_bytes)
        self.pipeline = build_pipeline(runtime, self.id, self.config, self.conversation, self.send)
        self._send_lock = asyncio.Lock()
        self._responses: set[str] = set()  # response.created sent, response.done not yet
        self._cause: str | None = None  # the event_id of the client event being handled

    @property
    def replying(self) -> bool:
        """A reply is in progress (what a draining server waits for)."""
        return bool(self._responses)

    # -- the call --------------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Serve the call until the client leaves or idles out; always cleans up."""
        self.runtime.engine.open_session(self.id)
        self.pipeline.start()
        stats = asyncio.create_task(self._send_stats())
        log.info("call %s started", self.id)
        try:
            await self.send(server_events.session_event(ServerEvent.SESSION_CREATED, self.describe()))
            await self._receive()
        finally:
            stats.cancel()
            await self.pipeline.stop()
            await asyncio.gather(stats, return_exceptions=True)
            self.runtime.engine.release_session(self.id)
            log.info("call %s ended", self.id)

    async def _receive(self) -> None:
        while True:
            try:
                message = await asyncio.wait_for(self.transport.recv(), self.limits.idle_timeout_s)
            except TimeoutError:
                idle = self.limits.idle_timeout_s
                await self.error("idle_timeout", f"no message for {idle:g} s; closing the call")
                await self.transport.close(1000, "idle timeout")
                return
            except Disconnected:
                return
            await self._handle(message)
            await asyncio.sleep(0)  # a transport with a burst buffered returns at once: let the rest of the loop run

    async def send(self, *messages: dict | bytes) -> None:
        """Send JSON events and binary frames together (an audio.delta stays next to its frame); a client
        that has gone is noticed by the receiving loop, so a failed send is dropped here."""
        async with self._send_lock:
            for message in messages:
                kind = message.get("type") if isinstance(message, dict) else None
                if kind in (ServerEvent.RESPONSE_CREATED, ServerEvent.RESPONSE_DONE):
                    response_id = message["response"]["id"]
                    if kind == ServerEvent.RESPONSE_CREATED:
                        self._responses.add(response_id)
                    else:
                        self._responses.discard(response_id)
                try:
                    await self.transport.send(message)
                except Disconnected:
                    return

    async def error(self, code: str, message: str) -> None:
        """An error caused by the client event being handled (its `event_id` goes back with it)."""
        await self.send(server_events.error(code, message, event_id=self._cause))

    # -- client messages -------------------------------------------------------------------------------------
    async def _handle(self, message: str | bytes | dict) -> None:
        """One client message: audio, an event as text, or an event a dialect already parsed (and whose
        size it checked)."""
        if not isinstance(message, dict):
            refused = client_events.too_large(message, self.limits.max_message_bytes)
            if refused is not None:
                await self.send(refused)
                return
        if isinstance(message, bytes):
            await self._audio(message)
            return
        try:
            event = message if isinstance(message, dict) else json.loads(message)
        except (ValueError, RecursionError) as e:  # RecursionError: nesting deeper than the parser goes
            await self.error("invalid_json", f"the message is not valid JSON ({type(e).__name__}: {e})")
            return
        kind = event.get("type") if isinstance(event, dict) else None
        self._cause = client_events.event_id_of(event)
        try:
            await self._dispatch(kind, event)
        finally:
            self._cause = None

    async def _dispatch(self, kind: Any, event: Any) -> None:
        if not isinstance(kind, str):
            await self.error("invalid_event", "an event must be a JSON object with a string 'type'")
        elif kind == ClientEvent.AUDIO_APPEND:
            await self._append(event)
        elif kind == ClientEvent.SESSION_UPDATE:
            await self._update(event)
        elif kind == ClientEvent.RESPONSE_CANCEL:
            self.pipeline.push(CancelRequested())
        elif kind == ClientEvent.RESPONSE_CREATE:
            await self._create_response(event.get("response"))
        elif kind == ClientEvent.AUDIO_COMMIT:
            self.pipeline.push(CommitRequested(self._cause))
        elif kind == ClientEvent.AUDIO_CLEAR:
            self.pipeline.push(ClearRequested())
        elif kind == ClientEvent.ITEM_CREATE:
            await self._create_item(event.get("item"))
        elif kind == ClientEvent.ITEM_TRUNCATE:
            await self._truncate(event)
        elif kind in (ClientEvent.ITEM_DELETE, ClientEvent.ITEM_RETRIEVE):
            item_id = event.get("item_id")
            if not isinstance(item_id, str) or not item_id or len(item_id) > 64:
                await self.error("invalid_item", f"{kind} needs an item_id string")
            else:
                self.pipeline.push(ItemRequested(item_id, kind.rsplit(".", 1)[1], self._cause))
        else:
            await self.error("unknown_event", f"unknown event type {kind!r}")

    async def _audio(self, pcm: bytes) -> None:
        if len(pcm) % 2:
            await self.error("invalid_audio", f"PCM16 audio needs an even number of bytes, got {len(pcm)}")
        elif pcm:
            self.pipeline.push(AudioIn(to_float32(np.frombuffer(pcm, "<i2"))))

    async def _append(self, event: dict) -> None:
        audio = event.get("audio")
        try:
            if not isinstance(audio, str):
                raise ValueError("'audio' must be a base64 string")
            pcm = base64.b64decode(audio, validate=True)
        except (ValueError, binascii.Error) as e:
            await self.error("invalid_audio", f"input_audio_buffer.append: {e}")
            return
        await self._audio(pcm)

    async def _create_item(self, item: Any) -> None:
        """A text message, a function call or a call's output joins the conversation (a reply to it needs a
        response.create)."""
        item_id = item.get("id") if isinstance(item, dict) and isinstance(item.get("id"), str) \
            and len(item["id"]) <= 64 else new_id("item")
        try:
            if isinstance(item, dict) and item.get("type") in ("function_call", "function_call_output"):
                self.pipeline.push(_call_item(item_id, item))
            else:
                self.pipeline.push(ItemCreated(item_id, *_message_text(item)))
        except ValueError as e:
            await self.error("invalid_item", f"conversation.item.create: {e}")

    async def _create_response(self, response: Any) -> None:
        """A reply to the conversation as it stands, as `response` asks: `metadata` (at most 16 string
        pairs, as OpenAI's) comes back in `response.created`; `instructions`, `max_output_tokens`,
        `output_modalities` (`["text"]`: nothing spoken) and `conversation: "none"` (the reply stays out of
        the conversation) hold for this reply only."""
        try:
            asked = _response_request(response if response is not None else {}, self._cause, self.config.spoken)
        except InvalidResponse as e:
            await self.error(e.code, str(e))
            return
        self.pipeline.push(asked)

    async def _truncate(self, event: dict) -> None:
        item_id, end = event.get("item_id"), event.get("audio_end_ms")
        if not isinstance(item_id, str) or isinstance(end, bool) or not isinstance(end, int) or end < 0:
            await self.error("invalid_truncate", "conversation.item.truncate needs an item_id string and an "
                             "audio_end_ms integer >= 0")
            return
        self.pipeline.push(TruncateRequested(item_id, end))

    async def _update(self, event: dict) -> None:
        try:
            await self._apply_update(event.get("session"))
        except InvalidUpdate as e:
            await self.send(server_events.error(e.code, str(e), event_id=self._cause, param=e.param))
            return
        await self.send(server_events.session_event(ServerEvent.SESSION_UPDATED, self.describe()))

    async def _apply_update(self, update: Any) -> None:
        """Check every field first (new tools' grammars compiled in the engine, so a reply can use them at
        once), then apply them all; a bad one changes nothing."""
        if not isinstance(update, dict):
            raise InvalidUpdate("'session' must be an object")
        unknown = set(update) - {"instructions", "scheduler", "turn_detection", "output_modalities", "tools",
                                 "tool_choice"}
        if unknown:
            raise InvalidUpdate(f"unknown session fields: {', '.join(sorted(unknown))}")
        instructions = update.get("instructions", self.config.instructions)
        if not _is_text(instructions):
            raise InvalidUpdate(f"instructions must be a string of at most {MAX_INSTRUCTIONS} characters, "
                                "without lone surrogates")
        spoken = _spoken(update.get("output_modalities"), self.config.spoken)
        if spoken is None:
            raise InvalidUpdate("output_modalities must be ['audio'] or ['text']")
        try:
            detection = check_update(update["turn_detection"], self.config.turn_detection) \
                if "turn_detection" in update else {}
        except ValueError as e:
            raise InvalidUpdate(str(e)) from None
        try:
            found = tools.parse_tools(update["tools"], "session.tools", nested=False) if "tools" in update \
                else list(self.config.tools)
            choice = update.get("tool_choice", self.config.tool_choice)
            chosen = tools.choose(found, choice, "session.tool_choice")
        except SchemaTooComplex as e:
            raise InvalidUpdate(str(e), "schema_too_complex", str(e).split(":")[0]) from None
        except ValueError as e:
            raise InvalidUpdate(str(e), param=str(e).split(":")[0]) from None
        if chosen and ("tools" in update or "tool_choice" in update):
            try:
                await grammars.prepare(self.runtime.engine, tools.grammars(found, chosen, "session.tools"))
            except FieldRefused as e:
                raise InvalidUpdate(str(e), e.code, e.param) from None
            except EngineUnavailable:
                raise InvalidUpdate("the engine is restarting; send the update again in a few seconds",
                                    "engine_unavailable") from None
        knobs = update.get("scheduler", {})
        if not isinstance(knobs, dict):
            raise InvalidUpdate("scheduler must be an object")
        if knobs and not self.may_tune:
            raise InvalidUpdate("the scheduler's knobs are shared by every call: changing them needs the API "
                                "key or the server's own page")
        if knobs:
            try:
                self.runtime.engine.update_config(**knobs)  # checks all knobs before applying any
            except (ValueError, TypeError) as e:
                raise InvalidUpdate(f"scheduler: {e}") from None
        for name, value in detection.items():
            setattr(self.config.turn_detection, name, value)
        self.config.spoken = spoken
        self.config.instructions = self.conversation.instructions = instructions
        self.config.tools, self.config.tool_choice = tuple(found), choice
        self.conversation.tool_instructions = tools.instructions(found, chosen) if chosen else ""

    def describe(self) -> dict:
        """The session as the client sees it. The knobs are the engine's, shared by every call, as its client
        last set them (the engine applies them between two steps)."""
        config = self.runtime.engine.config
        scheduler = {"policy": config.policy, "max_batch_tokens": config.max_batch_tokens,
                     "max_batch_seqs": config.max_batch_seqs}
        return {
            "id": self.id,
            "object": "realtime.session",
            "instructions": self.config.instructions,
            "output_modalities": ["audio" if self.config.spoken else "text"],
            "input_audio_format": {"type": "pcm16", "sample_rate": SAMPLE_RATE},
            "output_audio_format": {"type": "pcm16", "sample_rate": self.runtime.tts_rate},
            "turn_detection": self.config.turn_detection.describe(),
            "tools": [{"type": "function", "name": t.name, "description": t.description, "parameters": t.parameters}
                      for t in self.config.tools],
            "tool_choice": self.config.tool_choice,
            "time_to_first_audio_deadline_s": self.config.ttfa_s,
            "scheduler": scheduler,
            "limits": {**asdict(self.limits), "scheduler": {k: list(v) for k, v in KNOBS.items()}},
        }

    # -- scheduler stats -------------------------------------------------------------------------------------
    async def _send_stats(self) -> None:
        while True:
            await asyncio.sleep(STATS_INTERVAL_S)
            try:
                stats = await page_stats(self.runtime)
            except EngineUnavailable:
                continue  # restarting: the page hears again when it is back
            await self.send(server_events.scheduler_stats(stats))


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
        if not _is_text(text):
            raise ValueError(f"a part's 'text' must be a string of at most {MAX_INSTRUCTIONS} characters")
        texts.append(text)
    return role, "".join(texts)


def _call_item(item_id: str, item: dict) -> ItemCreated:
    """A function call (history the client replays) or its output (what the client's function returned),
    as the model reads it; ValueError says what is wrong with it."""
    call_id = item.get("call_id")
    if not (isinstance(call_id, str) and 0 < len(call_id) <= 64):
        raise ValueError("a function call item needs a 'call_id' string")
    if item["type"] == "function_call_output":
        output = item.get("output")
        if not _is_text(output):
            raise ValueError(f"'output' must be a string of at most {MAX_INSTRUCTIONS} characters")
        return ItemCreated(item_id, "tool", output, server_events.function_call_output_item(item_id, call_id, output))
    name, arguments = item.get("name"), item.get("arguments", "{}")
    if not (isinstance(name, str) and name and _is_text(arguments)):
        raise ValueError("a function_call item needs a 'name' and its 'arguments' as a JSON string")
    return ItemCreated(item_id, "assistant", tools.call_text(name, arguments),
                       server_events.function_call_item(item_id, call_id, name, arguments))


def _response_request(response: Any, event_id: str | None, spoken: bool) -> ResponseRequested:
    """The parameters of a `response.create`, checked; InvalidResponse names the first bad one."""
    if not isinstance(response, dict):
        raise InvalidResponse("response must be an object")
    metadata = response.get("metadata")
    if metadata is not None and not (isinstance(metadata, dict) and len(metadata) <= MAX_METADATA and all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
            for k, v in metadata.items())):
        raise InvalidResponse(f"response.metadata must be at most {MAX_METADATA} pairs of strings (keys up to 64 "
                              "characters, values up to 512)", "invalid_metadata")
    instructions = response.get("instructions")
    if instructions is not None and not _is_text(instructions):
        raise InvalidResponse(f"response.instructions must be a string of at most {MAX_INSTRUCTIONS} characters")
    limit = response.get("max_output_tokens", response.get("max_response_output_tokens", "inf"))
    if limit != "inf" and (isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 4096):
        raise InvalidResponse("response.max_output_tokens must be an integer in [1, 4096] or 'inf'")
    spoken = _spoken(response.get("output_modalities", response.get("modalities")), spoken)
    if spoken is None:
        raise InvalidResponse("response.output_modalities must be ['audio'] or ['text']")
    conversation = response.get("conversation", "auto")
    if conversation not in ("auto", "none"):
        raise InvalidResponse("response.conversation must be 'auto' or 'none'")
    return ResponseRequested(metadata, event_id, instructions, None if limit == "inf" else limit,
                             conversation == "none", spoken)


def _spoken(modalities: Any, default: bool) -> bool | None:
    """Whether `output_modalities` asks for speech (`["audio"]`, or the beta's `["audio", "text"]`) or only
    text (`["text"]`); `default` when not given, None when it is neither."""
    if modalities is None:
        return default
    if not (isinstance(modalities, list) and modalities and set(modalities) <= {"audio", "text"}):
        return None
    return "audio" in modalities


def _is_text(value: Any) -> bool:
    """A string a message or instructions may be: at most MAX_INSTRUCTIONS characters, encodable."""
    return isinstance(value, str) and len(value) <= MAX_INSTRUCTIONS and _is_unicode(value)


def _is_unicode(text: str) -> bool:
    """False for text with lone surrogates (JSON can escape them), which no tokenizer can encode."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


async def page_stats(runtime: Runtime) -> dict:
    """The engine's page view (trimmed in the engine), plus the deadline outcomes of all calls."""
    snap = await runtime.engine.view("page")
    outcomes = turn_metrics(runtime.registry).outcomes
    return {**snap, "deadlines": {"hit": outcomes.get("met", 0), "miss": outcomes.get("missed", 0)}}
