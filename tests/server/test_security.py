"""Who may use the server: Host and Origin checks against DNS rebinding and foreign pages, the API key on
HTTP and websockets, the knobs only for trusted clients, the probes, and the per-call cap on ASR work."""

import asyncio
import json

import numpy as np
import openai
import pytest
import pytest_asyncio
from support.helpers import http_get
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from voicepipe.backends.loading import ASR_FINAL
from voicepipe.pipeline import CallConfig
from voicepipe.pipeline.asr_stage import MAX_PENDING_FINALS, ASRStage
from voicepipe.pipeline.events import SpeechAudio, SpeechStarted, SpeechStopped
from voicepipe.server import VoiceServer
from voicepipe.server.security import KEY_SUBPROTOCOL, Security

pytestmark = pytest.mark.asyncio(loop_scope="module")
KEY = "s3cret-key"
FRIEND = "https://friend.example"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def keyed(runtime):
    """A server that wants the key, and lets one other origin's pages open calls."""
    server = VoiceServer(runtime, security=Security(KEY, frozenset({FRIEND})))
    await server.start("127.0.0.1", 0)
    yield server
    await server.close()


async def raw(server: VoiceServer, path: str, host: str, extra: str = "") -> tuple[int, bytes]:
    """The status and body of a GET naming `host`."""
    status, _, body = await http_get(server, path, host, extra)
    return status, body


async def opened(url: str, **kwargs) -> dict:
    """Open a call; its first event (session.created), or the refusal's HTTP status as {'status': N}."""
    try:
        async with connect(url, **kwargs) as ws:
            return json.loads(await asyncio.wait_for(ws.recv(), 30))
    except InvalidStatus as e:
        return {"status": e.response.status_code}


async def test_cross_origin_upgrades_are_refused(server):
    url = f"ws://127.0.0.1:{server.port}"
    assert (await opened(f"{url}/ws", origin="https://evil.example"))["status"] == 403
    assert (await opened(f"{url}/v1/realtime", origin="https://evil.example"))["status"] == 403
    assert (await opened(f"{url}/ws", origin=f"http://127.0.0.1:{server.port}"))["type"] == "session.created"
    assert (await opened(f"{url}/ws"))["type"] == "session.created"  # not a browser: no Origin


async def test_a_foreign_host_is_refused_on_loopback(server):
    status, body = await raw(server, "/", "attacker.example")
    assert status == 403 and b"host" in body
    assert (await raw(server, "/", f"localhost:{server.port}"))[0] == 200
    assert (await raw(server, "/health", f"[::1]:{server.port}"))[0] == 200
    upgrade = "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n" \
              "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    assert (await raw(server, "/ws", f"rebound.example:{server.port}", upgrade))[0] == 403


async def test_the_api_key_is_required_and_checked(keyed):
    base = f"{keyed.url}/v1"
    with pytest.raises(openai.AuthenticationError) as e:
        await openai.AsyncOpenAI(base_url=base, api_key="wrong", max_retries=0).models.list()
    assert e.value.body["code"] == "invalid_api_key"
    assert (await raw(keyed, "/v1/models", f"127.0.0.1:{keyed.port}"))[0] == 401
    models = await openai.AsyncOpenAI(base_url=base, api_key=KEY, max_retries=0).models.list()
    assert len(models.data) == 1
    assert (await raw(keyed, "/", f"127.0.0.1:{keyed.port}"))[0] == 200  # the page loads; its calls need the key
    assert (await raw(keyed, "/ready", f"127.0.0.1:{keyed.port}"))[0] == 200
    url = f"ws://127.0.0.1:{keyed.port}"
    assert (await opened(f"{url}/ws"))["status"] == 401
    assert (await opened(f"{url}/ws?api_key=nope"))["status"] == 401
    assert (await opened(f"{url}/ws?api_key={KEY}"))["type"] == "session.created"
    assert (await opened(f"{url}/ws", additional_headers={"Authorization": f"Bearer {KEY}"}))["type"] \
        == "session.created"
    assert (await opened(f"{url}/v1/realtime", subprotocols=["realtime", KEY_SUBPROTOCOL + KEY]))["type"] \
        == "session.created"
    async with openai.AsyncOpenAI(base_url=base, api_key=KEY).realtime.connect(model="x") as conn:
        assert (await conn.recv()).type == "session.created"


async def test_knobs_need_the_key_or_the_servers_own_page(keyed, runtime):
    """A listed origin may open calls, but turns the engine's knobs only with the key."""
    knobs = {"type": "session.update", "session": {"scheduler": {"max_batch_seqs": 17}}}
    before = runtime.engine.config.max_batch_seqs
    url = f"ws://127.0.0.1:{keyed.port}/ws?api_key="

    async def update(query: str) -> dict:
        async with connect(url + query, origin=FRIEND) as ws:
            await ws.recv()  # session.created
            await ws.send(json.dumps(knobs))
            while True:
                event = json.loads(await asyncio.wait_for(ws.recv(), 30))
                if event["type"] in ("error", "session.updated"):
                    return event

    assert (await opened(url + "wrong", origin=FRIEND))["status"] == 401
    keyless = Security(None, frozenset({FRIEND}))
    keyed.security = keyless  # the friend's page without a key: it may call, not tune
    try:
        refused = await update("")
    finally:
        keyed.security = Security(KEY, frozenset({FRIEND}))
    assert refused["type"] == "error" and "key" in refused["error"]["message"]
    assert runtime.engine.config.max_batch_seqs == before
    accepted = await update(KEY)
    assert accepted["type"] == "session.updated" and accepted["session"]["scheduler"]["max_batch_seqs"] == 17
    runtime.engine.update_config(max_batch_seqs=before)


async def test_health_and_ready(server):
    assert (await raw(server, "/health", "127.0.0.1"))[0] == 200
    assert (await raw(server, "/ready", "127.0.0.1"))[0] == 200
    server.draining = True
    try:
        status, body = await raw(server, "/ready", "127.0.0.1")
        assert status == 503 and b"draining" in body
        refused = await opened(f"ws://127.0.0.1:{server.port}/ws")
        assert refused["type"] == "error" and refused["error"]["code"] == "server_shutting_down"
    finally:
        server.draining = False


class StuckFinals:
    """An engine whose final ASR passes never finish: a device far slower than the audio arriving."""

    def __init__(self) -> None:
        self.started = 0

    async def run_job(self, kind: str, audio: np.ndarray, cls=None, deadline: float | None = None) -> str:
        assert kind == ASR_FINAL  # no partial passes: the utterances are too short
        self.started += 1
        await asyncio.Event().wait()
        return ""


async def test_a_call_cannot_queue_unbounded_final_passes():
    finals = StuckFinals()
    stage = ASRStage(finals, 16000, CallConfig())
    out: list = []
    tasks: list[asyncio.Task] = []
    stage._emit, stage._spawn = out.append, lambda coro: tasks.append(asyncio.ensure_future(coro)) or tasks[-1]
    for n in range(MAX_PENDING_FINALS + 2):
        item = f"item_{n}"
        for event in (SpeechStarted(item, 0, 0.0), SpeechAudio(item, np.zeros(1600, np.float32), False),
                      SpeechStopped(item, 100, 0.0, 1600)):
            await stage.process(event)
    await asyncio.sleep(0.05)
    errors = [e for e in out if getattr(e, "code", None) == "too_much_audio"]
    assert finals.started == MAX_PENDING_FINALS and len(errors) == 2
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
