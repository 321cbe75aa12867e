"""`/v1/chat/completions` and `/v1/models`: the engine as an OpenAI-compatible text API.

Text requests run as INTERACTIVE: they fill the device around the calls' REALTIME turns, which the
scheduler serves first, so a busy text API does not make a caller wait.
"""

import asyncio
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any, Literal

from fastapi import APIRouter, FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from scheduler import RequestClass, SamplingParams
from scheduler.channel.client import EngineUnavailable
from scheduler.grammar.constraint import Grammar
from scheduler.grammar.schema_limits import SchemaTooComplex
from voicepipe.backends.base import chat_prompt_ids
from voicepipe.call.limits import Limits
from voicepipe.call.runtime import Runtime
from voicepipe.constrained import grammars, tools
from voicepipe.constrained.grammars import FieldRefused
from voicepipe.ids import new_id
from voicepipe.server.chat_mcp import ChatServers, McpRefused, answered, mcp_entries
from voicepipe.server.completion import Completion
from voicepipe.server.methods import FALLBACK
from voicepipe.server.metrics import CallMetrics

MAX_STOP = 4  # as OpenAI allows


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    name: str
    arguments: str


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall


ROLES = {"developer": "system", "function": "tool"}  # as the chat templates know them


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]  # function: the old tool
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's calls, in the history
    function_call: FunctionCall | None = None  # the same, as the deprecated `functions` wrote one
    tool_call_id: str | None = None  # a tool's answer: to which call

    @field_validator("content", mode="before")
    @classmethod
    def text_parts_only(cls, content: Any) -> Any:
        """Text is read; any other part OpenAI's schema allows (an image, audio, a file, a refusal) is
        refused by name, as this server reads text only."""
        for part in content if isinstance(content, list) else ():
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text":
                raise ValueError(f"only text content parts are read here, not {kind!r}")
        return content

    def as_chat(self) -> dict[str, str]:
        """The message as the model reads it: calls in the call format, a tool's answer as its own role."""
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content or [])
        calls = [c.function for c in self.tool_calls or []] + ([self.function_call] if self.function_call else [])
        text += "".join(tools.call_text(c.name, c.arguments) for c in calls)
        return {"role": ROLES.get(self.role, self.role), "content": text}


class StreamOptions(BaseModel):
    include_usage: bool | None = None


class ChatRequest(BaseModel):
    """The fields of OpenAI's chat completion request that this engine honours; others are ignored. A field
    OpenAI's schema lets a client send as null reads null as its default."""

    model_config = ConfigDict(extra="ignore")
    model: str = ""
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)  # null: 1
    top_p: float | None = Field(None, gt=0, le=1)  # null: 1
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int | None = Field(None, ge=1)  # one choice a request (more: refused by name)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None  # either way, at most one call per response
    response_format: dict[str, Any] | None = None
    # The deprecated forms of `tools` and `tool_choice`, read as them; the reply then names its call
    # `function_call`, as it did for them.
    functions: list[Any] | None = None
    function_call: Any = None
    # Not done: refused by `unsupported` rather than ignored, so a client asking for them knows.
    logprobs: bool | None = None
    top_logprobs: int | None = None

    def unsupported(self) -> str | None:
        """The first parameter asked for that this server cannot honour, if any."""
        asked = {"logprobs": bool(self.logprobs), "top_logprobs": bool(self.top_logprobs), "n": (self.n or 1) > 1}
        return next((name for name, wanted in asked.items() if wanted), None)

    def structure(self, served: "list[tools.Tool] | None" = None
                  ) -> "tuple[list[tools.Tool], str | None, Grammar | None, list[tuple[str, Grammar]]]":
        """(tools, tool choice, grammar, what must compile first by field): what the reply must look like,
        `served` the tools of its MCP servers beside its functions. ValueError("param: why") names the field
        at fault."""
        if self.legacy and (self.tools or self.tool_choice is not None):
            raise ValueError("functions: give tools or the deprecated functions, not both")
        given = [{"type": "function", "function": f} for f in self.functions or []] if self.legacy else self.tools
        found = (tools.parse_tools(given, servers=True) if given else []) + list(served or [])
        choice = tools.choose(found, legacy_choice(self.function_call) if self.legacy else self.tool_choice)
        if choice is not None:
            if self.response_format and self.response_format.get("type", "text") != "text":
                raise ValueError("response_format: give tools or a response_format, not both")
            wanted = tools.grammars(found, choice)
            return found, choice, wanted[-1][1], wanted
        grammar = response_grammar(self.response_format)
        if grammar is None:
            return found, None, None, []
        return found, None, grammar, [("response_format" if grammar.kind == "json_object"
                                       else "response_format.json_schema.schema", grammar)]

    @property
    def legacy(self) -> bool:
        """Functions asked for the deprecated way (`functions`, `function_call`)."""
        return self.functions is not None or self.function_call is not None

    def sampling(self, limit: int, default_max_tokens: int) -> SamplingParams:
        """`limit`: what the context leaves; a request that names no length gets `default_max_tokens`, and
        none gets more than that bound either (a runaway request holds the device for minutes)."""
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stop) > MAX_STOP or not all(stop):
            raise ValueError(f"stop takes at most {MAX_STOP} non-empty strings")
        wanted = self.max_completion_tokens or self.max_tokens or default_max_tokens
        return SamplingParams(max_tokens=min(wanted, limit, default_max_tokens),
                              temperature=1.0 if self.temperature is None else self.temperature,
                              top_p=1.0 if self.top_p is None else self.top_p, stop=tuple(stop), seed=self.seed)


def refused_structure(e: ValueError) -> JSONResponse:
    """What a request whose tools or response format cannot be held to gets: 400, naming the field."""
    code = "schema_too_complex" if isinstance(e, SchemaTooComplex) else "invalid_value"
    return openai_error(400, str(e), code, str(e).split(":")[0])


def legacy_choice(function_call: Any) -> Any:
    """`function_call` as a `tool_choice`: "none" and "auto" as they are, `{"name": f}` as that function."""
    if isinstance(function_call, dict) and set(function_call) == {"name"}:
        return {"type": "function", "function": function_call}
    return function_call


def response_grammar(fmt: dict[str, Any] | None) -> Grammar | None:
    """The grammar of a `response_format`: none for text, any JSON object, or a JSON schema's."""
    kind = (fmt or {}).get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return Grammar("json_object")
    if kind != "json_schema":
        raise ValueError(f"response_format.type: expected 'text', 'json_object' or 'json_schema', not {kind!r}")
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
        raise ValueError("response_format.json_schema.schema: expected a JSON schema object")
    try:
        return Grammar.json_schema(spec.get("schema") or {"type": "object"})
    except SchemaTooComplex as e:
        raise SchemaTooComplex(f"response_format.json_schema.schema: {e}") from None


def openai_error(status: int, message: str, code: str | None = None, param: str | None = None,
                 kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}},
                        status_code=status)


def build_router(runtime: Runtime, limits: Limits, metrics: CallMetrics) -> APIRouter:
    router = APIRouter(prefix="/v1")
    model_id = runtime.model_id
    # Text requests admitted and not yet finished: a stream's body, or a token while a whole answer is
    # written. Weak, so a stream whose client left before it began (its body never run) is not counted on.
    in_flight: weakref.WeakSet = weakref.WeakSet()
    closings: set[asyncio.Task] = set()  # the MCP servers of finished streams, closing
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
    async def chat_completions(body: ChatRequest, request: Request) -> Any:
        limit = runtime.engine.max_context
        unsupported = body.unsupported()
        if unsupported is not None:
            return counted(openai_error(400, f"{unsupported!r} is not supported by this server yet",
                                        "unsupported_parameter", unsupported))
        try:
            params = body.sampling(limit, limits.text_max_tokens)
        except ValueError as e:
            return counted(openai_error(400, str(e), "invalid_value", "stop"))
        try:
            found, choice, params.grammar, wanted = body.structure()
        except ValueError as e:
            return counted(refused_structure(e))
        entries = [] if body.legacy else mcp_entries(body.tools)
        if not runtime.engine.alive:
            return counted(openai_error(503, "the engine is restarting; try again in a few seconds",
                                        "engine_unavailable", kind="server_error"))
        if len(in_flight) >= limits.max_text_requests:
            response = openai_error(429, f"this server runs at most {limits.max_text_requests} text "
                                    "requests at once; try again shortly", "too_many_requests", kind="requests")
            response.headers["Retry-After"] = "1"
            return counted(response)
        ticket = Ticket()  # its place among the text requests, from its grammars' compile to its answer
        in_flight.add(ticket)
        servers: ChatServers | None = None
        try:
            if entries:  # its MCP servers' tools join its functions
                try:
                    servers = await ChatServers.connect(entries, runtime.mcp, {t.name for t in found})
                    found, choice, params.grammar, wanted = body.structure(servers.tools)
                except McpRefused as e:
                    return counted(openai_error(e.status, str(e), "mcp_unavailable" if e.status == 424
                                                else "invalid_value", e.param))
                except ValueError as e:
                    return counted(refused_structure(e))
            try:
                await grammars.prepare(runtime.engine, wanted)
            except FieldRefused as e:
                return counted(openai_error(400, str(e), e.code, e.param))
            except EngineUnavailable:
                return counted(openai_error(503, "the engine is restarting; try again in a few seconds",
                                            "engine_unavailable", kind="server_error"))
            messages = tools.with_instructions([m.as_chat() for m in body.messages],
                                               tools.instructions(found, choice) if choice else "")
            # Off the event loop: a body's worth of text takes a while to render and tokenize (about a
            # second a megabyte here), and the tokenizer lets the loop run meanwhile.
            prompt = await asyncio.to_thread(chat_prompt_ids, runtime.tokenizer, messages)
            if len(prompt) >= limit:
                return counted(openai_error(400, f"the prompt has {len(prompt)} tokens; this model takes at "
                                            f"most {limit}", "context_length_exceeded", "messages"))
            params.max_tokens = min(params.max_tokens, limit - len(prompt))
            completion = Completion(new_id("chatcmpl"), model_id, len(prompt), calls=choice is not None,
                                    legacy=body.legacy, served=servers.names if servers else frozenset())
            stream = runtime.engine.generate(prompt, params, RequestClass.INTERACTIVE)
            if servers is not None:
                stream = answered(stream, completion, servers, answer_after(
                    [m.as_chat() for m in body.messages], replace(params, grammar=None), limit))
            metrics.api_requests.labels("chat.completions", "200").inc()
            if body.stream:
                usage = body.stream_options is not None and bool(body.stream_options.include_usage)
                held, servers = servers, None  # the stream closes them when it ends
                events = completion.sse(stream, usage, lambda: finished(events, held))
                in_flight.add(events)
                return StreamingResponse(events, media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache"})
            await until_done_or_gone(completion.collect(stream), request)
        finally:
            in_flight.discard(ticket)
            if servers is not None:
                await servers.close()
        if completion.error is not None:
            return counted(openai_error(500, completion.error, "engine_error", kind="server_error"))
        return completion.whole()

    def answer_after(messages: list[dict[str, str]], params: SamplingParams, limit: int
                     ) -> Callable[[list[dict]], Awaitable[tuple[int, AsyncIterator]]]:
        """How the answer after the servers' results is asked: the chat so far without the tools'
        descriptions (no call may follow), the calls and results, words only."""
        async def answer(ran: list[dict]) -> tuple[int, AsyncIterator]:
            prompt = await asyncio.to_thread(chat_prompt_ids, runtime.tokenizer,
                                             messages + [Message(**m).as_chat() for m in ran])
            room = replace(params, max_tokens=max(1, min(params.max_tokens, limit - len(prompt))))
            return len(prompt), runtime.engine.generate(prompt, room, RequestClass.INTERACTIVE)
        return answer

    def finished(events: Any, servers: ChatServers | None) -> None:
        in_flight.discard(events)
        if servers is not None:
            closing = asyncio.ensure_future(servers.close())
            closings.add(closing)
            closing.add_done_callback(closings.discard)

    def counted(response: JSONResponse) -> JSONResponse:
        metrics.api_requests.labels("chat.completions", str(response.status_code)).inc()
        return response

    @router.api_route("/{path:path}", methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"],
                      include_in_schema=False, name=FALLBACK)
    async def unknown(path: str) -> JSONResponse:
        """What OpenAI answers for a path it does not have, which its SDKs show as a NotFoundError."""
        return openai_error(404, f"this server has no /v1/{path}", "unknown_url")

    return router


class Ticket:
    """A request's place among the text requests in flight: from its grammars' compile until its stream
    takes the place over, or its whole answer is written."""


async def until_done_or_gone(work: "asyncio.Future | Any", request: Request) -> None:
    """Run `work` until it finishes, or until the client disconnects: then it is cancelled, which aborts
    its engine request (the client of a non-streaming request that gives up must not leave it running)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
        await asyncio.gather(task, gone, return_exceptions=True)
    if not task.cancelled():
        task.result()


async def disconnected(request: Request) -> None:
    """Returns when the client has gone (the body is read: the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def install_error_handlers(app: FastAPI) -> None:
    """Bad requests answer in OpenAI's error shape, which its SDKs read, instead of FastAPI's: a field that
    fails validation, and under /v1 every HTTP error (a body too large, too deep or not JSON, a wrong
    method)."""
    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ())[1:])
        return openai_error(400, f"{where or 'body'}: {first.get('msg', 'invalid request')}", "invalid_value",
                            where or None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if not request.url.path.startswith("/v1/"):
            return await http_exception_handler(request, exc)
        if isinstance(exc.__cause__, RecursionError):
            message, code = "the body nests deeper than the JSON parser goes (about 1000 levels)", "invalid_json"
        elif exc.status_code == 400:
            message, code = "the body could not be parsed as JSON", "invalid_json"
        else:
            message, code = str(exc.detail), HTTP_CODES.get(exc.status_code, "invalid_request")
        response = openai_error(exc.status_code, message, code)
        response.headers.update(exc.headers or {})
        return response


HTTP_CODES = {404: "unknown_url", 405: "method_not_allowed", 413: "request_too_large"}
