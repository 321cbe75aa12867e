"""One phone call as SIP sees it (RFC 3261 section 12): the dialog made by an INVITE this side answered,
the call's RTP stream, and its timers (a longest call, and a caller whose RTP has stopped)."""

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from sipmessage import Address, Request, Response

from voicepipe.sip.messages import request as sip_request
from voicepipe.sip.rtp import RtpStream
from voicepipe.sip.sdp import Offer

log = logging.getLogger(__name__)
INBOX = 500  # ten seconds of the caller's packets at most wait for the call to read them
# sends a request of the dialog's; its final response (None: none came) is awaited only where needed
Send = Callable[[Request, tuple], "asyncio.Future[Response | None]"]


class SipCall:
    """What the call's session reads of the caller (`inbox`: ("audio", sequence, timestamp, payload),
    ("digit", key) and, last, ("ended", reason)) and does to the call (play, clear, hang up, transfer)."""

    def __init__(self, invite: Request, source: tuple, offer: Offer, local_tag: str, contact: Address,
                 send: Send, gone: Callable[["SipCall"], None]) -> None:
        self.invite, self.source, self.offer, self.contact = invite, source, offer, contact
        self._send, self._gone = send, gone
        self.call_id = invite.call_id
        self.public_id = ""  # the id the server's calls API knows it by
        self.local_tag = local_tag
        to = invite.to_address
        self.local = Address(to.uri, to.name, to.parameters.replace(tag=local_tag))
        self.remote = invite.from_address
        self.target = invite.contact[0].uri if invite.contact else self.remote.uri
        self.route = invite.record_route
        self.cseq = 0
        self.sdp_version = 0
        self.rtp: RtpStream | None = None
        self.inbox: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue(INBOX)
        self.dropped = 0  # packets the call was too slow to read
        self.acked = asyncio.Event()
        self.ended: str | None = None
        self._watch: asyncio.Task | None = None
        self._closing: asyncio.Task | None = None

    @property
    def key(self) -> tuple[str, str]:
        return self.call_id, self.local_tag

    @property
    def caller(self) -> str:
        return str(self.remote.uri)

    @property
    def callee(self) -> str:
        return str(self.local.uri)

    def headers(self) -> list[dict[str, str]]:
        """The INVITE's headers, as OpenAI's `realtime.call.incoming` lists them."""
        return [{"name": name, "value": value} for name in self.invite.headers.keys()
                for value in self.invite.headers.getlist(name)]

    # -- from the network ------------------------------------------------------------------------------------
    def heard(self, *item: Any) -> None:
        if self.ended is not None:
            return
        try:
            self.inbox.put_nowait(item)
        except asyncio.QueueFull:
            self.dropped += 1

    def answered(self, rtp: RtpStream, max_call_s: float, rtp_timeout_s: float) -> None:
        self.rtp = rtp
        self._watch = asyncio.get_running_loop().create_task(self._timers(max_call_s, rtp_timeout_s))

    def end(self, reason: str) -> None:
        """The call is over (BYE either way, a timer, the server closing): its media stops at once."""
        if self.ended is not None:
            return
        self.ended = reason
        self._gone(self)
        if self.rtp is not None:
            self.rtp.close()
        if self._watch is not None and self._watch is not asyncio.current_task():
            self._watch.cancel()
        while not self.inbox.empty():  # the call's session needs no more of its audio, only that it ended
            self.inbox.get_nowait()
        self.inbox.put_nowait(("ended", reason))
        log.info("SIP call %s ended: %s", self.call_id, reason)

    # -- from the server -------------------------------------------------------------------------------------
    async def hang_up(self, reason: str = "hung up by the server") -> None:
        """End the call with a BYE (sent on, and repeated, in the background: its answer changes nothing)."""
        if self.ended is not None:
            return
        self.end(reason)
        self._send(self._request("BYE"), self.source)

    async def transfer(self, target: str) -> int:
        """Ask the caller's side to call `target` instead (REFER, RFC 3515): the status it answered (0: none)."""
        answer = await self._send(self._request("REFER", extra={"Refer-To": f"<{target}>",
                                                                "Referred-By": str(self.local.uri)}), self.source)
        return answer.code if answer is not None else 0

    def _request(self, method: str, extra: dict[str, str] | None = None) -> Request:
        self.cseq += 1
        host, port = self.contact.uri.host.strip("[]"), self.contact.uri.port or 5060
        return sip_request(method, self.target, host, port, self.local, self.remote, self.call_id, self.cseq,
                           contact=self.contact, route=self.route, extra=extra)

    async def _timers(self, max_call_s: float, rtp_timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + max_call_s
        while self.ended is None:
            await asyncio.sleep(1.0)
            rtp = self.rtp
            if loop.time() >= end:
                reason = f"the call reached its longest ({max_call_s:g} s)"
            elif rtp is not None and not rtp.held and loop.time() - rtp.last_heard > rtp_timeout_s:
                reason = f"no RTP from the caller for {rtp_timeout_s:g} s"
            else:
                continue
            await self.hang_up(reason)
