"""One chat completion as it streams: its text and tool calls, finish reason and token counts, in either of
OpenAI's response shapes (a whole `chat.completion`, or `chat.completion.chunk` server-sent events)."""

import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

from voicepipe.constrained import tools


class Completion:
    """One answer as it streams: its text, finish reason and token counts, in either response shape."""

    def __init__(self, id: str, model: str, prompt_tokens: int, calls: bool = False, legacy: bool = False,
                 served: frozenset[str] = frozenset()) -> None:
        self.id, self.model, self.prompt_tokens = id, model, prompt_tokens
        self.legacy = legacy  # asked with the deprecated `functions`: a call comes back as `function_call`
        self.served = served  # tools the server runs (MCP): their calls are not the client's to see
        self._hiding = False  # the call being streamed is one of them
        self.created = int(time.time())
        self.text, self.tokens, self.finish_reason = "", 0, None
        self.error: str | None = None  # why the engine failed the request, if it did
        self.parser = tools.FunctionCallParser() if calls else None  # the reply may call a tool
        self.calls_started = 0
        self.mcp_calls: list[dict] = []  # what the server ran for it, as `mcp_call` items
        self._made: list[tools.FunctionCall] = []  # the client's calls of a reply answered since

    def add(self, text: str, finish_reason: str | None, token: bool) -> list[dict]:
        """Take one output; the deltas it makes, as a stream sends them."""
        self.tokens += token
        pieces = [("text", text)] if self.parser is None else self.parser.feed(text)
        if finish_reason is not None:
            pieces += self.parser.flush() if self.parser is not None else []
            calls = bool(self.calls)
            called = "function_call" if self.legacy else "tool_calls"
            self.finish_reason = called if calls and finish_reason == "stop" else \
                finish_reason if finish_reason in ("stop", "length") else "error"
            if finish_reason.startswith("error"):
                self.error = finish_reason.removeprefix("error: ")
        deltas = []
        for kind, value in pieces:
            if kind == "start":
                self._hiding = value.name in self.served
            if kind == "text" and value:
                self.text += value
                deltas.append({"content": value})
            elif kind in ("start", "arguments") and self._hiding:
                continue  # a call the server runs: not the client's
            elif kind == "start" and self.legacy:
                deltas.append({"function_call": {"name": value.name, "arguments": ""}})
            elif kind == "start":
                deltas.append({"tool_calls": [{"index": self.calls_started, "id": value.call_id,
                                               "type": "function", "function": {"name": value.name,
                                                                                "arguments": ""}}]})
                self.calls_started += 1
            elif kind == "arguments" and self.legacy:
                deltas.append({"function_call": {"arguments": value}})
            elif kind == "arguments":
                deltas.append({"tool_calls": [{"index": self.calls_started - 1, "function": {"arguments": value}}]})
        return deltas

    async def collect(self, stream: AsyncIterator) -> None:
        async with aclosing(stream) as outputs:
            async for out in outputs:
                self.add(out.text, out.finish_reason, out.token_id is not None)

    @property
    def calls(self) -> list[tools.FunctionCall]:
        """The client's calls: those the reply made (its server's tools' left out)."""
        made = self._made + (self.parser.calls if self.parser is not None else [])
        return [c for c in made if c.name not in self.served]

    def answering(self, prompt_tokens: int) -> None:
        """The server ran the reply's calls to its tools: an answer of words follows, from a prompt of
        `prompt_tokens` more."""
        self._made, self.parser = self.calls, None
        self.prompt_tokens += prompt_tokens
        self.finish_reason = None

    def message(self) -> dict:
        """The whole answer: its text (None when it only called a tool) and its calls."""
        calls = self.calls
        message: dict[str, Any] = {"role": "assistant", "content": self.text.strip() or None if calls else self.text,
                                   "refusal": None}
        if calls and self.legacy:
            message["function_call"] = {"name": calls[0].name, "arguments": calls[0].arguments}
        elif calls:
            message["tool_calls"] = [{"id": c.call_id, "type": "function",
                                      "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
        if self.mcp_calls:
            message["mcp_calls"] = self.mcp_calls
        return message

    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.tokens,
                "total_tokens": self.prompt_tokens + self.tokens}

    def whole(self) -> dict:
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "message": self.message(), "finish_reason": self.finish_reason,
                             "logprobs": None}],
                "usage": self.usage()}

    def chunk(self, delta: dict | None, finish_reason: str | None = None, **extra: Any) -> str:
        """One server-sent event; `delta` None: a chunk without choices (the usage at the end)."""
        choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish_reason,
                                             "logprobs": None}]
        body = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": choices, **extra}
        return f"data: {json.dumps(body)}\n\n"

    async def sse(self, stream: AsyncIterator, usage: bool, finished: Callable[[], None]) -> AsyncIterator[str]:
        """Server-sent events as OpenAI streams them; a client that goes away aborts the request. `finished`
        is called however the stream ends."""
        try:
            yield self.chunk({"role": "assistant", "content": "", "refusal": None})
            async with aclosing(stream) as outputs:
                async for out in outputs:
                    for delta in self.add(out.text, out.finish_reason, out.token_id is not None):
                        yield self.chunk(delta)
            if self.error is not None:  # as OpenAI streams a failure: an error event, which its SDKs raise
                error = {"message": self.error, "type": "server_error", "param": None, "code": "engine_error"}
                yield f"data: {json.dumps({'error': error})}\n\n"
                return
            yield self.chunk({}, self.finish_reason)
            if usage:
                yield self.chunk(None, usage=self.usage())
            yield "data: [DONE]\n\n"
        finally:
            finished()
