"""MCP servers named in a chat completion's `tools` (`{"type": "mcp", "server_label", "server_url", ...}`,
the shape of OpenAI's Responses API and Realtime sessions): connected for the request, their tools offered
beside its functions, the calls the reply makes to them run by the server, and the answer written from
their results in the same completion. One round, as a call's reply does; the answer is held to words.

A chat completion cannot wait for an approval, so every server it names must say
`"require_approval": "never"`; a server whose tools cannot be listed fails the request with 424, as
OpenAI's Responses API does."""

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import Any

from scheduler import Output
from voicepipe.constrained.tools import FunctionCall, Tool
from voicepipe.mcp_servers import McpPolicy, Toolbox, ToolResult, parse_server
from voicepipe.mcp_servers.spec import ToolFilter
from voicepipe.server.completion import Completion


class McpRefused(ValueError):
    """A server the request may not use as it asks (`status` 400), or one that could not be listed (424)."""

    def __init__(self, message: str, param: str, status: int = 400) -> None:
        super().__init__(message)
        self.param, self.status = param, status


@dataclass
class ChatServers:
    """The request's MCP servers, connected; `tools` are theirs, as the grammar offers them."""

    toolbox: Toolbox
    tools: list[Tool] = field(default_factory=list)
    ran: list[tuple[FunctionCall, ToolResult]] = field(default_factory=list)

    @property
    def names(self) -> frozenset[str]:
        return frozenset(t.name for t in self.tools)

    @classmethod
    async def connect(cls, entries: list[tuple[int, dict]], policy: McpPolicy, taken: set[str]) -> "ChatServers":
        """Connect and list each server named in `entries` ((index in `tools`, entry)); McpRefused if one may
        not be used or cannot be listed (those connected are closed again)."""
        servers = cls(Toolbox(policy))
        try:
            for index, entry in entries:
                at = f"tools[{index}]"
                try:
                    spec = parse_server(entry, at, policy)
                except ValueError as e:
                    raise McpRefused(str(e), str(e).split(":")[0]) from None
                if spec.always != ToolFilter():  # some tool would wait for an approval
                    raise McpRefused(f"{at}.require_approval: a chat completion cannot wait for an approval; give "
                                     '"never"', f"{at}.require_approval")
                listed = await servers.toolbox.connect(spec, taken | servers.names)
                if listed.error is not None:
                    raise McpRefused(listed.error, f"{at}.server_label", status=424)
                servers.tools += listed.tools
        except BaseException:
            await servers.close()
            raise
        return servers

    async def run(self, calls: list[FunctionCall]) -> list[dict[str, Any]]:
        """Run the reply's calls to these servers; the messages that put each call and its result in the chat."""
        mine = [c for c in calls if c.server]
        for call in mine:
            self.ran.append((call, await self.toolbox.run(call)))
        if not mine:
            return []
        assistant = {"role": "assistant", "content": "", "tool_calls": [
            {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in mine]}
        return [assistant] + [{"role": "tool", "tool_call_id": c.call_id, "content": r.text} for c, r in self.ran]

    def report(self) -> list[dict[str, Any]]:
        """What ran, as Responses' `mcp_call` items read (the message's `mcp_calls`, beside OpenAI's fields)."""
        return [{"type": "mcp_call", "id": c.call_id, "server_label": c.server, "name": c.name,
                 "arguments": c.arguments, "output": r.output, "error": r.error} for c, r in self.ran]

    async def close(self) -> None:
        await self.toolbox.close()


def mcp_entries(given: list[Any] | None) -> list[tuple[int, dict]]:
    """The MCP servers among a request's `tools`, each with its index there."""
    return [(n, t) for n, t in enumerate(given or []) if isinstance(t, dict) and t.get("type") == "mcp"]


async def answered(first: AsyncIterator[Output], completion: Completion, servers: ChatServers,
                   answer: Callable[[list[dict[str, Any]]], Awaitable[tuple[int, AsyncIterator[Output]]]]
                   ) -> AsyncIterator[Output]:
    """The reply's outputs, then, where it called the servers' tools, the outputs of its answer: the calls
    are run once the reply has ended, and `answer(messages)` (the calls and their results, to follow the
    chat) starts the answer's request: (its prompt's length, its outputs)."""
    async with aclosing(first) as outputs:
        async for out in outputs:
            yield out
    labels = {t.name: t.server for t in servers.tools}
    made = [replace(c, server=labels.get(c.name, "")) for c in (completion.parser.calls if completion.parser else [])]
    if not any(c.server for c in made) or completion.error is not None:
        return
    messages = await servers.run(made)
    completion.mcp_calls = servers.report()
    prompt_tokens, rest = await answer(messages)
    completion.answering(prompt_tokens)
    if completion.text and not completion.text[-1].isspace():
        yield Output(None, " ")  # the answer's words apart from the reply's, streamed as they are whole
    async with aclosing(rest) as outputs:
        async for out in outputs:
            yield out
