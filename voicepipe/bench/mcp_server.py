"""The sample MCP server (`voicepipe.samples.mcp_weather`) started in a process of its own, over streamable
HTTP on a free loopback port: for the tools bench and the tests."""

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

SERVER = ("-m", "voicepipe.samples.mcp_weather")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve_http(slow_s: float = 3.0, timeout_s: float = 30.0) -> Iterator[str]:
    """The server's URL, once it accepts connections (its slow tool taking `slow_s`); stopped on leaving."""
    port = free_port()
    process = subprocess.Popen([sys.executable, *SERVER, "http", str(port), str(slow_s)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("the sample MCP server did not start") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(10)
