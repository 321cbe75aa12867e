"""`voicepipe serve` stopped with SIGTERM: the reply in progress finishes, new calls are refused, and the
process exits 0. A real server process with the embedded models."""

import asyncio
import json
import signal
import socket
import sys
import time
from types import SimpleNamespace

import pytest
from helpers import QUESTION, Call
from websockets.asyncio.client import connect

from voicepipe.audio import read_audio

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]
START_S = 300  # loading and warming the models on a busy 2-core machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def status_of(port: int, path: str) -> int | None:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return None
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
    data = await reader.read()
    writer.close()
    return int(data.split()[1]) if data else None


async def test_sigterm_drains_the_calls_and_exits_cleanly(speech_wav):
    port = free_port()
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "voicepipe", "serve", "--port", str(port), "--drain-seconds", "120",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        end = time.monotonic() + START_S
        while await status_of(port, "/ready") != 200:
            assert server.returncode is None, (await server.stderr.read()).decode()
            assert time.monotonic() < end, "the server did not get ready"
            await asyncio.sleep(0.5)
        call = await Call.open(SimpleNamespace(port=port))
        speaking = asyncio.create_task(call.speak(read_audio(speech_wav(QUESTION), 16000), silence_s=3.0))
        created = await call.wait("response.created")
        server.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.5)
        assert await status_of(port, "/ready") == 503  # load balancers stop sending calls here
        async with connect(f"ws://127.0.0.1:{port}/ws") as late:
            refused = json.loads(await asyncio.wait_for(late.recv(), 30))
        assert refused["type"] == "error" and refused["error"]["code"] == "server_shutting_down"
        done = await call.wait("response.done", response=created["response"]["id"])
        assert done["response"]["status"] == "completed"
        assert any(frame for _, frame in call.frames), "the reply's audio did not arrive"
        assert await asyncio.wait_for(server.wait(), 60) == 0
        speaking.cancel()
        await asyncio.gather(speaking, return_exceptions=True)
        await call.close()
    finally:
        if server.returncode is None:
            server.kill()
            await server.wait()
