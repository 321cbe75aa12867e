"""One call's pipeline over the fake models and engine, and what its caller received: the fixture of the
pipeline's fast tests (utterance events go in directly, as the VAD stage would emit them); and a real
server over the fake engine."""

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np

from support.fakes import FakeASR, FakeEngine, FakeTokenizer, FakeTTS
from voicepipe.call.limits import Limits
from voicepipe.call.native_serializer import NativeSerializer
from voicepipe.call.pipeline import build_pipeline
from voicepipe.call.runtime import Runtime
from voicepipe.mcp_servers import McpPolicy
from voicepipe.pipeline import CallConfig, Conversation
from voicepipe.pipeline.events import Event, SpeechAudio, SpeechPaused, SpeechStarted, SpeechStopped

QUESTION = "What is the capital of France?"
REPLY = "Paris is the capital of France. It is a big city with many museums."
SECOND = 16000


class Client:
    """What the caller received, as the native protocol reads it."""

    def __init__(self) -> None:
        self.messages: list[dict | bytes] = []
        self.serializer = NativeSerializer(Limits().max_message_bytes)

    async def send(self, *events: Event) -> None:
        self.messages.extend(m for event in events for m in self.serializer.render(event))

    def kinds(self) -> list[str]:
        return [m["type"] for m in self.messages if isinstance(m, dict)]

    def of(self, kind: str) -> list[dict]:
        return [m for m in self.messages if isinstance(m, dict) and m["type"] == kind]


class Call:
    """One call's pipeline over the fakes."""

    def __init__(self, reply: str = REPLY, tts: FakeTTS | None = None, **config) -> None:
        self.tokenizer = FakeTokenizer()
        self.asr = FakeASR(QUESTION)
        self.engine = FakeEngine(self.tokenizer, {QUESTION: reply}, asr=self.asr, tts=tts or FakeTTS())
        self.config = CallConfig(instructions="Be brief.", **config)
        self.conversation = Conversation(self.config.instructions, self.tokenizer)
        self.client = Client()
        self.runtime = runtime = Runtime(self.engine, self.tokenizer, "fake", self.asr.sample_rate,
                                         FakeTTS.sample_rate)
        self.pipeline = build_pipeline(runtime, "call", self.config, self.conversation, self.client.send)
        self.pipeline.start()

    async def push(self, *events) -> None:
        for event in events:
            self.pipeline.push(event)
        await settle(self.pipeline)

    async def utterance(self, item: str = "item_1", pause: bool = False, stop: bool = True) -> None:
        """Speech starts, a second of it arrives, then (optionally) the early pause and the confirmed end."""
        now = time.monotonic()
        events = [SpeechStarted(item, 0, now), SpeechAudio(item, np.zeros(SECOND, np.float32), False)]
        if pause:
            events.append(SpeechPaused(item, SECOND, now, now))
        if stop:
            events.append(SpeechStopped(item, 1000, now, SECOND))
        await self.push(*events)

    def speculative(self):
        """The reply request started at the pause (not the end-of-turn judge's one-token request)."""
        return next(r for r in reversed(self.engine.requests) if r.params.max_tokens > 1)

    def stage(self, kind: type) -> object:
        """The call's stage of type `kind`."""
        return self.pipeline.stage(kind)

    async def close(self) -> None:
        await self.pipeline.stop()


async def http_post(server, body: dict, path: str = "/v1/chat/completions", timeout: float = 10.0,
                    headers: dict[str, str] | None = None) -> tuple[int, dict, bytes]:
    """A raw HTTP POST of `body` as JSON to a loopback server (with any other `headers`): (status, headers,
    body), a chunked body joined (a stream's server-sent events)."""
    import json

    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    data = json.dumps(body)
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    writer.write(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{extra}"
                 f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n{data}".encode())
    raw = await asyncio.wait_for(reader.read(), timeout)
    writer.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    if headers.get("transfer-encoding") == "chunked":
        chunks, rest = [], payload
        while rest:
            size, _, rest = rest.partition(b"\r\n")
            chunks.append(rest[:int(size, 16)])
            rest = rest[int(size, 16) + 2:]
        payload = b"".join(chunks)
    return int(lines[0].split()[1]), headers, payload



async def http(server, body: dict) -> bytes:
    """A chat completion's body, which must succeed."""
    status, _, payload = await http_post(server, body)
    assert status == 200, payload
    return payload


async def post(server, body: dict, path: str = "/v1/chat/completions") -> tuple[int, dict, dict]:
    """Status, headers and the JSON answer of a POST."""
    status, headers, payload = await http_post(server, body, path)
    return status, headers, json.loads(payload) if payload else {}


async def run_stage(stage, events) -> tuple[list, list]:
    """One stage on its own: each event processed (feedback offered) in order; what it sent downstream
    and upstream."""
    from voicepipe.pipeline.events import Feedback

    down: list = []
    up: list = []
    stage._emit, stage._emit_up = down.append, up.append
    for event in events:
        if isinstance(event, Feedback):
            if not await stage.feedback(event):
                up.append(event)
        else:
            await stage.process(event)
    return down, up


async def settle(pipeline) -> None:
    """Yield to the event loop until every stage's queue has stayed empty for a while (no timed sleep)."""
    quiet = 0
    for _ in range(2000):
        await asyncio.sleep(0)
        quiet = quiet + 1 if all(q.empty() for q in pipeline.queues) else 0
        if quiet >= 30:
            return


@asynccontextmanager
async def fake_server(limits: Limits, reply: str = "one two three four five six", heard: str = "",
                      replies: dict[str, str] | None = None, security: Any = None,
                      mcp: McpPolicy | None = None, sip: Any = None) -> AsyncIterator[tuple]:
    """A real voice server on a loopback port over the fake engine, whose ASR hears `heard` in any speech
    and which answers `reply` (or, to a question in `replies`, its answer), its calls allowed the MCP
    servers of `mcp`, answering SIP calls where `sip` (SipSettings) says: (server, engine)."""
    from voicepipe.server import VoiceServer

    engine = FakeEngine(FakeTokenizer(), replies, default_reply=reply, asr=FakeASR(heard), tts=FakeTTS())
    runtime = Runtime(engine, engine.tokenizer, "fake-model", 16000, 16000, mcp=mcp or McpPolicy())
    server = VoiceServer(runtime, limits, security=security, sip=sip)
    await server.start("127.0.0.1", 0)
    try:
        yield server, engine
    finally:
        engine.gate.set()
        await server.close()


async def read_until(connection: Any, kind: str, seen: list, timeout_s: float = 20.0) -> Any:
    """The next event of type `kind` from an `openai` SDK Realtime connection, keeping every event read."""
    while True:
        event = await asyncio.wait_for(connection.recv(), timeout_s)
        seen.append(event)
        if event.type == kind:
            return event
