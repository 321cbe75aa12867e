"""One call's RTP stream: a UDP port of its own, the caller's packets in (put in order, keys pressed read
from RFC 4733 events) and the reply out, one 20 ms packet at a time on the call's clock.

Packets are taken only from the address the caller's SDP named (or its host, once it has sent from another
port behind a NAT: symmetric RTP), and only as far as they are the caller's stream (`RtpSource`); anything
else arriving on the port is counted and dropped. While nothing is being said the stream carries silence,
as phones and PBXs expect of a live call (Asterisk hangs up a call whose RTP stops, where so configured).
"""

import asyncio
import logging
import random
from collections.abc import Callable

from voicepipe.sip.jitter import JitterBuffer
from voicepipe.sip.rtp_packet import DIGITS, RtpPacket, TelephoneEvent
from voicepipe.sip.rtp_source import RtpSource

log = logging.getLogger(__name__)
PACKET_S = 0.02
SAMPLES = 160  # 20 ms at 8 kHz
MAX_QUEUED = 8000 * 120  # two minutes of reply at most waits to be sent
DIGIT_S, DIGIT_GAP_S = 0.1, 0.06
COMFORT_NOISE = 13  # a key sent by this side: its tone, and the pause after it


class RtpStream(asyncio.DatagramProtocol):
    """`on_packet(sequence, timestamp, payload)` gets the call's audio payloads in order (extended sequence
    numbers, so a gap is a loss and a smaller one late); `on_digit(key)` each key the caller pressed."""

    def __init__(self, remote: tuple[str, int], payload_type: int, event_type: int | None, silence: bytes,
                 on_packet: Callable[[int, int, bytes], None], on_digit: Callable[[str], None]) -> None:
        self.remote, self.payload_type, self.event_type, self.silence = remote, payload_type, event_type, silence
        self.on_packet, self.on_digit = on_packet, on_digit
        self.transport: asyncio.DatagramTransport | None = None
        self.ssrc = random.getrandbits(32)
        self._sequence, self._timestamp = random.getrandbits(16), random.getrandbits(32)
        self._out = bytearray()  # the reply's coded audio not yet sent
        self._digits: list[str] = []
        self.held = False  # the caller has put the call on hold: nothing is sent
        self._buffer: JitterBuffer[RtpPacket] = JitterBuffer()
        self._source = RtpSource()  # which packets are the caller's stream, on one count
        self._event: int | None = None  # the timestamp of the key last reported
        self._others = 0  # packets in the sequence that were not audio
        self._latched = False
        self.stray = 0  # packets from elsewhere, or not RTP
        self.last_heard = 0.0  # loop time of the caller's last packet
        self._sender: asyncio.Task | None = None

    @classmethod
    async def open(cls, local_host: str, ports: range | None, **kwargs) -> "RtpStream":
        """A stream on a free port of `ports` (any port when None), sending from `local_host`."""
        loop = asyncio.get_running_loop()
        for port in (random.sample(ports, len(ports)) if ports else [0]):
            try:
                _, stream = await loop.create_datagram_endpoint(lambda: cls(**kwargs), local_addr=(local_host, port))
                return stream
            except OSError:
                continue
        raise OSError(f"no free RTP port in {ports.start}-{ports.stop - 1}" if ports else "no free RTP port")

    @property
    def port(self) -> int:
        assert self.transport is not None
        return self.transport.get_extra_info("sockname")[1]

    # -- asyncio ---------------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.last_heard = asyncio.get_running_loop().time()
        self._sender = asyncio.get_running_loop().create_task(self._send_loop())

    def datagram_received(self, data: bytes, addr: tuple) -> None:
        if not self._from_caller(addr):
            self.stray += 1
            return
        try:
            packet = RtpPacket.parse(data)
        except ValueError:
            self.stray += 1
            return
        now = asyncio.get_running_loop().time()
        self.last_heard = now
        if packet.payload_type not in (self.payload_type, self.event_type, COMFORT_NOISE):
            return
        sequence = self._source.number(packet.ssrc, packet.sequence)
        if sequence is None:
            self.stray += 1
            return
        self._release(self._buffer.push(sequence, packet, now))

    def close(self) -> None:
        if self._sender is not None:
            self._sender.cancel()
        if self.transport is not None:
            self.transport.close()

    # -- what the call does ----------------------------------------------------------------------------------
    def retarget(self, remote: tuple[str, int], held: bool) -> None:
        """A re-INVITE moved the caller's media, or put the call on (or off) hold."""
        if remote[0] not in ("0.0.0.0", "::"):
            self.remote, self._latched = remote, False
        self.held = held
        if held:
            self._out.clear()

    def play(self, coded: bytes) -> None:
        """Queue the reply's coded audio; sent in real time, after what is already queued."""
        if not self.held:
            self._out += coded[:max(0, MAX_QUEUED - len(self._out))]

    def clear(self) -> None:
        """The caller barged in: what has not been sent never will be."""
        self._out.clear()

    @property
    def queued_s(self) -> float:
        return len(self._out) / 8000

    def send_digits(self, digits: str) -> None:
        """Keys for the far end to hear (RFC 4733 events, when the caller offered them)."""
        self._digits += [d for d in digits.upper() if d in DIGITS]

    # -- inside ----------------------------------------------------------------------------------------------
    def _from_caller(self, addr: tuple) -> bool:
        if addr[:2] == tuple(self.remote):
            self._latched = True  # the caller sends from where it said: no other port of its host is taken
            return True
        if not self._latched and addr[0] == self.remote[0]:  # behind a NAT: its port is the one it sends from
            self.remote, self._latched = (addr[0], addr[1]), True
            return True
        return False

    def _release(self, packets: list[tuple[int, RtpPacket]]) -> None:
        """Packets in order: audio to the call, numbered without the key and comfort-noise packets that
        share its sequence (RFC 4733), so only audio that never came counts as lost."""
        for number, packet in packets:
            if packet.payload_type == self.payload_type:
                self.on_packet(number - self._others, packet.timestamp, packet.payload)
                continue
            self._others += 1
            if packet.payload_type == self.event_type:
                self._key(packet)

    def _key(self, packet: RtpPacket) -> None:
        try:
            event = TelephoneEvent.parse(packet.payload)
        except ValueError:
            self.stray += 1
            return
        if packet.timestamp != self._event and event.digit is not None:  # each press once, not each packet of it
            self._event = packet.timestamp
            self.on_digit(event.digit)

    async def _send_loop(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            due += PACKET_S
            delay = due - loop.time()
            if delay < -0.2:  # the loop was held up: start the clock again rather than burst
                due = loop.time()
            await asyncio.sleep(max(0.0, delay))
            self._release(self._buffer.ready(loop.time()))  # a gap waited on long enough
            if self._digits and self.event_type is not None:
                await self._send_digit(self._digits.pop(0))
                due = loop.time()
                continue
            self._digits.clear()
            if self.held:
                self._timestamp += SAMPLES
                continue
            chunk = bytes(self._out[:SAMPLES])
            del self._out[:SAMPLES]
            self._emit(self.payload_type, chunk + self.silence * (SAMPLES - len(chunk)), SAMPLES)

    async def _send_digit(self, digit: str) -> None:
        """One key: event packets every 20 ms with one timestamp, the last three marked as its end."""
        event, steps = DIGITS.index(digit), round(DIGIT_S / PACKET_S)
        start = self._timestamp
        for step in range(1, steps + 4):
            end = step >= steps
            payload = bytes(TelephoneEvent(event, end, 10, min(step, steps) * SAMPLES))
            self._emit(self.event_type, payload, 0, marker=step == 1, timestamp=start)  # type: ignore[arg-type]
            if not end or step == steps:
                await asyncio.sleep(PACKET_S)
        self._timestamp = start + steps * SAMPLES
        for _ in range(round(DIGIT_GAP_S / PACKET_S)):
            self._emit(self.payload_type, self.silence * SAMPLES, SAMPLES)
            await asyncio.sleep(PACKET_S)

    def _emit(self, payload_type: int, payload: bytes, samples: int, marker: bool = False,
              timestamp: int | None = None) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        packet = RtpPacket(payload_type, self._sequence, self._timestamp if timestamp is None else timestamp,
                           self.ssrc, payload, marker)
        self._sequence = (self._sequence + 1) & 0xFFFF
        self._timestamp += samples
        self.transport.sendto(bytes(packet), self.remote)
