"""`voicepipe serve` stopped with SIGTERM: the reply in progress finishes, new calls are refused, and the
process exits 0, its engine process with it. A real server process with the embedded models."""

import asyncio
import json
import os
import signal
import sys
import time
from types import SimpleNamespace

import pytest
from support.helpers import LONG_QUESTION, Call, free_port, health, status_of
from websockets.asyncio.client import connect

from voicepipe.audio import read_audio

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]
START_S = 300  # loading and warming the models on a busy 2-core machine


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
        engine_pid = (await health(port))["engine_pid"]
        call = await Call.open(SimpleNamespace(port=port))
        speaking = asyncio.create_task(call.speak(read_audio(speech_wav(LONG_QUESTION), 16000), silence_s=3.0))
        created = await call.wait("response.created")
        server.send_signal(signal.SIGTERM)
        end = time.monotonic() + 10
        while await status_of(port, "/ready") != 503:  # load balancers stop sending calls here
            assert time.monotonic() < end, "/ready still says ready after SIGTERM"
            await asyncio.sleep(0.05)
        async with connect(f"ws://127.0.0.1:{port}/ws") as late:
            refused = json.loads(await asyncio.wait_for(late.recv(), 30))
        assert refused["type"] == "error" and refused["error"]["code"] == "server_shutting_down"
        done = await call.wait("response.done", response=created["response"]["id"])
        assert done["response"]["status"] == "completed"
        assert any(frame for _, frame in call.frames), "the reply's audio did not arrive"
        assert await asyncio.wait_for(server.wait(), 60) == 0
        with pytest.raises(ProcessLookupError):  # the engine process went with it
            os.kill(engine_pid, 0)
        speaking.cancel()
        await asyncio.gather(speaking, return_exceptions=True)
        await call.close()
    finally:
        if server.returncode is None:
            server.kill()
            await server.wait()
