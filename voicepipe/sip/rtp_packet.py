"""RTP packets (RFC 3550) and RFC 4733's telephone events, as bytes on the wire and back."""

import struct
from dataclasses import dataclass

HEADER = struct.Struct("!BBHII")
EVENT = struct.Struct("!BBH")
DIGITS = "0123456789*#ABCD"


@dataclass(frozen=True, slots=True)
class RtpPacket:
    payload_type: int
    sequence: int
    timestamp: int
    ssrc: int
    payload: bytes
    marker: bool = False

    @staticmethod
    def parse(data: bytes) -> "RtpPacket":
        """ValueError for what is not an RTP version 2 packet (CSRCs, header extension and padding skipped)."""
        if len(data) < HEADER.size:
            raise ValueError("shorter than an RTP header")
        first, second, sequence, timestamp, ssrc = HEADER.unpack_from(data)
        if first >> 6 != 2:
            raise ValueError("not RTP version 2")
        start = HEADER.size + 4 * (first & 0x0F)
        if first & 0x10:  # a header extension: its length in 32-bit words follows its profile
            if len(data) < start + 4:
                raise ValueError("truncated header extension")
            start += 4 + 4 * struct.unpack_from("!H", data, start + 2)[0]
        end = len(data)
        if first & 0x20:
            end -= data[-1]
        if start > end:
            raise ValueError("truncated RTP packet")
        return RtpPacket(second & 0x7F, sequence, timestamp, ssrc, bytes(data[start:end]), bool(second & 0x80))

    def __bytes__(self) -> bytes:
        return HEADER.pack(0x80, (0x80 if self.marker else 0) | self.payload_type, self.sequence & 0xFFFF,
                           self.timestamp & 0xFFFFFFFF, self.ssrc) + self.payload


@dataclass(frozen=True, slots=True)
class TelephoneEvent:
    """One RFC 4733 event payload: a key (0-15), whether it has ended, its volume and duration so far."""

    event: int
    end: bool
    volume: int
    duration: int  # in timestamp units (8 kHz)

    @property
    def digit(self) -> str | None:
        return DIGITS[self.event] if self.event < len(DIGITS) else None

    @staticmethod
    def parse(payload: bytes) -> "TelephoneEvent":
        if len(payload) < EVENT.size:
            raise ValueError("shorter than a telephone event")
        event, flags, duration = EVENT.unpack_from(payload)
        return TelephoneEvent(event, bool(flags & 0x80), flags & 0x3F, duration)

    def __bytes__(self) -> bytes:
        return EVENT.pack(self.event, (0x80 if self.end else 0) | (self.volume & 0x3F), self.duration & 0xFFFF)


def sequence_unwrapped(last: int | None, sequence: int) -> int:
    """A 16-bit sequence number on the extended (never wrapping) count, taking the nearest to `last`."""
    if last is None:
        return sequence
    base = last - (last & 0xFFFF)
    candidates = (base - 0x10000 + sequence, base + sequence, base + 0x10000 + sequence)
    return min(candidates, key=lambda c: abs(c - last))
