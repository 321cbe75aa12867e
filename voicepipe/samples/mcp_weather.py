"""A small MCP server to try the tools the server runs (and the one the tests run), on the official `mcp`
SDK: `python -m voicepipe.samples.mcp_weather http PORT [SLOW_S]` serves streamable HTTP on 127.0.0.1:PORT/mcp,
`python -m voicepipe.samples.mcp_weather stdio` speaks over stdin/stdout. Its weather is made up; one tool
is slow and one always fails, to hear what a caller hears then."""

import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

app = MCPServer("weather")
SLOW_S = float(sys.argv[3]) if len(sys.argv) > 3 else 3.0  # how long slow_forecast takes


@app.tool(annotations=ToolAnnotations(read_only_hint=True))
def forecast(city: str) -> str:
    """Tomorrow's weather in a city."""
    return f"Sunny in {city}, 21 degrees."


@app.tool()
def book_table(city: str, people: int) -> str:
    """Book a table for dinner."""
    return f"Booked a table for {people} in {city}."


@app.tool()
def slow_forecast(city: str) -> str:
    """Tomorrow's weather, from a slow service."""
    time.sleep(SLOW_S)
    return f"Rain in {city}."


@app.tool()
def broken(city: str) -> str:
    """A tool whose service is down."""
    raise ToolError("the weather service is down")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        app.run("streamable-http", port=int(sys.argv[2]))
    else:
        app.run()
