"""The MCP servers one call names, connected and listed: those its session names (their tools offered to every
reply from then on) and those one `response.create` names (that reply starts once they are listed). Each
listing runs in a task of its own, so a slow server holds up nothing else, and the client hears of each as
OpenAI's `mcp_list_tools` item. A server a response named stays connected for the next response that names
it the same way, until a session update lets it go. A `response.cancel` drops the replies still waiting
for their servers' listing."""

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from voicepipe.call.client_events import ClientError
from voicepipe.constrained.tools import Tool
from voicepipe.ids import new_id
from voicepipe.mcp_servers import ServerSpec, Toolbox
from voicepipe.pipeline import CallConfig
from voicepipe.pipeline.events import Error, Event
from voicepipe.pipeline.outbound import McpListing
from voicepipe.pipeline.requests import ResponseRequested, SessionUpdate, ToolsListed


class McpListings:
    def __init__(self, toolbox: Toolbox, config: CallConfig, send: Callable[..., Awaitable[None]],
                 push: Callable[[Event], None],
                 compile_grammars: Callable[[list[Tool], Any, str], Awaitable[None]]) -> None:
        self.toolbox, self.config = toolbox, config
        self._send, self._push, self._compile = send, push, compile_grammars  # the session's, for tools and a choice
        self._tasks: set[asyncio.Task] = set()
        self._replies: set[asyncio.Task] = set()  # replies waiting for their servers to be listed
        self._listed: dict[str, tuple[Tool, ...]] = {}  # the tools each server the toolbox holds listed

    def session_named(self, update: SessionUpdate) -> None:
        """Connect the servers a session update names anew, and let go of those it no longer names (a
        response's among them)."""
        named = {spec.label: spec for spec in update.servers}
        the_sessions = {spec.label for spec in self.config.servers}  # as they were before this update
        for label in self.toolbox.labels - set(named):
            self._listed.pop(label, None)
            self._spawn(self.toolbox.drop(label))
        for spec in named.values():
            if self.toolbox.spec(spec.label) != spec or spec.label not in the_sessions:
                self._spawn(self._for_session(spec, update))

    def reply_named(self, request: ResponseRequested, cause: str | None) -> None:
        """List the servers a `response.create` names (those not held as it names them), then start its reply
        with their tools beside its functions; `cause` is its event id, for an error."""
        task = self._spawn(self._for_reply(request, cause))
        self._replies.add(task)
        task.add_done_callback(self._replies.discard)

    def cancel_replies(self) -> None:
        """The client cancelled: the replies still waiting for their servers never start (and their listings
        stop; the next response that names a server lists it anew)."""
        for task in self._replies:
            task.cancel()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, work: Any) -> asyncio.Task:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _for_session(self, spec: ServerSpec, update: SessionUpdate) -> None:
        """One server of the session's, its tools compiled into the grammar beside the session's functions
        and offered to the replies from now on."""
        taken = {t.name for t in (*update.tools, *self.config.server_tools) if t.server != spec.label}
        listed = await self._list(spec, taken, (list(update.tools), update.tool_choice))
        if listed is not None:
            self._push(ToolsListed(spec.label, listed))

    async def _for_reply(self, request: ResponseRequested, cause: str | None) -> None:
        own = request.tools
        offered = list(own.tools or ())
        the_sessions = {spec.label: spec for spec in self.config.servers}
        for spec in own.servers:
            if self.toolbox.spec(spec.label) == spec and spec.label in self._listed:
                offered += [t for t in self._listed[spec.label] if t.name not in {o.name for o in offered}]
            elif spec.label in the_sessions:
                await self._send(Error(
                    "invalid_response", f"MCP server label {spec.label!r} already names another server in this "
                    "session", event_id=cause, param="response.tools"))
                return
            else:
                offered += await self._list(spec, {t.name for t in offered}) or ()
        try:
            await self._compile(offered, own.choice, "response")
        except (ValueError, ClientError) as e:
            code, param = (e.code, e.param) if isinstance(e, ClientError) else ("invalid_response", None)
            await self._send(Error(code, str(e), event_id=cause, param=param))
            return
        self._push(replace(request, tools=replace(own, tools=tuple(offered), servers=())))

    async def _list(self, spec: ServerSpec, taken: set[str], compile_with: tuple[list[Tool], Any] | None = None
                    ) -> tuple[Tool, ...] | None:
        """Connect `spec` and list its tools, leaving out names `taken`; with `compile_with` (other tools, the
        choice), the grammar that calls them beside those is compiled now. None: it failed, and the client
        has heard why."""
        item_id = new_id("mcpl")
        await self._send(McpListing(item_id, spec.label))
        listed = await self.toolbox.connect(spec, taken)
        failure = listed.error
        if failure is None and listed.tools and compile_with is not None:
            others, choice = compile_with
            try:
                await self._compile([*others, *listed.tools], choice, "session")
            except ClientError as e:
                failure = f"the tools of MCP server {spec.label!r}: {e}"
        if failure is not None:
            self._listed.pop(spec.label, None)
            await self.toolbox.drop(spec.label)
            await self._send(McpListing(item_id, spec.label, None, failure))
            return None
        self._listed[spec.label] = listed.tools
        await self._send(McpListing(item_id, spec.label, listed.described))
        return listed.tools
