"""`/v1/chat/completions` and `/v1/models`: the engine as an OpenAI-compatible text API.

Text requests run as INTERACTIVE: they fill the device around the calls' REALTIME turns, which the
scheduler serves first, so a busy text API does not make a caller wait.
"""

import json
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, Literal

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from scheduler import RequestClass, SamplingParams
from voicepipe.backends.base import chat_prompt_ids
from voicepipe.pipeline.events import new_id

if TYPE_CHECKING:
    from voicepipe.server.voice_server import VoiceServer

MAX_STOP = 4  # as OpenAI allows


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None

    def as_chat(self) -> dict[str, str]:
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content or [])
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatRequest(BaseModel):
    """The fields of OpenAI's chat completion request that this engine honours; others are ignored."""

    model_config = ConfigDict(extra="ignore")
    model: str = ""
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = Field(1, ge=1, le=1)
    stream: bool = False
    stream_options: StreamOptions | None = None

    def sampling(self, limit: int) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stop) > MAX_STOP or not all(stop):
            raise ValueError(f"stop takes at most {MAX_STOP} non-empty strings")
        wanted = self.max_completion_tokens or self.max_tokens or limit
        return SamplingParams(max_tokens=min(wanted, limit), temperature=self.temperature, top_p=self.top_p,
                              stop=tuple(stop), seed=self.seed)


def openai_error(status: int, message: str, code: str | None = None, param: str | None = None,
                 kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}},
                        status_code=status)


def build_router(server: "VoiceServer") -> APIRouter:
    router = APIRouter(prefix="/v1")
    runtime = server.runtime
    model_id = runtime.model_id
    created = int(time.time())

    @router.get("/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model_id, "object": "model", "created": created,
                                            "owned_by": "voicepipe"}]}

    @router.get("/models/{name}")
    async def model(name: str) -> Any:
        if name != model_id:
            return openai_error(404, f"the model {name!r} does not exist", "model_not_found", "model")
        return {"id": model_id, "object": "model", "created": created, "owned_by": "voicepipe"}

    @router.post("/chat/completions")
    async def chat_completions(body: ChatRequest) -> Any:
        limit = runtime.engine.max_context
        try:
            params = body.sampling(limit)
        except ValueError as e:
            return counted(openai_error(400, str(e), "invalid_value", "stop"))
        prompt = chat_prompt_ids(runtime.tokenizer, [m.as_chat() for m in body.messages])
        if len(prompt) >= limit:
            return counted(openai_error(400, f"the prompt has {len(prompt)} tokens; this model takes at most "
                                        f"{limit}", "context_length_exceeded", "messages"))
        params.max_tokens = min(params.max_tokens, limit - len(prompt))
        if not runtime.engine.alive:
            return counted(openai_error(503, "the engine is restarting; try again in a few seconds",
                                        "engine_unavailable", kind="server_error"))
        completion = Completion(new_id("chatcmpl"), model_id, len(prompt))
        stream = runtime.engine.generate(prompt, params, RequestClass.INTERACTIVE)
        server.metrics.api_requests.labels("chat.completions", "200").inc()
        if body.stream:
            usage = body.stream_options is not None and body.stream_options.include_usage
            return StreamingResponse(completion.sse(stream, usage), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        async with aclosing(stream) as outputs:
            async for out in outputs:
                completion.add(out.text, out.finish_reason, out.token_id is not None)
        if completion.error is not None:
            return counted(openai_error(500, completion.error, "engine_error", kind="server_error"))
        return completion.whole()

    def counted(response: JSONResponse) -> JSONResponse:
        server.metrics.api_requests.labels("chat.completions", str(response.status_code)).inc()
        return response

    return router


def install_error_handlers(app: FastAPI) -> None:
    """Bad requests answer in OpenAI's error shape, which its SDKs read, instead of FastAPI's."""
    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ())[1:])
        return openai_error(400, f"{where or 'body'}: {first.get('msg', 'invalid request')}", "invalid_value",
                            where or None)


class Completion:
    """One answer as it streams: its text, finish reason and token counts, in either response shape."""

    def __init__(self, id: str, model: str, prompt_tokens: int) -> None:
        self.id, self.model, self.prompt_tokens = id, model, prompt_tokens
        self.created = int(time.time())
        self.text, self.tokens, self.finish_reason = "", 0, None
        self.error: str | None = None  # why the engine failed the request, if it did

    def add(self, text: str, finish_reason: str | None, token: bool) -> None:
        self.text += text
        self.tokens += token
        if finish_reason is not None:
            self.finish_reason = "stop" if finish_reason == "stop" else "length" if finish_reason == "length" \
                else "error"
            if finish_reason.startswith("error"):
                self.error = finish_reason.removeprefix("error: ")

    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.tokens,
                "total_tokens": self.prompt_tokens + self.tokens}

    def whole(self) -> dict:
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": self.text},
                             "finish_reason": self.finish_reason, "logprobs": None}],
                "usage": self.usage()}

    def chunk(self, delta: dict | None, finish_reason: str | None = None, **extra: Any) -> str:
        """One server-sent event; `delta` None: a chunk without choices (the usage at the end)."""
        choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish_reason,
                                             "logprobs": None}]
        body = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": choices, **extra}
        return f"data: {json.dumps(body)}\n\n"

    async def sse(self, stream: AsyncIterator, usage: bool) -> AsyncIterator[str]:
        """Server-sent events as OpenAI streams them; a client that goes away aborts the request."""
        yield self.chunk({"role": "assistant", "content": ""})
        async with aclosing(stream) as outputs:
            async for out in outputs:
                self.add(out.text, out.finish_reason, out.token_id is not None)
                if out.text:
                    yield self.chunk({"content": out.text})
        if self.error is not None:  # as OpenAI streams a failure: an error event, which its SDKs raise
            error = {"message": self.error, "type": "server_error", "param": None, "code": "engine_error"}
            yield f"data: {json.dumps({'error': error})}\n\n"
            return
        yield self.chunk({}, self.finish_reason)
        if usage:
            yield self.chunk(None, usage=self.usage())
        yield "data: [DONE]\n\n"
