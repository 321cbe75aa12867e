"""One MCP server, connected for one call through the official `mcp` SDK. The SDK's transports are entered
and left in one task (they hold anyio task groups), so a task of the connection's own holds the client open
until the call ends; the call's stages use it from theirs."""

import asyncio
import logging
from typing import Any

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from voicepipe.mcp_servers.spec import ServerSpec

log = logging.getLogger(__name__)
CLOSE_S = 5.0  # how long a server's transport may take to close before its task is cancelled


class Connection:
    def __init__(self, spec: ServerSpec) -> None:
        self.spec = spec
        self._stop = asyncio.Event()
        self._ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
        self._task: asyncio.Task | None = None
        self.client: Client | None = None

    async def open(self, timeout_s: float) -> Client:
        """Connect (TimeoutError past `timeout_s`; the SDK's error when the server refuses)."""
        self._task = asyncio.create_task(self._hold(), name=f"mcp-{self.spec.label}")
        self.client = await asyncio.wait_for(asyncio.shield(self._ready), timeout_s)
        return self.client

    async def _hold(self) -> None:
        try:
            async with Client(self._target()) as client:
                self._ready.set_result(client)
                await self._stop.wait()
        except BaseException as e:  # noqa: BLE001 - whatever ended the connection ends it for the call
            if not self._ready.done():
                if isinstance(e, asyncio.CancelledError):
                    self._ready.cancel()
                else:
                    self._ready.set_exception(e if isinstance(e, Exception) else ConnectionError(repr(e)))
            elif not isinstance(e, asyncio.CancelledError):
                log.warning("MCP server %s: connection ended: %r", self.spec.label, e)
            if isinstance(e, asyncio.CancelledError):
                raise

    def _target(self) -> Any:
        spec = self.spec
        if spec.local is not None:
            return spec.local
        if spec.command:
            return StdioServerParameters(command=spec.command[0], args=list(spec.command[1:]))
        if spec.headers:
            http = httpx2.AsyncClient(headers=dict(spec.headers), timeout=httpx2.Timeout(30, read=300))
            return streamable_http_client(spec.url, http_client=http)
        return spec.url

    async def close(self) -> None:
        """Leave the server; one still being connected to (a listing that timed out) is given up at once."""
        self._stop.set()
        if self._task is None:
            return
        if not self._ready.done():  # nothing to close gracefully yet
            self._task.cancel()
        else:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), CLOSE_S)
            except Exception:  # noqa: BLE001 - closing (or timing out at it): nothing is left to tell
                self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        if not self._ready.done():
            self._ready.cancel()
        elif not self._ready.cancelled():
            self._ready.exception()  # read here if `open` gave up waiting: it is no news

