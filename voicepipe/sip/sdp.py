"""SDP offer/answer (RFC 4566, RFC 3264) for a phone call's audio: G.711 at 8 kHz and RFC 4733's
`telephone-event`, over plain RTP.

Only what a call needs is read: the audio stream's address and port, its payload formats in the offerer's
order of preference, and its direction (a PBX puts a call on hold with `sendonly`, `inactive` or the address
0.0.0.0). The answer keeps one line per offered stream, as RFC 3264 requires, and refuses (port 0) every
stream but the first audio one.
"""

import ipaddress
from dataclasses import dataclass, field

from voicepipe.wire_audio import PCMA, PCMU, WireAudio

STATIC = {0: "PCMU", 8: "PCMA", 13: "CN"}  # RFC 3551's static payload types this side knows
CODECS = {"PCMU": PCMU, "PCMA": PCMA}
DIRECTIONS = ("sendrecv", "sendonly", "recvonly", "inactive")
ANSWER_DIRECTION = {"sendrecv": "sendrecv", "sendonly": "recvonly", "recvonly": "sendonly", "inactive": "inactive"}
MAX_SDP_BYTES = 8192


class SdpError(ValueError):
    """An offer this side cannot read, or one it can read but not accept (`acceptable` False: 488)."""

    def __init__(self, message: str, acceptable: bool = True) -> None:
        super().__init__(message)
        self.acceptable = acceptable


@dataclass
class Media:
    """One `m=` line of an offer."""

    kind: str
    port: int
    proto: str
    formats: list[int]
    address: str | None = None
    direction: str | None = None
    names: dict[int, str] = field(default_factory=dict)  # payload type -> encoding name (upper case)
    rates: dict[int, int] = field(default_factory=dict)


@dataclass
class Offer:
    """What the caller's offer asks of the audio stream."""

    address: str  # where to send RTP
    port: int
    payload_type: int  # the codec chosen: the first G.711 in the offer's order
    codec: WireAudio
    event_type: int | None  # RFC 4733's payload type, if offered
    direction: str  # as the offerer sees it
    streams: list[Media]

    @property
    def on_hold(self) -> bool:
        """The caller stops listening: nothing of the reply needs sending."""
        return self.direction in ("sendonly", "inactive") or self.address in ("0.0.0.0", "::")


def parse(body: bytes) -> Offer:
    """The audio stream an SDP offer asks for; SdpError if it cannot be read or has no codec spoken here."""
    if len(body) > MAX_SDP_BYTES:
        raise SdpError("the session description is too long")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SdpError("the session description is not UTF-8") from e
    address, direction, streams = None, None, []
    for raw in text.splitlines():
        line = raw.strip()
        if len(line) < 2 or line[1] != "=":
            continue
        key, value = line[0], line[2:]
        media = streams[-1] if streams else None
        if key == "m":
            streams.append(_media(value))
        elif key == "c":
            conn = _connection(value)
            if media is None:
                address = conn
            else:
                media.address = conn
        elif key == "a":
            name, _, rest = value.partition(":")
            if name in DIRECTIONS:
                if media is None:
                    direction = name
                else:
                    media.direction = name
            elif name == "rtpmap" and media is not None:
                _rtpmap(media, rest)
    audio = next((m for m in streams if m.kind == "audio" and m.port > 0), None)
    if audio is None:
        raise SdpError("the offer has no audio stream", acceptable=False)
    if audio.proto.upper() != "RTP/AVP":
        raise SdpError(f"only plain RTP (RTP/AVP) is spoken here, not {audio.proto}", acceptable=False)
    chosen = next((pt for pt in audio.formats if _name(audio, pt) in CODECS and audio.rates.get(pt, 8000) == 8000),
                  None)
    if chosen is None:
        raise SdpError("no codec in common: only PCMU and PCMA at 8000 Hz are spoken here", acceptable=False)
    where = audio.address or address
    if where is None:
        raise SdpError("the offer gives no connection address")
    event = next((pt for pt in audio.formats if _name(audio, pt) == "TELEPHONE-EVENT"), None)
    return Offer(where, audio.port, chosen, CODECS[_name(audio, chosen)], event,
                 audio.direction or direction or "sendrecv", streams)


def answer(offer: Offer, address: str, port: int, session_id: int, version: int) -> bytes:
    """This side's answer: the chosen codec (and telephone-event) at `address`:`port`."""
    family = "IP6" if ipaddress.ip_address(address).version == 6 else "IP4"
    lines = ["v=0", f"o=voicepipe {session_id} {version} IN {family} {address}", "s=voicepipe",
             f"c=IN {family} {address}", "t=0 0"]
    audio_done = False
    for media in offer.streams:
        if media.kind == "audio" and media.port > 0 and not audio_done:
            audio_done = True
            formats = [offer.payload_type] + ([offer.event_type] if offer.event_type is not None else [])
            lines.append(f"m=audio {port} RTP/AVP {' '.join(map(str, formats))}")
            lines.append(f"a=rtpmap:{offer.payload_type} {offer.codec.coding.upper()}/8000")
            if offer.event_type is not None:
                lines += [f"a=rtpmap:{offer.event_type} telephone-event/8000", f"a=fmtp:{offer.event_type} 0-16"]
            lines += ["a=ptime:20", f"a={ANSWER_DIRECTION[offer.direction]}"]
        else:
            lines.append(f"m={media.kind} 0 {media.proto} {' '.join(map(str, media.formats[:1] or [0]))}")
    return ("\r\n".join(lines) + "\r\n").encode()


def _media(value: str) -> Media:
    parts = value.split()
    if len(parts) < 4:
        raise SdpError(f"a malformed media line: m={value}")
    try:
        port = int(parts[1].split("/")[0])
        formats = [int(f) for f in parts[3:]] if parts[2].upper().startswith("RTP/") else []
    except ValueError as e:
        raise SdpError(f"a malformed media line: m={value}") from e
    if not 0 <= port <= 65535 or any(not 0 <= f <= 127 for f in formats):
        raise SdpError(f"a media line out of range: m={value}")
    return Media(parts[0].lower(), port, parts[2], formats)


def _connection(value: str) -> str:
    parts = value.split()
    if len(parts) < 3 or parts[0] != "IN" or parts[1] not in ("IP4", "IP6"):
        raise SdpError(f"a malformed connection line: c={value}")
    host = parts[2].split("/")[0]
    try:
        ipaddress.ip_address(host)
    except ValueError as e:
        raise SdpError(f"the connection address is not an IP address: {host}") from e
    return host


def _rtpmap(media: Media, value: str) -> None:
    number, _, encoding = value.partition(" ")
    name, _, rate = encoding.strip().partition("/")
    try:
        pt = int(number)
        media.names[pt] = name.upper()
        media.rates[pt] = int(rate.split("/")[0]) if rate else 8000
    except ValueError as e:
        raise SdpError(f"a malformed rtpmap: a=rtpmap:{value}") from e


def _name(media: Media, pt: int) -> str:
    return media.names.get(pt) or STATIC.get(pt, "")
