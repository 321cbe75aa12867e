"""The clients of `bench soak`, each a loop until told to stop, each ending request written down as a
`Record`: text streams, tool calls and structured outputs as a well-behaved API client sends them, and
the hostile ones (bodies too deep or too large, wrong methods, schemas past the limits or past the compile
budget, a Realtime client that piles up thousands of items), beside probes of /health and of a short chat
request."""

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import openai
import websockets

from voicepipe.bench.calls import caller

HOSTILE_ANSWER_S = 5.0  # a hostile request must be answered (refused or served) within this
MULTIPLY = {"type": "function", "function": {"name": "multiply", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}
ANSWER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                           "population": {"type": "integer", "minimum": 0}},
          "required": ["city", "population"], "additionalProperties": False}


@dataclass
class Record:
    at: float  # when it ended
    kind: str
    ok: bool  # answered as it should be
    seconds: float
    detail: str = ""


@dataclass
class Tally:
    records: list[Record] = field(default_factory=list)
    turns: list[tuple[float, object]] = field(default_factory=list)  # (when its call ended, HeardTurn)

    def add(self, kind: str, started: float, ok: bool, detail: str = "") -> None:
        now = time.monotonic()
        self.records.append(Record(now, kind, ok, now - started, detail))


async def until_stopped(stop: asyncio.Event, pause_s: float, work: Callable[[], Awaitable[None]]) -> None:
    """`work` again and again, `pause_s` apart, until `stop` is set."""
    while not stop.is_set():
        await work()
        try:
            await asyncio.wait_for(stop.wait(), pause_s)
        except TimeoutError:
            pass


async def raw(port: int, method: str, path: str, body: bytes = b"", extra: str = "") -> tuple[int, bytes]:
    """One HTTP/1.1 request as a hostile client writes it: (status, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n".encode() + body)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 60)
    writer.close()
    return int(data.split()[1]), data.partition(b"\r\n\r\n")[2]


def chat_body(**extra) -> dict:
    return {"model": "any", "messages": [{"role": "user", "content": "Name a big city and its population."}],
            "max_tokens": 24, **extra}


# -- well-behaved clients ---------------------------------------------------------------------------------------
async def calls(url: str, questions: list, stop: asyncio.Event, tally: Tally, offset_s: float) -> None:
    """A caller who hangs up after two questions and calls again."""
    async def one() -> None:
        for turn in await caller(url, questions, 2, offset_s):
            tally.turns.append((time.monotonic(), turn))

    await until_stopped(stop, 0.5, one)


async def text_stream(client: openai.AsyncOpenAI, stop: asyncio.Event, tally: Tally) -> None:
    async def one() -> None:
        started, finish = time.monotonic(), None
        try:
            stream = await client.chat.completions.create(**chat_body(), stream=True)
            async for chunk in stream:
                finish = (chunk.choices[0].finish_reason if chunk.choices else None) or finish
        except openai.APIError as e:
            tally.add("text_stream", started, False, str(e))
            return
        tally.add("text_stream", started, finish in ("stop", "length"), str(finish))

    await until_stopped(stop, 0.2, one)


async def tool_calls(client: openai.AsyncOpenAI, stop: asyncio.Event, tally: Tally) -> None:
    async def one() -> None:
        started = time.monotonic()
        try:
            reply = await client.chat.completions.create(**chat_body(
                messages=[{"role": "user", "content": "What is 37 times 43?"}], max_tokens=40),
                tools=[MULTIPLY], tool_choice="required")
            if reply.choices[0].finish_reason == "length":  # cut at the length asked for: nothing to check
                tally.add("tool_call", started, True, "length")
                return
            call = reply.choices[0].message.tool_calls[0]
            arguments = json.loads(call.function.arguments)
            ok = call.function.name == "multiply" and {"a", "b"} <= set(arguments)
        except (openai.APIError, TypeError, IndexError, ValueError) as e:
            tally.add("tool_call", started, False, str(e))
            return
        tally.add("tool_call", started, ok)

    await until_stopped(stop, 1.0, one)


async def structured(client: openai.AsyncOpenAI, stop: asyncio.Event, tally: Tally) -> None:
    async def one() -> None:
        started = time.monotonic()
        try:
            reply = await client.chat.completions.create(**chat_body(max_tokens=40), response_format={
                "type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}})
            if reply.choices[0].finish_reason == "length":  # cut at the length asked for: nothing to check
                tally.add("structured", started, True, "length")
                return
            ok = set(json.loads(reply.choices[0].message.content)) == {"city", "population"}
        except (openai.APIError, ValueError) as e:
            tally.add("structured", started, False, str(e))
            return
        tally.add("structured", started, ok)

    await until_stopped(stop, 1.0, one)


# -- hostile clients --------------------------------------------------------------------------------------------
def nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def slow_schema() -> dict:
    """Within every schema limit, and seconds to compile: many optional properties, named afresh each time
    so no cache answers for it."""
    prefix = f"p{random.randrange(10**9)}_"
    return {"type": "object", "properties": {f"{prefix}{i}": {"type": "integer"} for i in range(1000)}}


def hostile_requests(max_body_bytes: int) -> list[tuple[str, str, str, bytes, tuple[int, ...]]]:
    """(name, method, path, body, the statuses that answer it rightly)."""
    deep = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": ' + b"[" * 3000 + \
        b"]" * 3000 + b"}"
    big = json.dumps(chat_body(messages=[{"role": "user", "content": "x" * (max_body_bytes + 1)}])).encode()
    schema = lambda s: json.dumps(chat_body(response_format={"type": "json_schema", "json_schema": {  # noqa: E731
        "name": "s", "schema": s}})).encode()
    return [("deep_body", "POST", "/v1/chat/completions", deep, (400,)),
            ("large_body", "POST", "/v1/chat/completions", big, (413,)),
            ("wrong_method", "PUT", "/v1/chat/completions", b"{}", (405,)),
            ("options", "OPTIONS", "/v1/models", b"", (204,)),
            ("not_json", "POST", "/v1/chat/completions", b"{'model':", (400,)),
            ("deep_schema", "POST", "/v1/chat/completions", schema(nested(200)), (400,)),
            ("huge_enum", "POST", "/v1/chat/completions", schema({"enum": [f"v{i}" for i in range(20_000)]}), (400,)),
            ("slow_schema", "POST", "/v1/chat/completions", b"", (400, 200))]


async def hostile_http(port: int, max_body_bytes: int, stop: asyncio.Event, tally: Tally) -> None:
    requests = hostile_requests(max_body_bytes)
    turn = 0

    async def one() -> None:
        nonlocal turn
        name, method, path, body, expected = requests[turn % len(requests)]
        turn += 1
        if name == "slow_schema":
            body = json.dumps(chat_body(response_format={"type": "json_schema", "json_schema": {
                "name": "s", "schema": slow_schema()}})).encode()
        started = time.monotonic()
        try:
            status, _ = await raw(port, method, path, body)
        except (OSError, TimeoutError, IndexError, ValueError) as e:
            tally.add(f"hostile:{name}", started, False, repr(e))
            return
        tally.add(f"hostile:{name}", started, status in expected and time.monotonic() - started <= HOSTILE_ANSWER_S,
                  str(status))

    await until_stopped(stop, 0.5, one)


async def hostile_realtime(port: int, items: int, stop: asyncio.Event, tally: Tally) -> None:
    """A Realtime client that sends `items` text messages, then asks for one short reply, then hangs up."""
    async def one() -> None:
        started = time.monotonic()
        try:
            async with websockets.connect(f"ws://127.0.0.1:{port}/v1/realtime", max_size=None) as ws:
                for n in range(items):
                    await ws.send(json.dumps({"type": "conversation.item.create", "item": {
                        "type": "message", "role": "user", "content": [{"type": "input_text", "text": f"note {n}"}]}}))
                    if n % 100 == 99:  # a send to a writable socket returns at once: the server's loop is ours too
                        await asyncio.sleep(0)
                await ws.send(json.dumps({"type": "response.create", "response": {
                    "output_modalities": ["text"], "max_output_tokens": 8}}))
                while (event := json.loads(await asyncio.wait_for(ws.recv(), 300)))["type"] != "response.done":
                    pass
            tally.add("hostile:many_items", started, event["response"]["status"] == "completed")
        except (OSError, TimeoutError, websockets.WebSocketException) as e:
            tally.add("hostile:many_items", started, False, repr(e))

    await until_stopped(stop, 20.0, one)


# -- probes ------------------------------------------------------------------------------------------------------
async def health(port: int, stop: asyncio.Event, tally: Tally) -> None:
    async def one() -> None:
        started = time.monotonic()
        try:
            status, _ = await raw(port, "GET", "/health")
        except (OSError, TimeoutError) as e:
            tally.add("probe:health", started, False, repr(e))
            return
        tally.add("probe:health", started, status == 200)

    await until_stopped(stop, 0.25, one)


async def chat_probe(client: openai.AsyncOpenAI, stop: asyncio.Event, tally: Tally) -> None:
    """A short whole answer every few seconds: another client's latency, beside whatever else runs."""
    async def one() -> None:
        started = time.monotonic()
        try:
            await client.chat.completions.create(**chat_body(max_tokens=8, temperature=0))
        except openai.APIError as e:
            tally.add("probe:chat", started, False, str(e))
            return
        tally.add("probe:chat", started, True)

    await until_stopped(stop, 2.0, one)
