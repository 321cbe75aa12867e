"""Tools run by the server: MCP servers a call may use (the operator's, and those a session names that the
operator allows), connected for the call, their tools listed into the model's grammar and run when the
model calls them. The toolbox (which imports the MCP SDK) loads on first use: settings and the command
line read the specs alone."""

from typing import TYPE_CHECKING

from voicepipe.mcp_servers.spec import McpPolicy, ServerSpec, parse_server

if TYPE_CHECKING:
    from voicepipe.mcp_servers.toolbox import Listed, Toolbox, ToolResult

__all__ = ["Listed", "McpPolicy", "ServerSpec", "ToolResult", "Toolbox", "parse_server"]


def __getattr__(name: str):
    if name in ("Listed", "Toolbox", "ToolResult"):
        from voicepipe.mcp_servers import toolbox

        return getattr(toolbox, name)
    raise AttributeError(f"module 'voicepipe.mcp_servers' has no attribute {name!r}")
