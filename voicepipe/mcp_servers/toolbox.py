"""One call's MCP servers: each server's tools, listed as tools the model's grammar may call (those the
session allows, with schemas the grammar can hold), and each call run with a timeout. A failure of any kind
(a dead server, a slow one, a tool's own error) comes back as a result the model can speak of; the call
goes on."""

import asyncio
import json
import logging
import time
from dataclasses import dataclass

from scheduler.grammar.schema_limits import SchemaTooComplex, check_schema
from voicepipe.constrained.tools import FunctionCall, Tool
from voicepipe.mcp_servers.connection import Connection
from voicepipe.mcp_servers.spec import McpPolicy, ServerSpec

log = logging.getLogger(__name__)
MAX_OUTPUT = 8000  # characters of a tool's output the model reads


@dataclass(frozen=True, slots=True)
class Listed:
    """A server's listing: the tools the model may call, each as the server described it (for the
    `mcp_list_tools` item), or why there are none."""

    label: str
    tools: tuple[Tool, ...] = ()
    described: tuple[dict, ...] = ()
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a call returned (`output`), or its error in OpenAI's shape (`tool_execution_error`,
    `protocol_error`, `http_error`), and how long the server took."""

    output: str | None = None
    error: dict | None = None
    took_s: float = 0.0

    @property
    def text(self) -> str:
        """What the model reads of it."""
        return self.output if self.error is None else f"The tool failed: {self.error['message']}"


class Toolbox:
    def __init__(self, policy: McpPolicy) -> None:
        self.policy = policy
        self._servers: dict[str, tuple[Connection, dict[str, bool]]] = {}  # label -> (connection, tool -> read-only)

    @property
    def labels(self) -> set[str]:
        return set(self._servers)

    def spec(self, label: str) -> ServerSpec | None:
        held = self._servers.get(label)
        return None if held is None else held[0].spec

    async def connect(self, spec: ServerSpec, taken: set[str]) -> Listed:
        """Connect `spec` (in place of any server under its label) and list its tools; a tool whose name is
        in `taken` (the session's functions, other servers' tools) is left out."""
        await self.drop(spec.label)
        connection = Connection(spec)
        try:
            client = await connection.open(self.policy.list_timeout_s)
            listing = await asyncio.wait_for(client.list_tools(), self.policy.list_timeout_s)
        except asyncio.CancelledError:  # the call ended meanwhile
            await connection.close()
            raise
        except Exception as e:  # noqa: BLE001 - any failure to list (a timeout too) is the listing's error
            await connection.close()
            reason = "timed out" if isinstance(e, TimeoutError) else f"{type(e).__name__}: {e}"
            return Listed(spec.label, error=f"could not list the tools of MCP server {spec.label!r}: {reason}")
        tools, described, read_only = [], [], {}
        for tool in listing.tools:
            hint = bool(tool.annotations and tool.annotations.read_only_hint)
            if not spec.allows(tool.name, hint) or tool.name in taken:
                continue
            schema = tool.input_schema or {"type": "object", "properties": {}}
            try:
                check_schema(schema)
            except SchemaTooComplex as e:
                log.warning("MCP server %s: tool %s left out: %s", spec.label, tool.name, e)
                continue
            read_only[tool.name] = hint
            tools.append(Tool(tool.name, tool.description or "", schema, f"{spec.label}.{tool.name}", spec.label))
            described.append({"name": tool.name, "description": tool.description, "input_schema": schema,
                              "annotations": None if tool.annotations is None else
                              tool.annotations.model_dump(by_alias=True, exclude_none=True)})
        await self.drop(spec.label)  # one connected meanwhile under the same label gives way
        self._servers[spec.label] = (connection, read_only)
        return Listed(spec.label, tuple(tools), tuple(described))

    def timing_key(self, call: FunctionCall) -> str:
        """The name `call`'s tool is timed under, in the policy's `times`: the same tool of the same server
        in every call."""
        held = self._servers.get(call.server)
        spec = held[0].spec if held is not None else None
        where = (spec.url or " ".join(spec.command) or f"local:{spec.label}") if spec is not None else call.server
        return f"{where}#{call.name}"

    def needs_approval(self, call: FunctionCall) -> bool:
        held = self._servers.get(call.server)
        return held is not None and held[0].spec.needs_approval(call.name, held[1].get(call.name, False))

    async def run(self, call: FunctionCall) -> ToolResult:
        """Run `call` on its server, within the operator's timeout."""
        started = time.monotonic()
        held = self._servers.get(call.server)
        if held is None:
            return ToolResult(error={"type": "protocol_error", "code": -32601,
                                     "message": f"MCP server {call.server!r} is not connected"})
        try:
            arguments = json.loads(call.arguments or "{}")
            result = await asyncio.wait_for(held[0].client.call_tool(call.name, arguments),
                                            self.policy.call_timeout_s)
        except TimeoutError:
            return ToolResult(error={"type": "tool_execution_error", "message": f"{call.name} took longer than "
                                     f"{self.policy.call_timeout_s:g} s"}, took_s=time.monotonic() - started)
        except Exception as e:  # noqa: BLE001 - the server or its transport failed: the model hears why
            return ToolResult(error={"type": "protocol_error", "code": getattr(getattr(e, "error", None), "code", -1),
                                     "message": f"{type(e).__name__}: {e}"}, took_s=time.monotonic() - started)
        took = time.monotonic() - started
        text = "\n".join(part.text for part in result.content if getattr(part, "type", "") == "text")[:MAX_OUTPUT]
        if result.is_error:
            return ToolResult(error={"type": "tool_execution_error", "message": text or "the tool failed"},
                              took_s=took)
        if not text and result.structured_content is not None:
            text = json.dumps(result.structured_content)[:MAX_OUTPUT]
        return ToolResult(output=text, took_s=took)

    async def drop(self, label: str) -> None:
        held = self._servers.pop(label, None)
        if held is not None:
            await held[0].close()

    async def close(self) -> None:
        await asyncio.gather(*(self.drop(label) for label in list(self._servers)))
