"""`/v1/realtime`: the OpenAI Realtime API's wire format (GA, or the beta older clients ask for).

Its client events read as native ones (base64 audio, 24 kHz PCM16 or 8 kHz G.711 as the session asks, into
16 kHz frames; the GA session shape into the native one; the rest have the same name and shape); the
pipeline's events render as Realtime events (reply audio as base64 deltas coded the same way, each
response as its output item and content part events, each item after the one before it, an `event_id` on
each). The pipeline never knows which format its caller speaks.
"""

import base64
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np
import soxr

from voicepipe.audio import SAMPLE_RATE
from voicepipe.call import client_events
from voicepipe.call.native_serializer import call_events, call_item, native_messages
from voicepipe.call.runtime import Runtime
from voicepipe.ids import new_id
from voicepipe.pipeline.events import (
    ApprovalRequested,
    Event,
    FunctionCallArguments,
    FunctionCallDone,
    FunctionCallStarted,
    ItemFound,
    ResponseCreated,
    SpeechStopped,
    TextDelta,
    ToolRan,
    TranscriptDelta,
    TranscriptFinal,
    UtteranceDropped,
)
from voicepipe.pipeline.outbound import AudioEnded, AudioSent, ResponseDone, SessionDescribed, StatsReported
from voicepipe.protocol import ClientEvent, ServerEvent, server_events
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
CALLS = (FunctionCallStarted, FunctionCallArguments, FunctionCallDone, ToolRan, ApprovalRequested)


class RealtimeSerializer:
    """The Realtime API's wire format for one call (its audio coding and conversation order are the call's)."""

    def __init__(self, runtime: Runtime, max_message_bytes: int, beta: bool = False, max_items: int = 1024) -> None:
        self.beta, self.max_message_bytes, self.max_items = beta, max_message_bytes, max_items
        self.model = runtime.model_id
        self.heard, self.said = PCM, PCM  # how the client's audio is coded, both ways: PCM16 or G.711
        self._mic = soxr.ResampleStream(self.heard.rate, SAMPLE_RATE, 1, dtype="int16")
        self._speaker: soxr.ResampleStream | None = None
        self._responses: dict[str, dict] = {}  # response id -> its assistant item, transcript so far
        # The conversation's item ids in order (a new one follows the last), as many as a conversation holds.
        self._items: OrderedDict[str, None] = OrderedDict()
        # Events that read otherwise in the Realtime API (the rest read as natively: same name and shape).
        self._renders: dict[type[Event], Callable[[Any], list[dict]]] = {
            SessionDescribed: self._session,
            StatsReported: lambda e: [],  # the web page's panel; not a Realtime event
            SpeechStopped: self._committed, ItemFound: self._item_found, UtteranceDropped: self._item_found,
            TranscriptDelta: lambda e: [{"type": ServerEvent.TRANSCRIPT_DELTA, "item_id": e.item_id,
                                         "content_index": 0, "delta": e.delta}],
            TranscriptFinal: self._transcribed,
            ResponseCreated: self._response_created, TextDelta: self._text_delta, AudioSent: self._audio_delta,
            AudioEnded: lambda e: self._audio_done(e.turn.response_id), ResponseDone: self._response_done,
            **dict.fromkeys(CALLS, self._call),
        }

    # -- client -> session -----------------------------------------------------------------------------------
    def parse(self, message: str | bytes) -> bytes | dict | None:
        if isinstance(message, bytes):
            raise client_events.ClientError("send audio as input_audio_buffer.append events (base64, coded as the "
                                            "session's input format), not binary frames", "invalid_event")
        event = client_events.json_event(message, self.max_message_bytes)
        kind = event.get("type")
        cause = client_events.event_id_of(event)
        if kind == ClientEvent.AUDIO_APPEND:
            try:
                samples = self.heard.decode(client_events.audio_base64(event))
            except client_events.ClientError as e:
                raise client_events.ClientError(str(e), e.code, e.param, cause) from None
            except ValueError as e:
                raise client_events.ClientError(f"input_audio_buffer.append: {e}", "invalid_audio",
                                                event_id=cause) from None
            return self._mic.resample_chunk(samples).astype("<i2").tobytes() or None
        if kind == ClientEvent.SESSION_UPDATE:
            try:
                heard, said = audio_formats(event.get("session"))
                native = native_update(event.get("session"))
            except UnsupportedSession as e:
                raise client_events.ClientError(str(e), "unsupported_session", event_id=cause) from None
            self._code(heard or self.heard, said or self.said)
            return {"type": ClientEvent.SESSION_UPDATE, "session": native}
        return event  # the rest has the same name and shape natively (or the session says so)

    # -- session -> client -----------------------------------------------------------------------------------
    def render(self, event: Event) -> list[dict | bytes]:
        render = self._renders.get(type(event))
        messages = render(event) if render is not None else self._as_native(event)
        return [self._stamped(m) for m in messages]

    def _as_native(self, event: Event) -> list[dict]:
        """An event whose messages have the same names and shapes as natively, but that an item added
        names the one it follows, the beta has no `conversation.item.done` (its `created` is the whole
        item), and an error always has a `param`."""
        messages = []
        for message in native_messages(event):
            kind = message["type"] if isinstance(message, dict) else None
            if kind == ServerEvent.ITEM_ADDED:
                message = {**message, "previous_item_id": self._follows(message["item"]["id"])}
            elif kind == ServerEvent.ERROR:
                message = {**message, "error": {"param": None, **message["error"]}}
            elif kind is None or (kind == ServerEvent.ITEM_DONE and self.beta):
                continue
            messages.append(message)
        return messages

    def _stamped(self, message: dict) -> dict:
        """A message as the dialect sends it: the beta's names and item parts, and an `event_id` on every
        event but the keypad's, which the Realtime types give none."""
        kind = message["type"]
        if self.beta:
            if kind in (ServerEvent.ITEM_ADDED, ServerEvent.ITEM_RETRIEVED):
                message = {**message, "item": _beta_item(message["item"])}
            message["type"] = BETA_NAMES.get(kind, kind)
        return message if kind == ServerEvent.KEY_RECEIVED else {"event_id": new_id("event"), **message}

    def _code(self, heard: WireAudio, said: WireAudio) -> None:
        """The client's audio coded anew (each direction's resampler restarts only if its rate changed)."""
        if heard.rate != self.heard.rate:
            self._mic = soxr.ResampleStream(heard.rate, SAMPLE_RATE, 1, dtype="int16")
        if said.rate != self.said.rate:
            self._speaker = None
        self.heard, self.said = heard, said

    def _session(self, event: SessionDescribed) -> list[dict]:
        kind = ServerEvent.SESSION_CREATED if event.created else ServerEvent.SESSION_UPDATED
        return [{"type": kind, "session": ga_session(event.session, self.model, self.beta, self.heard, self.said)}]

    def _committed(self, event: SpeechStopped) -> list[dict]:
        """The caller's audio became an item: it joins the conversation after the last one."""
        stopped, committed = native_messages(event)
        item = _user_item(event.item_id, None)
        previous = self._follows(item["id"])
        return [stopped, {**committed, "previous_item_id": previous},
                {"type": ServerEvent.ITEM_ADDED, "previous_item_id": previous, "item": item}]

    def _item_found(self, event: ItemFound | UtteranceDropped) -> list[dict]:
        if isinstance(event, UtteranceDropped) or event.action == "delete":
            self._items.pop(event.item_id, None)
        return native_messages(event)

    def _transcribed(self, event: TranscriptFinal) -> list[dict]:
        done = {"type": ServerEvent.ITEM_DONE, "item": _user_item(event.item_id, event.text)}
        return [{**native_messages(event)[0], "content_index": 0}, *([] if self.beta else [done])]

    def _text_delta(self, event: TextDelta) -> list[dict]:
        """A reply's words: its audio's transcript, or its text when it is not spoken."""
        response = self._responses.get(event.turn.response_id)
        if response is None:
            return []
        response["transcript"] += event.text
        kind = "response.output_audio_transcript.delta" if response["spoken"] else "response.output_text.delta"
        return [{"type": kind, **response["where"], "delta": event.text}]

    def _audio_delta(self, event: AudioSent) -> list[dict]:
        if self._speaker is None:
            self._speaker = soxr.ResampleStream(event.sample_rate, self.said.rate, 1, dtype="int16")
        audio = self._speaker.resample_chunk(np.asarray(event.pcm, np.int16)).astype("<i2")
        response = self._responses.get(event.turn.response_id)
        if response is None or not len(audio):
            return []
        return [{"type": "response.output_audio.delta", **response["where"],
                 "delta": base64.b64encode(self.said.encode(audio)).decode()}]

    def _response_created(self, event: ResponseCreated) -> list[dict]:
        """A reply begins: its output item and content part. A text-only reply's part is text; one outside
        the conversation adds no conversation item."""
        turn = event.turn
        response_id, item_id, spoken = turn.response_id, turn.output_item_id, turn.spoken
        where = {"response_id": response_id, "item_id": item_id, "output_index": 0, "content_index": 0}
        in_conversation = not event.out_of_band
        self._responses[response_id] = {"where": where, "transcript": "", "audio_done": not spoken,
                                        "spoken": spoken, "in_conversation": in_conversation, "calls": []}
        self._speaker = None  # a fresh resampler: no tail of the last reply
        item = _assistant_item(item_id, "in_progress", None, self._item_part(spoken))
        created = {**self._response(response_id, "in_progress", [], spoken=spoken), "metadata": event.metadata}
        added = [{"type": ServerEvent.ITEM_ADDED, "previous_item_id": self._follows(item_id), "item": item}]
        return [{"type": "response.created", "response": created},
                {"type": "response.output_item.added", "response_id": response_id, "output_index": 0,
                 "item": item},
                *(added if in_conversation else []),
                {"type": "response.content_part.added", **where, "part": self._part(spoken, "")}]

    def _call(self, event: Any) -> list[dict]:
        """A reply's call (a function call, an MCP call or its approval request): its output item (after the
        reply's message, at output index 1 on), its arguments as they stream, its progress, the item done."""
        response = self._responses.get(event.turn.response_id)
        if response is None:
            return []
        calls = response["calls"]
        if event.item_id not in calls:
            calls.append(event.item_id)
        where = {"response_id": event.turn.response_id, "output_index": 1 + calls.index(event.item_id)}
        return [out for message in call_events(event) for out in self._call_message(message, where, response)]

    def _call_message(self, message: dict, where: dict, response: dict) -> list[dict]:
        kind = message["type"]
        if kind not in (ServerEvent.ITEM_ADDED, ServerEvent.ITEM_DONE):
            shown = {k: v for k, v in message.items() if not (self.beta and k == "name")}  # the beta's has none
            shown = {**shown, **where}
            if kind in (ServerEvent.MCP_CALL_IN_PROGRESS, ServerEvent.MCP_CALL_COMPLETED, ServerEvent.MCP_CALL_FAILED):
                del shown["response_id"]  # these name the item alone
            return [shown]
        item = _realtime_item(message["item"])
        if kind == ServerEvent.ITEM_ADDED:
            added = {"type": ServerEvent.ITEM_ADDED, "previous_item_id": self._follows(item["id"]), "item": item}
            return [{"type": "response.output_item.added", **where, "item": item},
                    *([added] if response["in_conversation"] else [])]
        done = [] if self.beta or not response["in_conversation"] else [{"type": ServerEvent.ITEM_DONE,
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

    def _response_done(self, event: ResponseDone) -> list[dict]:
        turn, reply = event.turn, event.reply
        usage = server_events.token_usage(reply.prompt_tokens, reply.output_tokens, reply.cached_tokens)
        response = self._responses.pop(turn.response_id, None)
        if response is None:
            return [{"type": "response.done", "response": self._response(turn.response_id, event.status, [])}]
        where, spoken, said = response["where"], response["spoken"], response["transcript"]
        status = "completed" if event.status == "completed" else "incomplete"
        item = _assistant_item(where["item_id"], status, event.said, self._item_part(spoken))
        calls = [_realtime_item(call_item(reply, item_id, call)) for item_id, call in reply.calls]
        body = self._response(turn.response_id, event.status, [item, *calls], usage, spoken)
        body.update(event.details)
        text_done = ({"type": "response.output_audio_transcript.done", **where, "transcript": said} if spoken
                     else {"type": "response.output_text.done", **where, "text": said})
        item_done = [{"type": ServerEvent.ITEM_DONE, "item": item}] \
            if response["in_conversation"] and not self.beta else []
        return [*self._audio_done(turn.response_id), text_done,
                {"type": "response.content_part.done", **where, "part": self._part(spoken, said)},
                {"type": "response.output_item.done", "response_id": turn.response_id, "output_index": 0,
                 "item": item},
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

