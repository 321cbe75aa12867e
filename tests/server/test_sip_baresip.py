"""Phone calls from a real SIP user agent (baresip, Debian's package) over loopback, with the fake engine:
the caller's question is heard and answered in its ear, keys pressed arrive, a barge-in stops the reply at
once (the RTP queue dropped), and a hang-up from either side ends the call cleanly."""

import asyncio
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile
from support.fake_call import fake_server

from voicepipe.bench.baresip import Baresip
from voicepipe.call.limits import Limits
from voicepipe.sip.agent import SipSettings

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("baresip") is None, reason="baresip is not installed")]
QUESTION = Path(__file__).parents[2] / "voicepipe" / "samples" / "question.wav"
REPLY = " ".join(["word"] * 60)  # six seconds of the fake voice: still playing when the caller speaks again
SIP = SipSettings(port=0)


def loudness(path: Path, window_s: float = 0.1) -> tuple[np.ndarray, float]:
    """Mean absolute level per window of what the phone heard, and the window's length."""
    audio, rate = soundfile.read(path, dtype="int16")
    n = int(rate * window_s)
    return np.array([np.abs(audio[i:i + n].astype(int)).mean() for i in range(0, len(audio) - n + 1, n)]), window_s


async def until(condition, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out"
        await asyncio.sleep(0.05)


async def test_baresip_asks_hears_the_answer_presses_keys_and_hangs_up(monkeypatch):
    from voicepipe.pipeline import keypad

    monkeypatch.setattr(keypad, "PAUSE_S", 0.5)
    async with fake_server(Limits(), reply="one two three", heard="What is the capital of France?", sip=SIP) as (
            server, engine):
        async with Baresip(QUESTION, codecs=("PCMA", "PCMU")) as phone:
            await phone.dial(f"sip:voicepipe@127.0.0.1:{server.sip.agent.address[1]}")
            await phone.wait_event("CALL_ESTABLISHED", 5)
            await until(lambda: engine.requests and any(r.closed for r in engine.requests if r.prompt))
            await asyncio.sleep(2.0)
            levels, _ = loudness(phone.recordings()[0])
            assert levels.max() > 500  # the fake voice's tone, heard through A-law
            asked = {engine.tokenizer.last_user_message(r.prompt) for r in engine.requests}
            assert "What is the capital of France?" in asked
            await phone.send_dtmf("42#")
            await until(lambda: "[The caller pressed on the phone's keypad: 4 2 #]" in
                        {engine.tokenizer.last_user_message(r.prompt) for r in engine.requests})
            await phone.hangup()
            await phone.wait_event("CALL_CLOSED", 5)
            await until(lambda: not server.calls and not server.sip.agent.calls, 5)


async def test_a_barge_in_stops_the_reply_in_the_callers_ear_at_once():
    async with fake_server(Limits(), reply=REPLY, heard="Tell me more.", sip=SIP) as (server, engine):
        async with Baresip(QUESTION) as phone:
            await phone.dial(f"sip:voicepipe@127.0.0.1:{server.sip.agent.address[1]}")
            start = time.monotonic()
            await phone.wait_event("CALL_ESTABLISHED", 5)
            await until(lambda: (lv := loudness(phone.recordings()[0])[0]).size and lv.max() > 500)
            await asyncio.sleep(1.0)  # a second of the six-second reply
            barge = time.monotonic() - start
            await phone.play()  # the caller speaks over it
            await asyncio.sleep(4.0)
            levels, window = loudness(phone.recordings()[0])
            t = np.arange(len(levels)) * window
            speaking = levels > 500
            first = t[speaking][0]
            stopped = next(x for x in t[(t > barge) & ~speaking])
            assert first < barge < stopped
            # the reply had five seconds left: it stops within a second of the caller's voice
            assert stopped - barge < 1.0, (barge, stopped)
            assert len(engine.requests) >= 2


async def answered(phone: Baresip, server):
    """Dial the server and wait for the call's session: the session."""
    await phone.dial(f"sip:voicepipe@127.0.0.1:{server.sip.agent.address[1]}")
    await phone.wait_event("CALL_ESTABLISHED", 5)
    await until(lambda: len(server.calls) == 1)
    return next(iter(server.calls))


async def test_the_server_hangs_up_and_baresip_hears_the_bye():
    async with fake_server(Limits(), sip=SIP) as (server, _):
        async with Baresip(QUESTION) as phone:
            session = await answered(phone, server)
            await session.hang_up()
            await phone.wait_event("CALL_CLOSED", 5)
            await until(lambda: not server.calls and not server.sip.agent.calls, 5)


async def test_a_tool_presses_keys_the_caller_hears_as_rfc_4733_events():
    from voicepipe.constrained.tools import FunctionCall
    from voicepipe.mcp_servers import Toolbox

    async with fake_server(Limits(), sip=SIP) as (server, _):
        async with Baresip(QUESTION) as phone:
            session = await answered(phone, server)
            toolbox = Toolbox(session.mcp)  # what the model's call runs on, as a session's `phone` server
            try:
                listed = await toolbox.connect(session.mcp.servers["phone"], set())
                assert [t.name for t in listed.tools] == ["send_dtmf"]
                result = await toolbox.run(FunctionCall("c1", "send_dtmf", '{"digits": "5#"}', "phone"))
                assert result.error is None and result.output == "Pressed 5 #."
                refused = await toolbox.run(FunctionCall("c2", "send_dtmf", '{"digits": "5; rm"}', "phone"))
                assert refused.error is not None
            finally:
                await toolbox.close()
            await phone.wait_event("CALL_DTMF_START", 5)
            await until(lambda: [e.get("param") for e in phone.events if e.get("type") == "CALL_DTMF_START"]
                        == ["5", "#"], 5)
