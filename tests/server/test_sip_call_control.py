"""Who answers a phone call: the operator's application, told of each SIP call by a signed webhook
(`realtime.call.incoming`), accepts it with its session's settings, rejects it with a SIP status, hangs it
up or transfers it, through the calls API, with the `openai` SDK as OpenAI's own SIP guide does. The
application here is a real HTTP server in the test; the caller is the bare SIP peer."""

import asyncio
import base64
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import openai
import pytest
import uvicorn
from sipmessage import Message
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from support.fake_call import fake_server
from support.sip_peer import SipPeer

from voicepipe.call.limits import Limits
from voicepipe.sip.agent import SipSettings

SECRET = "whsec_" + base64.b64encode(b"a secret of thirty-two bytes....").decode()


@contextlib.asynccontextmanager
async def application(handle: Callable[[openai.AsyncOpenAI, str], Awaitable[None]], base_url: Callable[[], str]
                      ) -> AsyncIterator[tuple[str, list]]:
    """The operator's application: checks each webhook's signature with the SDK, then `handle`s its call."""
    seen: list = []

    async def webhook(request: Request) -> Response:
        client = openai.AsyncOpenAI(api_key="sk-local", base_url=base_url(), webhook_secret=SECRET)
        event = client.webhooks.unwrap(await request.body(), request.headers)
        seen.append(event)
        asyncio.get_running_loop().create_task(handle(client, event.data.call_id))
        return Response(status_code=200)

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(Starlette(routes=[Route("/webhook", webhook, methods=["POST"])]), log_level="warning",
                            lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/webhook", seen
    finally:
        server.should_exit = True
        await task


@contextlib.asynccontextmanager
async def phone_server(handle) -> AsyncIterator[tuple]:
    holder: list = []
    async with application(handle, lambda: f"{holder[0].url}/v1") as (url, seen):
        async with fake_server(Limits(), sip=SipSettings(port=0)) as (server, engine):
            holder.append(server)
            server.phone_calls.webhook, server.phone_calls.secret = url, SECRET
            yield server, seen


async def ring(peer: SipPeer, call_id: str) -> Message:
    invite = peer.invite(call_id=call_id, extra="X-Account: 42\r\n")
    peer.send(invite)
    answer = await peer.answer(call_id, timeout=10)
    if answer.code == 200:
        peer.ack(answer, invite)
    return answer


async def test_the_application_accepts_a_call_with_its_own_instructions_after_a_signed_webhook():
    async def accept(client: openai.AsyncOpenAI, call_id: str) -> None:
        await client.realtime.calls.accept(call_id, type="realtime", instructions="You are the front desk of a hotel.")

    async with phone_server(accept) as (server, seen):
        async with SipPeer(server.sip.agent.address[1]) as peer:
            assert (await ring(peer, "c1")).code == 200
            event = seen[0]
            assert event.type == "realtime.call.incoming" and event.data.call_id.startswith("rtc_")
            assert {"name": "X-Account", "value": "42"} in [h.model_dump() for h in event.data.sip_headers]
            for _ in range(100):
                if server.calls and next(iter(server.calls)).config.instructions.startswith("You are the front"):
                    break
                await asyncio.sleep(0.05)
            assert next(iter(server.calls)).config.instructions == "You are the front desk of a hotel."
            assert event.data.call_id in server.phone_calls.active


async def test_the_application_rejects_a_call_with_a_status_and_an_unknown_call_is_a_404():
    async def reject(client: openai.AsyncOpenAI, call_id: str) -> None:
        await client.realtime.calls.reject(call_id, status_code=486)
        with pytest.raises(openai.NotFoundError):
            await client.realtime.calls.accept(call_id, type="realtime")  # decided already

    async with phone_server(reject) as (server, _):
        async with SipPeer(server.sip.agent.address[1]) as peer:
            assert (await ring(peer, "c2")).code == 486
            assert not server.calls and not server.sip.agent.calls


async def test_the_application_hangs_up_and_transfers_calls_in_progress():
    calls: list[str] = []

    async def accept(client: openai.AsyncOpenAI, call_id: str) -> None:
        calls.append(call_id)
        await client.realtime.calls.accept(call_id, type="realtime")

    async with phone_server(accept) as (server, _):
        client = openai.AsyncOpenAI(api_key="sk-local", base_url=f"{server.url}/v1")
        async with SipPeer(server.sip.agent.address[1]) as peer:
            assert (await ring(peer, "c3")).code == 200
            transfer = asyncio.create_task(client.realtime.calls.refer(calls[0], target_uri="sip:desk@127.0.0.1"))
            refer = await peer.request_from_server("REFER")
            assert refer.headers.get("Refer-To") == "<sip:desk@127.0.0.1>"
            peer.send(reply(refer, 202))
            await asyncio.wait_for(transfer, 5)
            await client.realtime.calls.hangup(calls[0])
            bye = await peer.request_from_server("BYE")
            assert bye.call_id == "c3"
            for _ in range(100):
                if not server.calls:
                    break
                await asyncio.sleep(0.05)
            assert not server.calls and calls[0] not in server.phone_calls.active
            with pytest.raises(openai.NotFoundError):
                await client.realtime.calls.hangup(calls[0])
            with pytest.raises(openai.BadRequestError):
                await client.realtime.calls.reject("rtc_none", status_code=200)


async def test_a_call_the_application_never_decides_on_gets_480(monkeypatch):
    async def ignore(client: openai.AsyncOpenAI, call_id: str) -> None:
        return None

    async with phone_server(ignore) as (server, _):
        server.phone_calls.timeout_s = 0.5
        async with SipPeer(server.sip.agent.address[1]) as peer:
            assert (await ring(peer, "c4")).code == 480
    async with fake_server(Limits(), sip=SipSettings(port=0)) as (server, _):
        server.phone_calls.webhook = "http://127.0.0.1:9/nowhere"  # nothing listens there
        async with SipPeer(server.sip.agent.address[1]) as peer:
            assert (await ring(peer, "c5")).code == 480


def reply(request: Message, code: int) -> bytes:
    head = [f"SIP/2.0 {code} Accepted"] + [f"{name}: {value}" for name in ("Via", "From", "To", "Call-ID", "CSeq")
                                          for value in request.headers.getlist(name)]
    return ("\r\n".join(head) + "\r\nContent-Length: 0\r\n\r\n").encode()
