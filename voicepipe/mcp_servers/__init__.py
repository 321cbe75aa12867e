"""Tools run by the server: MCP servers a call may use (the operator's, and those a session names that the
operator allows), connected for the call, their tools listed into the model's grammar and run when the
model calls them."""

from voicepipe.mcp_servers.spec import McpPolicy, ServerSpec, parse_server
from voicepipe.mcp_servers.toolbox import Listed, Toolbox, ToolResult

__all__ = ["Listed", "McpPolicy", "ServerSpec", "ToolResult", "Toolbox", "parse_server"]
