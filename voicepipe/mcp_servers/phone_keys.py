"""The phone's keypad as a tool: an MCP server in the call's own process, named `phone`, whose one tool
presses keys on the line (RFC 4733 events on a SIP call), so an assistant can work an automated menu or
enter a code for its caller. A phone call's session may name it as any MCP server:
`{"type": "mcp", "server_label": "phone"}`."""

import re
from collections.abc import Callable

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

LABEL = "phone"
KEYS = re.compile(r"[0-9*#A-Da-d]{1,32}")


def keypad_server(press: Callable[[str], None]) -> MCPServer:
    """An MCP server whose `send_dtmf` tool hands its keys to `press`."""
    app = MCPServer(LABEL)

    @app.tool()
    def send_dtmf(digits: str) -> str:
        """Press keys on the phone line's keypad (0-9, *, #, A-D), as a caller would for a menu or a code."""
        if not KEYS.fullmatch(digits):
            raise ToolError("digits must be 1 to 32 keys from 0-9, *, # and A-D")
        press(digits.upper())
        return f"Pressed {' '.join(digits.upper())}."

    return app
