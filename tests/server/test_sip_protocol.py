"""The SIP user agent over loopback UDP with the fake engine, driven by a bare peer that sends what a PBX
would (and what none should): calls answered with G.711 both ways, OPTIONS, CANCEL, hold by re-INVITE, keys
by SIP INFO, hang-up either way, and each refusal with its proper status (400, 401, 403, 486, 488)."""

import asyncio
import random
import re
import time
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import generate_latest
from sipmessage import Message
from support.fake_call import fake_server
from support.sip_peer import SipPeer

from voicepipe.audio import read_audio, to_pcm16
from voicepipe.call.limits import Limits
from voicepipe.sip import agent as sip_agent
from voicepipe.sip.agent import SipSettings
from voicepipe.sip.digest import authorization
from voicepipe.sip.rtp_packet import RtpPacket
from voicepipe.wire_audio import PCMU

VOICE = read_audio(Path(__file__).parents[2] / "voicepipe" / "samples" / "question.wav", 8000)
SIP = SipSettings(port=0)


async def call(peer: SipPeer, formats: tuple[int, ...] = (0, 8, 101)) -> tuple[str, Message, int]:
    """Place a call and acknowledge its answer: (call id, the 200, the server's RTP port)."""
    invite = peer.invite(peer.offer(formats))
    peer.send(invite)
    call_id = Message.parse(invite).call_id
    ok = await peer.answer(call_id)
    assert ok.code == 200, ok.code
    peer.ack(ok, invite)
    port = int(next(line for line in ok.body.decode().splitlines() if line.startswith("m=audio")).split()[1])
    return call_id, ok, port


async def speak(peer: SipPeer, port: int, audio: np.ndarray, first: int = 0) -> int:
    """The caller's audio as 20 ms μ-law RTP packets in real time; the next sequence number."""
    coded = PCMU.encode(to_pcm16(audio))
    t0 = time.monotonic()
    for n, i in enumerate(range(0, len(coded), 160)):
        await asyncio.sleep(max(0.0, t0 + n * 0.02 - time.monotonic()))
        peer.send_rtp(port, RtpPacket(0, first + n, 160 * (first + n), 1234, coded[i : i + 160]))
    return first + len(coded) // 160 + 1


async def until(condition, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out"
        await asyncio.sleep(0.02)


async def test_a_call_is_answered_heard_and_replied_to_in_g711_and_ends_with_the_callers_bye():
    async with fake_server(Limits(), reply="Paris.", heard="What is the capital of France?", sip=SIP) as (
        server,
        engine,
    ):
        async with SipPeer(server.sip.agent.address[1]) as peer:
            call_id, ok, port = await call(peer)
            assert "a=rtpmap:0 PCMU/8000" in ok.body.decode() and "telephone-event" in ok.body.decode()
            assert ok.to_address.parameters.get("tag") and ok.contact
            await until(lambda: len(server.calls) == 1)
            await speak(peer, port, np.concatenate([VOICE, np.zeros(8000, np.float32)]))
            await until(lambda: any(abs(PCMU.decode(p.payload).astype(int)).mean() > 100 for p in peer.rtp_packets()))
            assert "What is the capital of France?" in {
                engine.tokenizer.last_user_message(r.prompt) for r in engine.requests
            }
            packets = peer.rtp_packets()
            assert {p.payload_type for p in packets} == {0} and len({p.ssrc for p in packets}) == 1
            assert all(len(p.payload) == 160 for p in packets)
            gaps = np.diff([p.sequence for p in packets]) % 65536
            assert set(gaps) == {1}  # one stream, numbered on, silence between replies
            peer.send(peer.request("BYE", call_id=call_id, to_tag=ok.to_address.parameters["tag"]))
            assert (await peer.answer(call_id, "BYE")).code == 200
            await until(lambda: not server.calls and not server.sip.agent.calls)


async def test_the_first_g711_of_the_offer_is_chosen():
    async with fake_server(Limits(), sip=SIP) as (server, _):
        async with SipPeer(server.sip.agent.address[1]) as peer:
            _, ok, _ = await call(peer, (8, 0))
            assert "m=audio" in ok.body.decode() and "RTP/AVP 8\r\n" in ok.body.decode()


async def test_options_is_answered_with_what_the_agent_allows():
    async with fake_server(Limits(), sip=SIP) as (server, _):
        async with SipPeer(server.sip.agent.address[1]) as peer:
            peer.send(peer.request("OPTIONS", call_id="ping"))
            answer = await peer.answer("ping", "OPTIONS")
            assert answer.code == 200 and "INVITE" in answer.headers.get("Allow")


async def test_a_malformed_invite_gets_400_and_the_next_call_is_answered():
    async with fake_server(Limits(), sip=SIP) as (server, _):
        async with SipPeer(server.sip.agent.address[1]) as peer:
            peer.send(peer.invite(call_id="bad").replace(b"CSeq: 1 INVITE", b"CSeq: one INVITE"))
            assert (await peer.answer("bad")).code == 400
            peer.send(peer.invite(body=b"v=0\r\nc=IN IP4 nowhere\r\nm=audio 1 RTP/AVP 0\r\n", call_id="bad-sdp"))
            assert (await peer.answer("bad-sdp")).code == 400
            await call(peer)
            await until(lambda: len(server.calls) == 1)


@pytest.mark.parametrize("formats", [(9,), (111, 101)])
async def test_an_offer_with_no_codec_spoken_here_gets_488(formats):
    async with fake_server(Limits(), sip=SIP) as (server, _):
        async with SipPeer(server.sip.agent.address[1]) as peer:
            peer.send(peer.invite(peer.offer(formats), call_id="wideband"))
            answer = await peer.answer("wideband")
            assert answer.code == 488 and "PCMU" in answer.headers.get("Warning")
            assert not server.sip.agent.calls


async def test_a_call_past_max_calls_gets_486_busy_here():
    async with fake_server(Limits(max_calls=1), sip=SIP) as (server, _):
        async with SipPeer(server.sip.agent.address[1]) as peer:
            await call(peer)
            peer.send(peer.invite(call_id="second"))
            assert (await peer.answer("second")).code == 486
            assert len(server.sip.agent.calls) == 1


async def test_a_caller_from_elsewhere_is_refused_or_challenged_and_let_in_with_the_password():
    async with fake_server(Limits(), sip=SipSettings(port=0, allow=("10.0.0.0/8",))) as (server, _):
        async with SipPeer(server.sip.agent.address[1]) as peer:
            peer.send(peer.invite(call_id="stranger"))
            assert (await peer.answer("stranger")).code == 403
    async with fake_server(Limits(), sip=SipSettings(port=0, allow=(), user="pbx", password="s3cret")) as (server, _):
        async with SipPeer(server.sip.agent.address[1]) as peer:
            peer.send(peer.invite(call_id="keyed"))
            challenge = await peer.answer("keyed")
            assert challenge.code == 401 and challenge.www_authenticate.scheme == "Digest"
            uri = f"sip:voicepipe@127.0.0.1:{peer.server[1]}"
            wrong = authorization(challenge.www_authenticate, "pbx", "guess", "INVITE", uri)
            peer.send(peer.invite(call_id="wrong", extra=f"Authorization: {wrong}\r\n"))
            assert (await peer.answer("wrong")).code == 401
            right = authorization(challenge.www_authenticate, "pbx", "s3cret", "INVITE", uri)
            peer.send(peer.invite(call_id="right", extra=f"Authorization: {right}\r\n"))
            assert (await peer.answer("right")).code == 200


async def test_cancel_before_the_answer_ends_the_invite_with_487(monkeypatch):
    async with fake_server(Limits(), sip=SIP) as (server, _):
        decide = server.sip.agent.decide

        async def slow(call):
            await asyncio.sleep(5)
            return await decide(call)

        server.sip.agent.decide = slow
        async with SipPeer(server.sip.agent.address[1]) as peer:
            invite = peer.invite(call_id="ringing")
            peer.send(invite)
            assert (await peer.answer("ringing", final=False)).code == 100
            branch = Message.parse(invite).via[0].parameters["branch"]
            peer.send(
                peer.request("CANCEL", call_id="ringing", branch=branch, cseq=Message.parse(invite).cseq.sequence)
            )
            assert (await peer.answer("ringing", "CANCEL")).code == 200
            assert (await peer.answer("ringing")).code == 487
            assert not server.sip.agent.calls and all(c.ended for c in server.sip._admitted)


async def test_a_retransmitted_invite_gets_the_same_answer_and_an_unacknowledged_one_is_repeated():
    async with fake_server(Limits(), sip=SIP) as (server, _):
        async with SipPeer(server.sip.agent.address[1]) as peer:
            invite = peer.invite(call_id="twice")
            peer.send(invite)
            first = await peer.answer("twice")
            peer.send(invite)
            await asyncio.sleep(1.2)  # no ACK: the 200 comes again after 0.5 s, then 1 s
            oks = [m for m in peer.messages() if getattr(m, "code", 0) == 200 and m.call_id == "twice"]
            assert len(oks) >= 3 and {bytes(m) for m in oks} == {bytes(first)}
            assert len(server.sip.agent.calls) == 1
            peer.ack(first, invite)


async def test_hold_by_re_invite_stops_the_reply_audio_and_taking_it_off_hold_resumes_it():
    async with fake_server(Limits(), sip=SIP) as (server, _):
        async with SipPeer(server.sip.agent.address[1]) as peer:
            call_id, ok, _ = await call(peer)
            tag = ok.to_address.parameters["tag"]
            hold = peer.invite(peer.offer().replace(b"a=sendrecv", b"a=sendonly"), call_id=call_id, to_tag=tag)
            peer.send(hold)
            answer = await peer.answer(call_id, cseq=Message.parse(hold).cseq.sequence)
            assert answer.code == 200 and "a=recvonly" in answer.body.decode()
            peer.ack(answer, hold)
            await asyncio.sleep(0.1)
            held = len(peer.rtp.received)
            await asyncio.sleep(0.3)
            assert len(peer.rtp.received) == held  # nothing sent to a caller on hold
            peer.send(peer.invite(peer.offer(), call_id=call_id, to_tag=tag))
            await asyncio.sleep(0.3)
            assert len(peer.rtp.received) > held + 5


async def test_keys_sent_by_sip_info_join_the_conversation(monkeypatch):
    from voicepipe.pipeline import keypad

    monkeypatch.setattr(keypad, "PAUSE_S", 0.3)
    async with fake_server(Limits(), reply="Sales it is.", sip=SIP) as (server, engine):
        async with SipPeer(server.sip.agent.address[1]) as peer:
            call_id, ok, _ = await call(peer)
            tag = ok.to_address.parameters["tag"]
            for digit in "4#":
                peer.send(
                    peer.request(
                        "INFO",
                        f"Signal={digit}\r\nDuration=160\r\n".encode(),
                        call_id=call_id,
                        to_tag=tag,
                        extra="Content-Type: application/dtmf-relay\r\n",
                    )
                )
            peer.send(
                peer.request("INFO", b"<xml/>", call_id=call_id, to_tag=tag, extra="Content-Type: application/xml\r\n")
            )
            await until(lambda: engine.requests)
            codes = [m.code for m in peer.messages() if getattr(m, "cseq", None) and m.cseq.method == "INFO"]
            assert sorted(codes) == [200, 200, 415]
            assert (
                engine.tokenizer.last_user_message(engine.requests[0].prompt)
                == "[The caller pressed on the phone's keypad: 4 #]"
            )


async def test_the_server_hangs_up_with_a_bye_when_it_closes_and_a_bye_for_no_call_gets_481():
    async with fake_server(Limits(), sip=SIP) as (server, _):
        async with SipPeer(server.sip.agent.address[1]) as peer:
            peer.send(peer.request("BYE", call_id="nothing", to_tag="nope"))
            assert (await peer.answer("nothing", "BYE")).code == 481
            call_id, _, _ = await call(peer)
            await until(lambda: len(server.calls) == 1)
            closing = asyncio.create_task(server.close())
            bye = await peer.request_from_server("BYE")
            assert bye.call_id == call_id
            peer.send(
                b"SIP/2.0 200 OK\r\n"
                + b"\r\n".join(
                    f"{name}: {value}".encode()
                    for name in ("Via", "From", "To", "Call-ID", "CSeq")
                    for value in bye.headers.getlist(name)
                )
                + b"\r\nContent-Length: 0\r\n\r\n"
            )
            await asyncio.wait_for(closing, 10)


async def test_a_silent_caller_is_hung_up_after_the_rtp_timeout(monkeypatch):
    async with fake_server(Limits(), sip=SipSettings(port=0, rtp_timeout_s=1.0)) as (server, _):
        async with SipPeer(server.sip.agent.address[1]) as peer:
            await call(peer)
            bye = await peer.request_from_server("BYE", timeout=5)
            assert bye.method == "BYE"
            await until(lambda: not server.calls)


async def test_thousands_of_malformed_sip_and_rtp_messages_harm_no_call(monkeypatch):
    monkeypatch.setattr(sip_agent, "TIMEOUT_S", 2.0)
    rng = random.Random(7)
    async with fake_server(Limits(max_calls=2), reply="Paris.", heard="What?", sip=SIP) as (server, engine):
        async with SipPeer(server.sip.agent.address[1]) as peer:
            call_id, ok, port = await call(peer)
            valid = peer.invite()
            for n in range(3000):
                data = bytearray(valid)
                for _ in range(rng.randint(1, 8)):
                    data[rng.randrange(len(data))] = rng.randrange(256)
                if n % 3 == 0:
                    data = data[: rng.randrange(len(data))]
                peer.send(bytes(data))
                peer.send_rtp(
                    port, RtpPacket(rng.randrange(128), rng.randrange(65536), 0, 1, bytes(rng.randrange(200)))
                )
                peer.rtp.transport.sendto(bytes(rng.randrange(40)), ("127.0.0.1", port))
                if n % 200 == 0:
                    await asyncio.sleep(0.01)
            await asyncio.sleep(0.5)
            assert server.sip.agent.malformed > 0
            # the call goes on: the caller (a new SSRC, far from the forged numbers) is still heard and answered
            requests = len(engine.requests)
            spoken = await speak(peer, port, np.concatenate([VOICE, np.zeros(8000, np.float32)]), first=40000) - 40000
            await until(lambda: len(engine.requests) > requests)
            assert call_id in {c.call_id for c in server.sip.agent.calls.values()}
            agent = server.sip.agent  # the refused INVITEs' transactions run out (2 s here), and nothing is left
            await until(lambda: len(agent._tasks) <= 4 and not agent._pending and not agent._unacked, 20)
            peer.send(peer.request("BYE", call_id=call_id, to_tag=ok.to_address.parameters["tag"]))
            await until(lambda: not server.calls)
        packets = {outcome: float(value) for outcome, value in re.findall(
            r'voicepipe_phone_packets_total{outcome="(\w+)",provider="sip"} (\S+)',
            generate_latest(server.runtime.registry).decode())}
        assert packets["received"] >= spoken - 2 and packets["late"] < spoken / 10, (packets, spoken)


class PbxRegistrar(asyncio.DatagramProtocol):
    """A PBX's registrar: challenges each REGISTER, takes it with the right password, keeps the bindings."""

    def __init__(self) -> None:
        from voicepipe.sip.digest import DigestRealm

        self.realm = DigestRealm("bot", "s3cret", realm="pbx")
        self.bindings: list[tuple[str, str]] = []  # (contact, expires) taken
        self.refused = 0

    def connection_made(self, transport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: tuple) -> None:
        from voicepipe.sip.messages import response

        req = Message.parse(data)
        if req.authorization is None:
            answer = response(req, 401, "r1", extra={"WWW-Authenticate": str(self.realm.challenge())})
        elif self.realm.check("REGISTER", req.authorization):
            self.bindings.append((req.headers.get("Contact"), req.headers.get("Expires")))
            answer = response(req, 200, "r1", extra={"Expires": "60"})
        else:
            self.refused += 1
            answer = response(req, 403, "r1")
        self.transport.sendto(bytes(answer), addr)


async def test_the_agent_registers_with_a_pbx_answering_its_challenge_and_unregisters_when_it_stops():
    from voicepipe.sip.register import Registration

    registrar = PbxRegistrar()
    transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
        lambda: registrar, local_addr=("127.0.0.1", 0))
    port = transport.get_extra_info("sockname")[1]
    try:
        settings = SipSettings(port=0, register=Registration.parse(f"sip:bot:s3cret@127.0.0.1:{port}"))
        async with fake_server(Limits(), sip=settings) as (server, _):
            await until(lambda: registrar.bindings)
            contact, expires = registrar.bindings[0]
            assert f"sip:bot@127.0.0.1:{server.sip.agent.address[1]}" in contact and expires == "300"
            assert server.sip.agent.registrar.registered
        assert registrar.bindings[-1][1] == "0"  # the binding removed as the server stopped
        wrong = SipSettings(port=0, register=Registration.parse(f"sip:bot:guess@127.0.0.1:{port}"))
        async with fake_server(Limits(), sip=wrong) as (server, _):
            await until(lambda: registrar.refused)
            await asyncio.sleep(0.1)
            assert not server.sip.agent.registrar.registered
    finally:
        transport.close()


async def test_a_burst_of_lost_packets_leaves_the_call_going_and_is_counted():
    rng = random.Random(3)
    async with fake_server(Limits(), reply="Paris.", heard="What?", sip=SIP) as (server, engine):
        async with SipPeer(server.sip.agent.address[1]) as peer:
            call_id, ok, port = await call(peer)
            coded = PCMU.encode(to_pcm16(np.concatenate([VOICE, np.zeros(8000, np.float32)])))
            t0 = time.monotonic()
            lost = 0
            for n, i in enumerate(range(0, len(coded), 160)):
                await asyncio.sleep(max(0.0, t0 + n * 0.02 - time.monotonic()))
                if n < 100 and rng.random() < 0.2:  # the first two seconds: a fifth of the packets lost
                    lost += 1
                    continue
                peer.send_rtp(port, RtpPacket(0, n, 160 * n, 99, coded[i:i + 160]))
            await until(lambda: engine.requests)
            peer.send(peer.request("BYE", call_id=call_id, to_tag=ok.to_address.parameters["tag"]))
            await until(lambda: not server.calls)
        metrics = generate_latest(server.runtime.registry).decode()
        assert f'voicepipe_phone_packets_total{{outcome="lost",provider="sip"}} {float(lost)}' in metrics
        assert lost > 10


async def test_an_invite_flood_takes_max_calls_refuses_the_rest_and_leaks_no_port():
    async with fake_server(Limits(max_calls=3), sip=SIP) as (server, _):
        async with SipPeer(server.sip.agent.address[1]) as peer:
            invites = {f"flood-{n}": peer.invite(call_id=f"flood-{n}") for n in range(100)}
            for data in invites.values():
                peer.send(data)
            answers = {call_id: await peer.answer(call_id) for call_id in invites}
            codes = [a.code for a in answers.values()]
            assert codes.count(200) == 3 and set(codes) <= {200, 486, 503}
            calls = list(server.sip.agent.calls.values())
            for call_id, answer in answers.items():
                if answer.code == 200:
                    peer.ack(answer, invites[call_id])
                    peer.send(peer.request("BYE", call_id=call_id, to_tag=answer.to_address.parameters["tag"]))
            await until(lambda: not server.sip.agent.calls and not server.calls)
            assert all(call.rtp.transport.is_closing() for call in calls)


async def test_rtp_from_an_unexpected_address_is_dropped():
    async with fake_server(Limits(), heard="Hello?", sip=SIP) as (server, engine):
        async with SipPeer(server.sip.agent.address[1]) as peer:
            _, _, port = await call(peer)
            rtp = next(iter(server.sip.agent.calls.values())).rtp
            loop = asyncio.get_running_loop()
            elsewhere, _ = await loop.create_datagram_endpoint(asyncio.DatagramProtocol, local_addr=("127.0.0.2", 0))
            same_host, _ = await loop.create_datagram_endpoint(asyncio.DatagramProtocol, local_addr=("127.0.0.1", 0))
            try:
                coded = PCMU.encode(to_pcm16(VOICE))
                for n, i in enumerate(range(0, len(coded), 160)):  # another host: never the caller's
                    elsewhere.sendto(bytes(RtpPacket(0, n, 160 * n, 7, coded[i:i + 160])), ("127.0.0.1", port))
                await speak(peer, port, np.zeros(800, np.float32))  # the caller, from the port it offered ...
                for n, i in enumerate(range(0, len(coded), 160)):  # ... so no other port of its host is taken
                    same_host.sendto(bytes(RtpPacket(0, n, 160 * n, 7, coded[i:i + 160])), ("127.0.0.1", port))
                await asyncio.sleep(1.0)
                assert rtp.stray == 2 * (len(coded) // 160 + (len(coded) % 160 > 0))
                assert not engine.requests  # the speech was never heard
            finally:
                elsewhere.close()
                same_host.close()
