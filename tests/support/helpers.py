"""Shared by the tests of calls: a websocket test client, the spoken question, and waits that end when the
engine and the server are quiet rather than after a guessed sleep."""

import asyncio
import json
import socket
import time

import numpy as np
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from voicepipe.audio import to_pcm16
from voicepipe.protocol import ServerEvent

SAMPLE_RATE = 16000
FRAME = SAMPLE_RATE // 50  # 20 ms
QUESTION = "What is the capital of France?"
LONG_QUESTION = "Tell me about the history of Paris."  # the embedded LLM answers it at length
TURN_TIMEOUT_S = 240  # a turn on a busy 2-core CPU


class Call:
    """A test client: reads every server message in the background and speaks in real time."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.events: list[dict] = []
        self.frames: list[tuple[dict, bytes]] = []  # (the event before it: its response.audio.delta, the audio)
        self.closed = False
        self._new = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def open(cls, server) -> "Call":
        """A call to `server` (anything with a `port`), once its session is created."""
        call = cls(await connect(f"ws://127.0.0.1:{server.port}/ws", max_size=None))
        await call.wait(ServerEvent.SESSION_CREATED, timeout=30)
        return call

    @property
    def session_id(self) -> str:
        return self.events[0]["session"]["id"]

    async def _read(self) -> None:
        try:
            async for message in self.ws:
                if isinstance(message, bytes):
                    self.frames.append((self.events[-1], message))
                else:
                    self.events.append(json.loads(message))
                self._new.set()
        except ConnectionClosed:
            pass
        finally:
            self.closed = True
            self._new.set()

    async def wait(self, kind: str, timeout: float = TURN_TIMEOUT_S, start: int = 0,
                   response: str | None = None) -> dict:
        """The first event of `kind` after index `start` (of `response`, if given), waiting for it."""
        end = time.monotonic() + timeout
        while True:
            self._new.clear()
            for event in self.events[start:]:
                if event["type"] == kind and response in (None, response_id(event)):
                    return event
            assert not self.closed, f"connection closed before {kind}; saw {self.kinds()}"
            await asyncio.wait_for(self._new.wait(), max(0.0, end - time.monotonic()))

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["type"] == kind]

    def kinds(self) -> list[str]:
        return [e["type"] for e in self.events if e["type"] != ServerEvent.SCHEDULER_STATS]

    async def send(self, event: dict | str | bytes) -> None:
        await self.ws.send(event if isinstance(event, str | bytes) else json.dumps(event))

    async def speak(self, audio: np.ndarray, silence_s: float = 1.0) -> None:
        """Stream speech then silence as 20 ms PCM16 frames, in real time."""
        pcm = to_pcm16(np.concatenate([audio, np.zeros(int(silence_s * SAMPLE_RATE), np.float32)]))
        start = time.monotonic()
        for i, offset in enumerate(range(0, len(pcm), FRAME)):
            await asyncio.sleep(max(0.0, start + i * 0.02 - time.monotonic()))
            await self.ws.send(pcm[offset:offset + FRAME].astype("<i2").tobytes())

    async def close(self) -> None:
        await self.ws.close()
        await self._reader


def response_id(event: dict) -> str | None:
    return event.get("response_id") or (event.get("response") or {}).get("id")


def reply_text(call: Call, response: str) -> str:
    return "".join(e["delta"] for e in call.of(ServerEvent.RESPONSE_TEXT_DELTA) if e["response_id"] == response)


def pinned_pages(held: dict) -> int:
    """Pages the sessions keep, of the holdings an engine client reports."""
    return sum(held["pinned"].values())


async def settled(engine, timeout: float = 60.0) -> dict:
    """Wait until the engine (a client: thread or process) holds no request and has no job queued; returns
    its holdings then, read through the channel after every command sent before (aborts, releases). An
    in-process engine's core is then safe to read too."""
    end = time.monotonic() + timeout
    while True:
        held = await engine.holdings()
        if held["idle"] and not held["jobs"] and not held["requests"] and not held["compiling"]:
            return held
        assert time.monotonic() < end, f"the engine did not go idle: {held}"
        await asyncio.sleep(0.05)


async def calls_ended(server, timeout: float = 30.0) -> None:
    """Wait until the server has finished cleaning up every call (clients may leave before that)."""
    end = time.monotonic() + timeout
    while server.calls:
        assert time.monotonic() < end, "calls were not cleaned up"
        await asyncio.sleep(0.05)


async def http_get(server, path: str, host: str = "127.0.0.1", headers: str = "") -> tuple[int, dict[str, str], bytes]:
    """A raw HTTP/1.1 GET, sending `path` and the Host header exactly as given (no client-side
    normalisation of '..'); `headers` are more header lines, each ending in CRLF."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n{headers}\r\n".encode())
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def get(port: int, path: str) -> tuple[int, bytes] | None:
    """(status, body) of a plain GET to a server on this machine, or None while nothing listens there."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return None
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
    data = await reader.read()
    writer.close()
    return (int(data.split()[1]), data.partition(b"\r\n\r\n")[2]) if data else None


async def status_of(port: int, path: str) -> int | None:
    answer = await get(port, path)
    return answer[0] if answer else None


async def health(port: int) -> dict:
    answer = await get(port, "/health")
    assert answer is not None and answer[0] == 200, answer
    return json.loads(answer[1])


def seeded_piper():
    """A Piper voice of its own whose noise is seeded: it says a text the same way every session (the shared
    voice's noise depends on what it said before, and on the session)."""
    import onnxruntime

    from voicepipe.backends.tts_piper import PiperTTS

    onnxruntime.set_seed(0)  # read when a session's random nodes are built: before the voice is loaded
    return PiperTTS()
