"""A bare SIP peer on loopback UDP for protocol tests: it sends requests written here (well formed or not)
and keeps every message the server sends back, with an RTP socket of its own for the call's audio. It
stands in for a PBX where a test needs messages no real user agent would send; the real one is baresip
(support/baresip.py)."""

import asyncio
import secrets
import time

from sipmessage import Message, Request, Response

from voicepipe.sip.rtp_packet import RtpPacket

OFFER = (
    "v=0\r\no=peer 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
    "m=audio {port} RTP/AVP {formats}\r\n{maps}a=sendrecv\r\n"
)
MAPS = {
    0: "a=rtpmap:0 PCMU/8000\r\n",
    8: "a=rtpmap:8 PCMA/8000\r\n",
    101: "a=rtpmap:101 telephone-event/8000\r\n",
    9: "a=rtpmap:9 G722/8000\r\n",
    111: "a=rtpmap:111 opus/48000/2\r\n",
}


class Inbox(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.received: list[tuple[bytes, tuple]] = []
        self.transport: asyncio.DatagramTransport | None = None
        self.arrived = asyncio.Event()

    def connection_made(self, transport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: tuple) -> None:
        self.received.append((data, addr))
        self.arrived.set()

    @property
    def port(self) -> int:
        return self.transport.get_extra_info("sockname")[1]


class SipPeer:
    def __init__(self, server_port: int) -> None:
        self.server = ("127.0.0.1", server_port)
        self.sip, self.rtp = Inbox(), Inbox()
        self.cseq = 0

    async def __aenter__(self) -> "SipPeer":
        loop = asyncio.get_running_loop()
        await loop.create_datagram_endpoint(lambda: self.sip, local_addr=("127.0.0.1", 0))
        await loop.create_datagram_endpoint(lambda: self.rtp, local_addr=("127.0.0.1", 0))
        return self

    async def __aexit__(self, *_) -> None:
        self.sip.transport.close()
        self.rtp.transport.close()

    def offer(self, formats: tuple[int, ...] = (0, 8, 101)) -> bytes:
        maps = "".join(MAPS.get(f, "") for f in formats)
        return OFFER.format(port=self.rtp.port, formats=" ".join(map(str, formats)), maps=maps).encode()

    def invite(
        self,
        body: bytes | None = None,
        call_id: str | None = None,
        branch: str | None = None,
        extra: str = "",
        to_tag: str = "",
        cseq: int | None = None,
    ) -> bytes:
        body = self.offer() if body is None else body
        return self.request("INVITE", body, call_id, branch, extra + "Content-Type: application/sdp\r\n", to_tag, cseq)

    def request(
        self,
        method: str,
        body: bytes = b"",
        call_id: str | None = None,
        branch: str | None = None,
        extra: str = "",
        to_tag: str = "",
        cseq: int | None = None,
    ) -> bytes:
        if cseq is None:
            self.cseq += 1
        to = "<sip:voicepipe@127.0.0.1>" + (f";tag={to_tag}" if to_tag else "")
        head = (
            f"{method} sip:voicepipe@127.0.0.1:{self.server[1]} SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP 127.0.0.1:{self.sip.port};branch={branch or 'z9hG4bK' + secrets.token_hex(6)};rport\r\n"
            f"Max-Forwards: 70\r\nFrom: <sip:caller@127.0.0.1>;tag=peer1\r\nTo: {to}\r\n"
            f"Call-ID: {call_id or secrets.token_hex(8)}\r\nCSeq: {cseq or self.cseq} {method}\r\n"
            f"Contact: <sip:caller@127.0.0.1:{self.sip.port}>\r\n{extra}Content-Length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body

    def send(self, data: bytes) -> None:
        self.sip.transport.sendto(data, self.server)

    def ack(self, answer: Response, invite: bytes) -> None:
        """The ACK of a final answer: in the INVITE's transaction for a refusal, a new one for a 2xx."""
        sent = Message.parse(invite)
        branch = sent.via[0].parameters["branch"] if answer.code >= 300 else None
        to_tag = answer.to_address.parameters.get("tag") or ""
        self.send(self.request("ACK", call_id=sent.call_id, branch=branch, to_tag=to_tag, cseq=sent.cseq.sequence))

    def messages(self) -> list[Request | Response]:
        return [Message.parse(data) for data, _ in self.sip.received]

    async def answer(
        self, call_id: str, method: str = "INVITE", final: bool = True, timeout: float = 5, cseq: int | None = None
    ) -> Response:
        """The server's first answer (a final one, with `final`) to our `method` of call `call_id` (and `cseq`)."""
        end = time.monotonic() + timeout
        seen = 0
        while True:
            for message in self.messages()[seen:]:
                seen += 1
                number, _, named = (message.headers.get("CSeq") or "").partition(" ")
                if (
                    isinstance(message, Response)
                    and message.call_id == call_id
                    and named.strip() == method
                    and (message.code >= 200 or not final)
                    and cseq in (None, int(number) if number.isdigit() else None)
                ):
                    return message
            self.sip.arrived.clear()
            await asyncio.wait_for(self.sip.arrived.wait(), max(0.01, end - time.monotonic()))

    async def request_from_server(self, method: str, timeout: float = 5) -> Request:
        end = time.monotonic() + timeout
        while True:
            for message in self.messages():
                if isinstance(message, Request) and message.method == method:
                    return message
            self.sip.arrived.clear()
            await asyncio.wait_for(self.sip.arrived.wait(), max(0.01, end - time.monotonic()))

    def rtp_packets(self) -> list[RtpPacket]:
        return [RtpPacket.parse(data) for data, _ in self.rtp.received]

    def send_rtp(self, port: int, packet: RtpPacket) -> None:
        self.rtp.transport.sendto(bytes(packet), ("127.0.0.1", port))
