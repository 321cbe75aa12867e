"""`/v1/realtime`: the OpenAI Realtime API's dialect over a native call.

A `RealtimeDialect` is the transport the session talks to: it turns the client's Realtime events into
native ones (base64 audio, 24 kHz PCM16 or 8 kHz G.711 as the session asks, into 16 kHz frames, the GA
session shape into the native one) and the session's native events into Realtime ones (audio frames into
base64 deltas coded the same way, responses into
their output item and content part events, an `event_id` on each). The pipeline never knows which
dialect its caller speaks.
"""

import base64
import json
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np
import soxr

from voicepipe.audio import SAMPLE_RATE
from voicepipe.call import client_events
from voicepipe.call.runtime import Runtime
from voicepipe.ids import new_id
from voicepipe.protocol import ClientEvent, ServerEvent, server_events
from voicepipe.protocol.transport import Transport
from voicepipe.server.realtime_session import (
    PCM,
    UnsupportedSession,
    audio_formats,
    format_of,
    ga_session,
    native_update,
)
from voicepipe.wire_audio import WireAudio

log = logging.getLogger(__name__)
# GA name -> the beta name older clients read (sent instead when the client asks for the beta).
BETA_NAMES = {"response.output_audio.delta": "response.audio.delta",
              "response.output_audio.done": "response.audio.done",
              "response.output_audio_transcript.delta": "response.audio_transcript.delta",
              "response.output_audio_transcript.done": "response.audio_transcript.done",
              "response.output_text.delta": "response.text.delta",
              "response.output_text.done": "response.text.done",
              "conversation.item.added": "conversation.item.created"}
# A response's events about one of its calls, which carry its output index.
CALL_EVENTS = (ServerEvent.ITEM_ADDED, ServerEvent.ITEM_DONE, ServerEvent.CALL_ARGUMENTS_DELTA,
               ServerEvent.CALL_ARGUMENTS_DONE, ServerEvent.MCP_ARGUMENTS_DELTA, ServerEvent.MCP_ARGUMENTS_DONE,
               ServerEvent.MCP_CALL_IN_PROGRESS, ServerEvent.MCP_CALL_COMPLETED, ServerEvent.MCP_CALL_FAILED)


class RealtimeDialect:
    """A Transport speaking the Realtime API to `line` and the native protocol to the session."""

    def __init__(self, line: Transport, runtime: Runtime, max_message_bytes: int, beta: bool = False,
                 max_items: int = 1024) -> None:
        self.line, self.beta, self.max_message_bytes, self.max_items = line, beta, max_message_bytes, max_items
        self.model = runtime.model_id
        self.tts_rate = runtime.tts_rate
        self.heard, self.said = PCM, PCM  # how the client's audio is coded, both ways: PCM16 or G.711
        self._mic = soxr.ResampleStream(self.heard.rate, SAMPLE_RATE, 1, dtype="int16")
        self._speaker: soxr.ResampleStream | None = None
        self._audio_header: dict | None = None  # the native delta whose binary frame comes next
        self._responses: dict[str, dict] = {}  # response id -> its assistant item, transcript so far
        # The conversation's item ids in order (a new one follows the last), as many as a conversation holds.
        self._items: OrderedDict[str, None] = OrderedDict()
        # Native events that read otherwise in the Realtime API (the rest keep their name and shape).
        self._renders: dict[str, Callable[[dict], list[dict]]] = {
            ServerEvent.SESSION_CREATED: self._session, ServerEvent.SESSION_UPDATED: self._session,
            ServerEvent.SCHEDULER_STATS: lambda e: [],  # the web page's panel; not a Realtime event
            ServerEvent.AUDIO_COMMITTED: self._committed, ServerEvent.ITEM_DELETED: self._deleted,
            ServerEvent.ITEM_ADDED: lambda e: [{**e, "previous_item_id": self._follows(e["item"]["id"])}],
            # the beta has no conversation.item.done: its conversation.item.created is the whole item
            ServerEvent.ITEM_DONE: lambda e: [] if self.beta else [e],
            ServerEvent.TRANSCRIPT_DELTA: lambda e: [{"type": e["type"], "item_id": e["item_id"], "content_index": 0,
                                                      "delta": e["delta"]}],
            ServerEvent.TRANSCRIPT_COMPLETED: self._transcribed,
            ServerEvent.RESPONSE_CREATED: lambda e: self._response_created(e["response"]),
            ServerEvent.RESPONSE_TEXT_DELTA: self._text_delta, ServerEvent.RESPONSE_AUDIO_DELTA: self._audio_delta,
            ServerEvent.RESPONSE_AUDIO_DONE: lambda e: self._audio_done(e["response_id"]),
            ServerEvent.RESPONSE_DONE: lambda e: self._response_done(e["response"]),
            ServerEvent.ERROR: lambda e: [{"type": "error", "error": {"param": None, **e["error"]}}],
        }

    # -- client -> session -----------------------------------------------------------------------------------
    async def recv(self) -> str | bytes | dict:
        while True:
            message = await self.line.recv()
            if isinstance(message, bytes):
                await self._send(server_events.error("invalid_event", "send audio as input_audio_buffer.append events "
                                               "(base64, coded as the session's input format), not "
                                               "binary frames"))
                continue
            refused = client_events.too_large(message, self.max_message_bytes)
            if refused is not None:
                await self._send(refused)
                continue
            try:
                event = json.loads(message)
            except (ValueError, RecursionError):
                return message  # the session reports it
            native = await self._inbound(event) if isinstance(event, dict) else message
            if native is not None:
                return native

    async def _inbound(self, event: dict) -> bytes | dict | None:
        kind = event.get("type")
        cause = client_events.event_id_of(event)
        if kind == ClientEvent.AUDIO_APPEND:
            try:
                samples = self.heard.decode(client_events.audio_base64(event))
            except client_events.ClientError as e:
                await self._send(server_events.error(e.code, str(e), event_id=cause))
                return None
            except ValueError as e:
                await self._send(server_events.error("invalid_audio", f"input_audio_buffer.append: {e}",
                                                     event_id=cause))
                return None
            return self._mic.resample_chunk(samples).astype("<i2").tobytes() or None
        if kind == ClientEvent.SESSION_UPDATE:
            try:
                heard, said = audio_formats(event.get("session"))
                native = native_update(event.get("session"))
            except UnsupportedSession as e:
                await self._send(server_events.error("unsupported_session", str(e), event_id=cause))
                return None
            self._code(heard or self.heard, said or self.said)
            return {"type": ClientEvent.SESSION_UPDATE, "session": native}
        return event  # the rest has the same name and shape natively (or the session says so)

    # -- session -> client -----------------------------------------------------------------------------------
    async def send(self, message: dict | bytes) -> None:
        if isinstance(message, bytes):
            await self._audio(message)
            return
        for out in self._outbound(message):
            await self._send(out)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        await self.line.close(code, reason)

    async def _send(self, event: dict) -> None:
        if self.beta:
            event["type"] = BETA_NAMES.get(event["type"], event["type"])
        # Every server event carries an id, but the keypad's, which the Realtime types give none.
        keyed = event["type"] == ServerEvent.KEY_RECEIVED
        await self.line.send(event if keyed else {"event_id": new_id("event"), **event})

    async def _audio(self, pcm: bytes) -> None:
        header, self._audio_header = self._audio_header, None
        if header is None:
            return
        if self._speaker is None:
            self._speaker = soxr.ResampleStream(self.tts_rate, self.said.rate, 1, dtype="int16")
        audio = self._speaker.resample_chunk(np.frombuffer(pcm, "<i2")).astype("<i2")
        response = self._responses.get(header["response_id"])
        if response is not None and len(audio):
            await self._send({"type": "response.output_audio.delta", **response["where"],
                              "delta": base64.b64encode(self.said.encode(audio)).decode()})

    def _code(self, heard: WireAudio, said: WireAudio) -> None:
        """The client's audio coded anew (each direction's resampler restarts only if its rate changed)."""
        if heard.rate != self.heard.rate:
            self._mic = soxr.ResampleStream(heard.rate, SAMPLE_RATE, 1, dtype="int16")
        if said.rate != self.said.rate:
            self._speaker = None
        self.heard, self.said = heard, said

    def _outbound(self, event: dict) -> list[dict]:
        """A native event as the Realtime events it reads as (most keep their name and shape)."""
        kind = event.get("type")
        if self.beta and kind in (ServerEvent.ITEM_ADDED, ServerEvent.ITEM_RETRIEVED):
            event = {**event, "item": _beta_item(event["item"])}
        if "response_id" in event and kind in CALL_EVENTS:
            return self._call(event)
        render = self._renders.get(kind)
        return render(event) if render is not None else [event]

    def _session(self, event: dict) -> list[dict]:
        return [{"type": event["type"], "session": ga_session(event["session"], self.model, self.beta, self.heard,
                                                              self.said)}]

    def _committed(self, event: dict) -> list[dict]:
        """The caller's audio became an item: it joins the conversation after the last one."""
        item = _user_item(event["item_id"], None)
        previous = self._follows(item["id"])
        return [{**event, "previous_item_id": previous},
                {"type": "conversation.item.added", "previous_item_id": previous, "item": item}]

    def _deleted(self, event: dict) -> list[dict]:
        self._items.pop(event["item_id"], None)
        return [event]

    def _transcribed(self, event: dict) -> list[dict]:
        done = {"type": "conversation.item.done", "item": _user_item(event["item_id"], event["transcript"])}
        return [{**event, "content_index": 0}, *([] if self.beta else [done])]

    def _text_delta(self, event: dict) -> list[dict]:
        """A reply's words: its audio's transcript, or its text when it is not spoken."""
        response = self._responses.get(event["response_id"])
        if response is None:
            return []
        response["transcript"] += event["delta"]
        kind = "response.output_audio_transcript.delta" if response["spoken"] else "response.output_text.delta"
        return [{"type": kind, **response["where"], "delta": event["delta"]}]

    def _audio_delta(self, event: dict) -> list[dict]:
        self._audio_header = event  # its binary frame comes next, and goes out as the Realtime delta
        return []

    def _response_created(self, response: dict) -> list[dict]:
        """A reply begins: its output item and content part. A text-only reply's part is text; one outside
        the conversation adds no conversation item."""
        item_id = response["output"][0]["id"]
        where = {"response_id": response["id"], "item_id": item_id, "output_index": 0, "content_index": 0}
        spoken = response.get("output_modalities", ["audio"]) != ["text"]
        in_conversation = response.get("conversation", "auto") != "none"
        self._responses[response["id"]] = {"where": where, "transcript": "", "audio_done": not spoken,
                                           "spoken": spoken, "in_conversation": in_conversation, "calls": []}
        self._speaker = None  # a fresh resampler: no tail of the last reply
        item = _assistant_item(item_id, "in_progress", None, self._item_part(spoken))
        created = {**self._response(response["id"], "in_progress", [], spoken=spoken),
                   "metadata": response.get("metadata")}
        added = [{"type": "conversation.item.added", "previous_item_id": self._follows(item_id), "item": item}]
        return [{"type": "response.created", "response": created},
                {"type": "response.output_item.added", "response_id": response["id"], "output_index": 0,
                 "item": item},
                *(added if in_conversation else []),
                {"type": "response.content_part.added", **where, "part": self._part(spoken, "")}]

    def _call(self, event: dict) -> list[dict]:
        """A reply's call (a function call, an MCP call or its approval request): its output item (after the
        reply's message, at output index 1 on), its arguments as they stream, its progress, the item done."""
        response = self._responses.get(event["response_id"])
        if response is None:
            return []
        kind, calls = event["type"], response["calls"]
        if kind == ServerEvent.ITEM_ADDED:
            calls.append(event["item"]["id"])
        item_id = event["item"]["id"] if "item" in event else event["item_id"]
        where = {"response_id": event["response_id"], "output_index": 1 + calls.index(item_id)}
        if kind not in (ServerEvent.ITEM_ADDED, ServerEvent.ITEM_DONE):
            shown = {k: v for k, v in event.items() if not (self.beta and k == "name")}  # the beta's has none
            shown = {**shown, **where}
            if kind in (ServerEvent.MCP_CALL_IN_PROGRESS, ServerEvent.MCP_CALL_COMPLETED, ServerEvent.MCP_CALL_FAILED):
                del shown["response_id"]  # these name the item alone
            return [shown]
        item = _realtime_item(event["item"])
        if kind == ServerEvent.ITEM_ADDED:
            added = {"type": "conversation.item.added", "previous_item_id": self._follows(item_id), "item": item}
            return [{"type": "response.output_item.added", **where, "item": item},
                    *([added] if response["in_conversation"] else [])]
        done = [] if self.beta or not response["in_conversation"] else [{"type": "conversation.item.done",
                                                                          "item": item}]
        return [{"type": "response.output_item.done", **where, "item": item}, *done]

    def _item_part(self, spoken: bool) -> str:
        """The type of a reply's content in its item, as each dialect names it (GA `output_audio`, beta
        `audio`); the content part events say `audio` / `text` in both."""
        if self.beta:
            return "audio" if spoken else "text"
        return "output_audio" if spoken else "output_text"

    @staticmethod
    def _part(spoken: bool, text: str) -> dict:
        return {"type": "audio" if spoken else "text", ("transcript" if spoken else "text"): text}

    def _response(self, response_id: str, status: str, output: list[dict], usage: dict[str, Any] | None = None,
                  spoken: bool = True) -> dict:
        """A response object in the dialect's shape (GA `output_modalities` and `audio.output`, beta
        `modalities`, `voice` and `output_audio_format`)."""
        body: dict[str, Any] = {"id": response_id, "object": "realtime.response", "status": status,
                                "output": output}
        if self.beta:
            body.update(modalities=["audio", "text"] if spoken else ["text"], voice="piper",
                        output_audio_format=format_of(self.said, True))
        else:
            body.update(output_modalities=["audio" if spoken else "text"],
                        audio={"output": {"format": format_of(self.said, False), "voice": "piper"}})
        if usage is not None:
            cached = usage.get("input_token_details", {}).get("cached_tokens", 0)
            body["usage"] = {**usage, "input_token_details": {"text_tokens": usage["input_tokens"],
                                                              "audio_tokens": 0, "cached_tokens": cached},
                             "output_token_details": {"text_tokens": usage["output_tokens"], "audio_tokens": 0}}
        return body

    def _follows(self, item_id: str) -> str | None:
        """The item `item_id` joins the conversation after (None for the first): what lets a client mirror
        the conversation in order."""
        self._items.pop(item_id, None)  # one added again moves to the end, as in the conversation
        previous = next(reversed(self._items), None)
        self._items[item_id] = None
        if len(self._items) > self.max_items:
            self._items.popitem(last=False)
        return previous

    def _audio_done(self, response_id: str) -> list[dict]:
        """The reply's audio ends: what the resampler still holds, then the done event."""
        response = self._responses.get(response_id)
        if response is None or response["audio_done"]:
            return []
        response["audio_done"] = True
        events = []
        if self._speaker is not None:
            tail = self._speaker.resample_chunk(np.zeros(0, np.int16), last=True).astype("<i2")
            self._speaker = None
            if len(tail):
                events.append({"type": "response.output_audio.delta", **response["where"],
                               "delta": base64.b64encode(self.said.encode(tail)).decode()})
        return [*events, {"type": "response.output_audio.done", **response["where"]}]

    def _response_done(self, native: dict) -> list[dict]:
        response = self._responses.pop(native["id"], None)
        if response is None:
            return [{"type": "response.done", "response": self._response(native["id"], native["status"], [])}]
        where, spoken, said = response["where"], response["spoken"], response["transcript"]
        transcript = native["output"][0]["text"] if native.get("output") else said
        status = "completed" if native["status"] == "completed" else "incomplete"
        item = _assistant_item(where["item_id"], status, transcript, self._item_part(spoken))
        calls = [_realtime_item(call) for call in native.get("output", [])[1:]]
        body = self._response(native["id"], native["status"], [item, *calls], native.get("usage"), spoken)
        body.update({k: native[k] for k in ("status_details", "timings", "waterfall", "deadline_met", "underruns")
                     if k in native})
        text_done = ({"type": "response.output_audio_transcript.done", **where, "transcript": said} if spoken
                     else {"type": "response.output_text.done", **where, "text": said})
        item_done = [{"type": "conversation.item.done", "item": item}] \
            if response["in_conversation"] and not self.beta else []
        return [*self._audio_done(native["id"]), text_done,
                {"type": "response.content_part.done", **where, "part": self._part(spoken, said)},
                {"type": "response.output_item.done", "response_id": native["id"], "output_index": 0, "item": item},
                *item_done,
                {"type": "response.done", "response": body}]


def _realtime_item(item: dict) -> dict:
    """A call's item as the Realtime API shapes it (a function call's says what object it is; MCP items
    do not)."""
    return {**item, "object": "realtime.item"} if item["type"] == "function_call" else item


def _beta_item(item: dict) -> dict:
    """A native item's content in the beta's part names (`text` and `audio` for the assistant's)."""
    names = {"output_text": "text", "output_audio": "audio"}
    if "content" not in item:  # a function call or its output
        return item
    return {**item, "content": [{**part, "type": names.get(part["type"], part["type"])} for part in item["content"]]}


def _user_item(item_id: str, transcript: str | None) -> dict:
    return {"id": item_id, "object": "realtime.item", "type": "message", "role": "user",
            "status": "completed", "content": [{"type": "input_audio", "transcript": transcript}]}


def _assistant_item(item_id: str, status: str, transcript: str | None, part: str = "output_audio") -> dict:
    key = "transcript" if part in ("output_audio", "audio") else "text"
    content = [] if transcript is None else [{"type": part, key: transcript}]
    return {"id": item_id, "object": "realtime.item", "type": "message", "role": "assistant",
            "status": status, "content": content}

