"""The protocol as serializers: the pipeline and the session tell their client typed events only, and one
reply's events render in each wire format (native, Realtime GA and beta, a phone provider's media stream)
by that format's serializer alone."""

import asyncio
import base64
import json
import time

import numpy as np
import pytest
from support.fake_call import QUESTION, REPLY
from support.fakes import FakeASR, FakeEngine, FakeTokenizer, FakeTTS

from voicepipe.call.limits import Limits
from voicepipe.call.native_serializer import NativeSerializer
from voicepipe.call.runtime import Runtime
from voicepipe.call.session import Session
from voicepipe.pipeline.events import Error, Event, ResponseCreated, SpeechStopped, TextDelta, UtteranceDropped
from voicepipe.pipeline.outbound import AudioEnded, AudioSent, PlaybackCleared, ResponseDone, SessionDescribed
from voicepipe.pipeline.turn import Reply, Turn
from voicepipe.protocol import ClientEvent
from voicepipe.protocol.transport import Disconnected
from voicepipe.server.media_streams import TwilioSerializer
from voicepipe.server.realtime import RealtimeSerializer

ASK = [{"type": ClientEvent.ITEM_CREATE, "item": {"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": QUESTION}]}},
       {"type": ClientEvent.RESPONSE_CREATE}]


class EventLine:
    """A line in this process (as `talk`'s and a SIP call's are): client events in as dicts, the session's
    events out as they are."""

    def __init__(self, *inbound: dict) -> None:
        self.inbox: asyncio.Queue = asyncio.Queue()
        for event in inbound:
            self.inbox.put_nowait(event)
        self.told: list[object] = []

    async def recv(self) -> dict:
        event = await self.inbox.get()
        if event is None:
            raise Disconnected()
        return event

    async def send(self, event: Event) -> None:
        self.told.append(event)
        if isinstance(event, ResponseDone):
            self.inbox.put_nowait(None)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.inbox.put_nowait(None)


def runtime() -> Runtime:
    engine = FakeEngine(FakeTokenizer(), {QUESTION: REPLY}, asr=FakeASR(""), tts=FakeTTS())
    return Runtime(engine, engine.tokenizer, "fake-model", 16000, FakeTTS.sample_rate)


async def test_the_session_and_pipeline_tell_their_client_typed_events_only():
    line = EventLine({"type": "no.such.event", "event_id": "evt_1"}, *ASK)
    await asyncio.wait_for(Session(line, runtime(), Limits()).run(), 10)
    assert line.told and all(isinstance(event, Event) for event in line.told)
    kinds = [type(event) for event in line.told]
    assert kinds[0] is SessionDescribed and line.told[0].created
    error = next(e for e in line.told if isinstance(e, Error))
    assert (error.code, error.event_id) == ("unknown_event", "evt_1")
    for kind in (ResponseCreated, TextDelta, AudioSent, AudioEnded, ResponseDone):
        assert kind in kinds, kind
    done = line.told[-1]
    assert done.status == "completed" and done.said == REPLY


def one_reply() -> tuple[Turn, list[Event]]:
    turn = Turn("resp_1", "req_1", None, time.monotonic(), time.monotonic() + 1)
    reply = Reply(prompt_tokens=12, output_tokens=3, text="Hi there.")
    pcm = (np.sin(np.arange(1600) / 7) * 8000).astype(np.int16)
    return turn, [ResponseCreated(turn), TextDelta(turn, "Hi "), TextDelta(turn, "there."),
                  AudioSent(turn, pcm, 16000), AudioEnded(turn),
                  ResponseDone(turn, reply, "completed", "Hi there.", {"deadline_met": True})]


def test_a_reply_renders_natively_as_json_events_and_the_audio_frame_after_its_delta():
    turn, events = one_reply()
    messages = [m for event in events for m in NativeSerializer(1 << 20).render(event)]
    kinds = [m["type"] if isinstance(m, dict) else "frame" for m in messages]
    assert kinds == ["response.created", "response.text.delta", "response.text.delta", "response.audio.delta",
                     "frame", "response.audio.done", "response.done"]
    assert messages[3]["bytes"] == len(messages[4]) == 3200
    done = messages[-1]["response"]
    assert done["output"][0]["text"] == "Hi there." and done["usage"]["total_tokens"] == 15
    assert done["deadline_met"] is True


@pytest.mark.parametrize("beta", [False, True])
def test_a_reply_renders_in_the_realtime_api_from_its_typed_events(beta):
    turn, events = one_reply()
    serializer = RealtimeSerializer(runtime(), 1 << 20, beta)
    messages = [m for event in events for m in serializer.render(event)]
    assert all(isinstance(m, dict) and m["event_id"].startswith("event") for m in messages)
    kinds = [m["type"] for m in messages]
    audio = "response.audio" if beta else "response.output_audio"
    assert kinds[:4] == ["response.created", "response.output_item.added",
                         "conversation.item.created" if beta else "conversation.item.added",
                         "response.content_part.added"]
    assert kinds.count(f"{audio}_transcript.delta") == 2 and f"{audio}.delta" in kinds
    transcript = next(m for m in messages if m["type"] == f"{audio}_transcript.done")
    assert transcript["transcript"] == "Hi there."
    done = messages[-1]["response"]
    assert messages[-1]["type"] == "response.done" and done["status"] == "completed"
    assert done["output"][0]["content"][0]["transcript"] == "Hi there."
    assert done["usage"]["input_token_details"]["text_tokens"] == 12 and done["deadline_met"] is True
    sent = b"".join(base64.b64decode(m["delta"]) for m in messages if m["type"] == f"{audio}.delta")
    assert abs(len(sent) // 2 - 2400) <= 48  # 0.1 s at the Realtime API's 24 kHz


@pytest.mark.parametrize("dialect", ["native", "realtime", "beta"])
def test_an_utterance_taken_for_the_assistants_own_voice_is_told_as_its_item_deleted(dialect):
    """Its item was announced at speech_stopped; it leaves the client's conversation as it never joined the
    server's, and the next item follows the one before it."""
    serializer = NativeSerializer(1 << 20) if dialect == "native" else RealtimeSerializer(runtime(), 1 << 20,
                                                                                         dialect == "beta")
    events = [SpeechStopped("item_1", 900, time.monotonic(), 100), SpeechStopped("item_2", 1900, time.monotonic(), 100),
              UtteranceDropped("item_2", "Thank you.", "own_voice"),
              SpeechStopped("item_3", 2900, time.monotonic(), 100)]
    messages = [[m for m in serializer.render(event) if isinstance(m, dict)] for event in events]
    assert [m["type"] for m in messages[2]] == ["conversation.item.deleted"]
    assert {k: messages[2][0][k] for k in ("item_id", "reason", "transcript")} == \
        {"item_id": "item_2", "reason": "own_voice", "transcript": "Thank you."}
    if dialect != "native":
        added = next(m for m in messages[3] if m["type"] in ("conversation.item.added", "conversation.item.created"))
        assert added["previous_item_id"] == "item_1"


def test_a_reply_renders_on_a_twilio_stream_as_media_a_mark_and_a_clear_and_nothing_else():
    turn, events = one_reply()
    serializer = TwilioSerializer(runtime(), 1 << 16, None)
    assert serializer.render(events[3]) == []  # nothing goes out before the stream's start
    start = {"event": "start", "start": {"streamSid": "MZ9", "callSid": "CA9",
                                         "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000}}}
    assert serializer.parse(json.dumps(start)) is None and serializer.stream_sid == "MZ9"
    out = [m for event in [*events, PlaybackCleared(turn)] for m in serializer.render(event)]
    assert all(m["streamSid"] == "MZ9" for m in out)
    assert [m["event"] for m in out][-2:] == ["mark", "clear"] and out[-2]["mark"]["name"] == "resp_1"
    media = [m for m in out if m["event"] == "media"]
    assert abs(sum(len(base64.b64decode(m["media"]["payload"])) for m in media) - 800) <= 16
