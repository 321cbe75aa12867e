"""The parts of the SIP user agent on their own: SDP offers read and answered, RTP and RFC 4733 packets
both ways, the jitter buffer's order, and digest authentication against RFC 2617's worked example."""

import pytest
from sipmessage import AuthChallenge, AuthCredentials, AuthParameters

from voicepipe.sip import sdp
from voicepipe.sip.digest import DigestRealm, _response, authorization
from voicepipe.sip.jitter import JitterBuffer
from voicepipe.sip.rtp_packet import RtpPacket, TelephoneEvent, sequence_unwrapped
from voicepipe.sip.rtp_source import RtpSource
from voicepipe.wire_audio import PCMA

ASTERISK_OFFER = (b"v=0\r\no=- 1 2 IN IP4 192.0.2.10\r\ns=Asterisk\r\nc=IN IP4 192.0.2.10\r\nt=0 0\r\n"
                  b"m=audio 14000 RTP/AVP 8 0 3 101\r\na=rtpmap:8 PCMA/8000\r\na=rtpmap:0 PCMU/8000\r\n"
                  b"a=rtpmap:3 GSM/8000\r\na=rtpmap:101 telephone-event/8000\r\na=fmtp:101 0-16\r\na=ptime:20\r\n"
                  b"a=sendrecv\r\nm=video 15000 RTP/AVP 96\r\na=rtpmap:96 VP8/90000\r\n")


def test_an_offer_is_answered_in_its_first_g711_with_telephone_events_and_other_streams_refused():
    offer = sdp.parse(ASTERISK_OFFER)
    assert (offer.address, offer.port, offer.codec, offer.payload_type, offer.event_type) == \
        ("192.0.2.10", 14000, PCMA, 8, 101)
    assert not offer.on_hold
    answer = sdp.answer(offer, "127.0.0.1", 20000, 7, 0).decode()
    assert "m=audio 20000 RTP/AVP 8 101\r\n" in answer and "a=rtpmap:8 PCMA/8000" in answer
    assert "m=video 0 RTP/AVP 96" in answer  # one line per offered stream (RFC 3264), the video refused
    assert "a=sendrecv" in answer and answer.count("m=") == 2


@pytest.mark.parametrize("change, held", [(b"a=sendrecv", False), (b"a=sendonly", True), (b"a=inactive", True)])
def test_an_offer_that_only_sends_or_is_inactive_puts_the_call_on_hold(change, held):
    offer = sdp.parse(ASTERISK_OFFER.replace(b"a=sendrecv", change))
    assert offer.on_hold is held
    if held:
        assert {b"a=sendonly": "a=recvonly", b"a=inactive": "a=inactive"}[change] in \
            sdp.answer(offer, "127.0.0.1", 1, 1, 1).decode()
    assert sdp.parse(ASTERISK_OFFER.replace(b"c=IN IP4 192.0.2.10", b"c=IN IP4 0.0.0.0")).on_hold


@pytest.mark.parametrize("body, acceptable", [
    (ASTERISK_OFFER.replace(b"RTP/AVP 8 0 3 101", b"RTP/AVP 3 101"), False),  # GSM only: 488
    (ASTERISK_OFFER.replace(b"RTP/AVP 8 0", b"RTP/SAVP 8 0"), False),  # SRTP: 488
    (b"v=0\r\nm=video 1 RTP/AVP 96\r\n", False),  # no audio
    (b"v=0\r\nc=IN IP4 not-an-address\r\nm=audio 1 RTP/AVP 0\r\n", True),  # unreadable: 400
    (b"v=0\r\nm=audio 70000 RTP/AVP 0\r\n", True),
    (b"v=0\r\nm=audio 1 RTP/AVP 0\r\n", True),  # no connection address
    (b"\xff\xfe", True),
])
def test_an_offer_without_a_codec_spoken_here_or_that_cannot_be_read_is_refused(body, acceptable):
    with pytest.raises(sdp.SdpError) as refused:
        sdp.parse(body)
    assert refused.value.acceptable is acceptable


def test_rtp_packets_round_trip_and_csrcs_extensions_and_padding_are_skipped():
    packet = RtpPacket(0, 65535, 2**32 - 160, 0xDEADBEEF, b"\xff" * 160, marker=True)
    assert RtpPacket.parse(bytes(packet)) == packet
    raw = bytearray(bytes(packet))
    raw[0] |= 0x20 | 0x10 | 1  # padding, an extension, one CSRC
    dressed = bytes(raw[:12]) + b"\x00\x00\x00\x01" + b"\xbe\xde\x00\x01" + b"\x01\x02\x03\x04" + \
        bytes(raw[12:]) + b"\x00\x00\x03"
    assert RtpPacket.parse(dressed).payload == packet.payload
    for broken in (b"", b"\x80" * 11, b"\x40" + bytes(20), bytes([0x8F]) + bytes(13)):
        with pytest.raises(ValueError):
            RtpPacket.parse(broken)


def test_telephone_events_round_trip_and_name_their_key():
    event = TelephoneEvent(11, True, 10, 800)
    assert TelephoneEvent.parse(bytes(event)) == event and event.digit == "#"
    assert bytes(TelephoneEvent(5, False, 10, 160)).hex() == "050a00a0"  # RFC 4733 section 2.3's layout


def test_sequence_numbers_unwrap_past_65535_and_back():
    assert sequence_unwrapped(65535, 0) == 65536
    assert sequence_unwrapped(65536, 65534) == 65534  # a late one from before the wrap
    assert sequence_unwrapped(None, 7) == 7


def test_the_callers_stream_is_numbered_on_with_its_gaps_wraps_and_reorders():
    source = RtpSource()
    assert [source.number(5, s) for s in (65533, 65535, 65534, 0, 2)] == [65533, 65535, 65534, 65536, 65538]


def test_a_packet_far_from_the_stream_is_not_taken_and_a_new_ssrc_continues_the_count_once_confirmed():
    source = RtpSource()
    assert [source.number(5, s) for s in (100, 101)] == [100, 101]
    assert source.number(5, 40000) is None  # a forged jump: not taken on its own word
    assert source.number(9, 7) is None  # another SSRC: on probation
    assert source.number(5, 102) == 102  # the caller's stream goes on
    assert source.number(9, 70) is None and source.number(9, 71) == 103  # two in sequence: a restart, no jump
    assert source.number(5, 103) is None and source.number(9, 72) == 104 and source.restarts == 1
    assert source.number(9, 72 + 2999) == 104 + 2999  # a gap short of a minute is loss, not a restart


def test_the_jitter_buffer_puts_reordered_packets_back_in_order_and_gives_up_on_a_gap_after_its_hold():
    buffer: JitterBuffer[str] = JitterBuffer(hold_s=0.06)
    assert buffer.push(10, "a", 0.00) == [(10, "a")]
    assert buffer.push(12, "c", 0.02) == []  # 11 is missing: held
    assert buffer.push(11, "b", 0.03) == [(11, "b"), (12, "c")]
    assert buffer.push(14, "e", 0.04) == []
    assert buffer.ready(0.08) == []
    assert buffer.ready(0.11) == [(14, "e")]  # 13 given up on: downstream counts it lost
    assert buffer.push(13, "d", 0.12) == [(13, "d")]  # late: handed on at once, for downstream to drop


def test_digest_matches_rfc_2617s_worked_example():
    assert _response("Mufasa", "testrealm@host.com", "Circle Of Life", "GET", "/dir/index.html",
                     "dcd98b7102dd2f0e8b11d0f600bfb0c093", "00000001", "0a4f113b", "auth") == \
        "6629fae49393a05397450978507c4ef1"


def test_a_digest_challenge_is_passed_with_the_password_and_failed_without_it_or_with_a_forged_nonce():
    realm = DigestRealm("pbx", "s3cret")
    challenge = realm.challenge()
    good = authorization(challenge, "pbx", "s3cret", "INVITE", "sip:voicepipe@127.0.0.1")
    assert realm.check("INVITE", AuthCredentials.parse(str(good)))
    assert not realm.check("BYE", good)  # the method is in the hash
    assert not realm.check("INVITE", authorization(challenge, "pbx", "guess", "INVITE", "sip:voicepipe@127.0.0.1"))
    forged = AuthChallenge("Digest", AuthParameters(realm="voicepipe", nonce="1.0123456789abcdef01234567", qop="auth"))
    assert not realm.check("INVITE", authorization(forged, "pbx", "s3cret", "INVITE", "sip:voicepipe@127.0.0.1"))
    assert not realm.check("INVITE", None)
