"""The SIP user agent that answers phone calls (RFC 3261 over UDP): it takes INVITEs from the addresses it
is told to trust (or from callers who pass a digest challenge), answers each with an SDP for G.711 and an
RTP port of its own, and keeps the transactions and dialogs a PBX expects: provisional and final answers
repeated until acknowledged, retransmitted requests answered again, CANCEL, BYE either way, re-INVITE for
hold, OPTIONS pings, DTMF as RFC 4733 events or SIP INFO.

What to do with a call is not its business: `decide` says whether one is taken (a refusal is a SIP status),
and `start` is handed each answered call.
"""

import asyncio
import contextlib
import ipaddress
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field

import numpy as np
from sipmessage import Message, Request, Response

from voicepipe.sip import sdp
from voicepipe.sip.dialog import SipCall
from voicepipe.sip.digest import DigestRealm
from voicepipe.sip.messages import ALLOW, branch, check, contact_uri, new_tag, response
from voicepipe.sip.register import Registrar, Registration
from voicepipe.sip.rtp import RtpStream

log = logging.getLogger(__name__)
T1, T2, TIMEOUT_S = 0.5, 4.0, 32.0  # RFC 3261's timers: first retransmission, its cap, a transaction's life
CLOSE_GRACE_S = 1.0  # how long a closing agent waits for its BYEs' answers
REMEMBERED = 4096  # answers kept for retransmitted requests
DTMF_INFO = re.compile(r"signal\s*=\s*([0-9*#a-dA-D])", re.IGNORECASE)
Refusal = tuple[int, str] | None  # a SIP status and why, or None to answer


@dataclass(frozen=True)
class SipSettings:
    host: str = "127.0.0.1"
    port: int = 5060
    advertise: str | None = None  # the address put in Contact and SDP when `host` is a wildcard
    rtp_ports: range | None = None  # None: any free port
    allow: tuple[str, ...] = ("127.0.0.0/8", "::1/128")  # sources whose calls need no password
    user: str | None = None  # with `password`: callers from elsewhere are challenged for them
    password: str | None = None
    max_call_s: float = 3600.0
    rtp_timeout_s: float = 30.0
    max_pending: int = 32  # INVITEs being decided at once; more get 503
    register: Registration | None = None  # a PBX or trunk to register with
    networks: tuple = field(init=False, repr=False, default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "networks", tuple(ipaddress.ip_network(n, strict=False) for n in self.allow))


class SipAgent(asyncio.DatagramProtocol):
    def __init__(self, settings: SipSettings, decide: Callable[[SipCall], Awaitable[Refusal]],
                 start: Callable[[SipCall], None]) -> None:
        self.settings, self.decide, self.start = settings, decide, start
        self.realm = DigestRealm(settings.user, settings.password) if settings.user and settings.password else None
        self.transport: asyncio.DatagramTransport | None = None
        self.calls: dict[tuple[str, str], SipCall] = {}
        self.malformed = 0
        self._answers: OrderedDict[tuple[str, str], tuple[bytes, tuple, float]] = OrderedDict()
        self._pending: dict[str, tuple[asyncio.Task, Request, tuple]] = {}  # INVITE branch -> its work
        self._unacked: dict[str, asyncio.Event] = {}  # INVITE branch -> set by the ACK of a final refusal
        self._client: dict[str, asyncio.Future[Response]] = {}  # our requests' branches
        self.registrar: Registrar | None = None
        self._tasks: set[asyncio.Task] = set()
        self._requests: set[asyncio.Task] = set()  # requests of ours in flight (BYE, REFER)

    # -- lifecycle -------------------------------------------------------------------------------------------
    async def listen(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.create_datagram_endpoint(lambda: self, local_addr=(self.settings.host, self.settings.port))
        if self.settings.register is not None:
            contact = contact_uri(*self.address, user=self.settings.register.user)
            self.registrar = Registrar(self.settings.register, contact, self.address, self._transact)
            self._spawn(self.registrar.run())

    @property
    def address(self) -> tuple[str, int]:
        assert self.transport is not None
        host, port = self.transport.get_extra_info("sockname")[:2]
        return self.settings.advertise or host, port

    async def close(self) -> None:
        """Hang up every call (their BYEs given a moment to be answered), unregister, then stop listening."""
        for call in list(self.calls.values()):
            await call.hang_up("server shutting down")
        if self.registrar is not None and self.registrar.registered:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.registrar.register(0), CLOSE_GRACE_S)
        if self._requests:
            await asyncio.wait(self._requests, timeout=CLOSE_GRACE_S)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.transport is not None:
            self.transport.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    # -- in --------------------------------------------------------------------------------------------------
    def datagram_received(self, data: bytes, addr: tuple) -> None:
        if not data.strip():
            return  # a keep-alive (RFC 5626's CRLF)
        try:
            message = Message.parse(data)
            if isinstance(message, Request):
                check(message)
        except (ValueError, IndexError, KeyError) as e:
            self.malformed += 1
            self._refuse_malformed(data, addr, str(e))
            return
        if isinstance(message, Response):
            waiter = self._client.get(branch(message)) if message.headers.get("Via") else None
            if waiter is not None and not waiter.done() and message.code >= 200:
                waiter.set_result(message)
            return
        self._request(message, addr)

    def _request(self, req: Request, addr: tuple) -> None:
        key = (branch(req), req.method)
        if req.method != "ACK" and key in self._answers:  # a retransmission: the same answer again
            data, _, _ = self._answers[key]
            self._send_raw(data, addr)
            return
        to_tag = req.to_address.parameters.get("tag")
        call = self.calls.get((req.call_id, to_tag or ""))
        method = req.method
        if method == "ACK":
            waiter = self._unacked.pop(key[0], None)
            if waiter is not None:
                waiter.set()
            elif call is not None:
                call.acked.set()
        elif method == "INVITE" and not to_tag:
            if key[0] in self._pending:
                return
            if len(self._pending) >= self.settings.max_pending:
                self._final(req, addr, 503, "too many calls being set up", {"Retry-After": "5"})
                return
            task = self._spawn(self._invite(req, addr))
            self._pending[key[0]] = (task, req, addr)
            task.add_done_callback(lambda _: self._pending.pop(key[0], None))
        elif method == "CANCEL":
            self._cancel(req, addr)
        elif method == "OPTIONS":
            self._answer(req, addr, response(req, 200, new_tag(), extra={"Allow": ALLOW, "Accept": "application/sdp"}))
        elif to_tag and call is None:
            self._answer(req, addr, response(req, 481))
        elif call is not None and method == "BYE":
            self._answer(req, addr, response(req, 200))
            call.end("the caller hung up")
        elif call is not None and method == "INVITE":
            self._reinvite(call, req, addr)
        elif call is not None and method == "INFO":
            self._info(call, req, addr)
        elif call is not None and method == "NOTIFY":  # a transfer's progress (RFC 3515): noted, nothing to do
            self._answer(req, addr, response(req, 200))
        else:
            self._answer(req, addr, response(req, 405, new_tag(), extra={"Allow": ALLOW}))

    async def _invite(self, req: Request, addr: tuple) -> None:
        self._answer(req, addr, response(req, 100))
        if not self._trusted(addr[0]):
            if self.realm is None:
                self._final(req, addr, 403, "calls are taken only from the addresses allowed")
                return
            if not self.realm.check("INVITE", req.authorization):
                self._final(req, addr, 401, "", {"WWW-Authenticate": str(self.realm.challenge())})
                return
        if not req.body.strip():
            self._final(req, addr, 488, "an SDP offer is needed in the INVITE")
            return
        try:
            offer = sdp.parse(req.body)
        except sdp.SdpError as e:
            self._final(req, addr, 488 if not e.acceptable else 400, str(e))
            return
        call = SipCall(req, addr, offer, new_tag(), contact_uri(*self.address),
                       self._outgoing, self._gone)
        try:
            refusal = await self.decide(call)
        except asyncio.CancelledError:
            call.end("cancelled")
            raise
        if refusal is not None:
            self._final(req, addr, *refusal, to_tag=call.local_tag)
            return
        try:
            rtp = await RtpStream.open(
                self.address[0] if self.settings.host in ("0.0.0.0", "::") else self.settings.host,
                self.settings.rtp_ports, remote=(offer.address, offer.port), payload_type=offer.payload_type,
                event_type=offer.event_type, silence=offer.codec.encode(np.zeros(1, np.int16)),
                on_packet=lambda *p: call.heard("audio", *p), on_digit=lambda d: call.heard("digit", d))
        except OSError as e:
            self._final(req, addr, 503, str(e), to_tag=call.local_tag)
            call.end("no RTP port")  # its place is given back
            return
        except asyncio.CancelledError:
            call.end("cancelled")
            raise
        rtp.retarget((offer.address, offer.port), offer.on_hold)
        body = sdp.answer(offer, self.address[0], rtp.port, int(time.time()), call.sdp_version)
        ok = response(req, 200, call.local_tag, body, "application/sdp",
                      {"Contact": str(call.contact), "Allow": ALLOW, "Supported": "replaces"})
        self.calls[call.key] = call
        call.answered(rtp, self.settings.max_call_s, self.settings.rtp_timeout_s)
        self._answer(req, addr, ok)
        self._spawn(self._until_acked(call, bytes(ok), addr))
        log.info("SIP call %s from %s answered (%s, RTP port %d)", call.call_id, call.caller,
                 offer.codec.coding, rtp.port)
        self.start(call)

    def _cancel(self, req: Request, addr: tuple) -> None:
        pending = self._pending.pop(branch(req), None)
        if pending is None:
            answered = (branch(req), "INVITE") in self._answers
            self._answer(req, addr, response(req, 200 if answered else 481))
            return
        task, invite, invite_addr = pending
        task.cancel()
        self._answer(req, addr, response(req, 200))
        self._final(invite, invite_addr, 487, "")

    def _reinvite(self, call: SipCall, req: Request, addr: tuple) -> None:
        try:
            offer = sdp.parse(req.body)
        except sdp.SdpError as e:
            self._answer(req, addr, response(req, 488, extra={"Warning": f'399 voicepipe "{e}"'}))
            return
        if offer.codec != call.offer.codec:
            self._answer(req, addr, response(req, 488, extra={"Warning": '399 voicepipe "the codec may not change"'}))
            return
        assert call.rtp is not None
        call.rtp.retarget((offer.address, offer.port), offer.on_hold)
        call.sdp_version += 1
        body = sdp.answer(offer, self.address[0], call.rtp.port, int(time.time()), call.sdp_version)
        ok = response(req, 200, body=body, content_type="application/sdp", extra={"Contact": str(call.contact)})
        self._answer(req, addr, ok)
        self._spawn(self._until_acked(call, bytes(ok), addr, hang_up=False))
        log.info("SIP call %s %s", call.call_id, "on hold" if offer.on_hold else "taken off hold")

    def _info(self, call: SipCall, req: Request, addr: tuple) -> None:
        kind = str(req.content_type or "").lower()
        text = req.body.decode("utf-8", "replace")
        digit = None
        if kind == "application/dtmf-relay":
            match = DTMF_INFO.search(text)
            digit = match.group(1).upper() if match else None
        elif kind == "application/dtmf" and text.strip()[:1].upper() in "0123456789*#ABCD":
            digit = text.strip()[:1].upper() or None
        if digit is None:
            self._answer(req, addr, response(req, 415, extra={"Accept": "application/dtmf-relay, application/dtmf"}))
            return
        self._answer(req, addr, response(req, 200))
        call.heard("digit", digit)

    # -- out -------------------------------------------------------------------------------------------------
    def _outgoing(self, req: Request, addr: tuple) -> asyncio.Task:
        task = self._spawn(self._transact(req, addr))
        self._requests.add(task)
        task.add_done_callback(self._requests.discard)
        return task

    async def _transact(self, req: Request, addr: tuple) -> Response | None:
        """Send a request of ours and wait for its final answer, repeating it as UDP needs (None: none came)."""
        key = branch(req)
        waiter = asyncio.get_running_loop().create_future()
        self._client[key] = waiter
        data, interval = bytes(req), T1
        try:
            async with asyncio.timeout(TIMEOUT_S):
                while True:
                    self._send_raw(data, addr)
                    done, _ = await asyncio.wait([waiter], timeout=interval)
                    if done:
                        return waiter.result()
                    interval = min(2 * interval, T2)
        except TimeoutError:
            return None
        finally:
            self._client.pop(key, None)

    async def _until_acked(self, call: SipCall, data: bytes, addr: tuple, hang_up: bool = True) -> None:
        """A 2xx to an INVITE is repeated until its ACK comes (RFC 3261 13.3.1.4); none: the call is dropped."""
        call.acked.clear()
        if not await self._repeat(data, addr, call.acked, lambda: call.ended is not None) and hang_up:
            await call.hang_up("no ACK for the answer")

    def _final(self, req: Request, addr: tuple, code: int, reason: str, extra: dict[str, str] | None = None,
               to_tag: str | None = None) -> None:
        """A refusal of an INVITE (repeated until its ACK comes), or of any other request."""
        headers = dict(extra or {})
        if reason:
            headers["Warning"] = '399 voicepipe "' + reason.replace('"', "'") + '"'
        answer = response(req, code, to_tag or new_tag(), extra=headers)
        self._answer(req, addr, answer)
        if req.method == "INVITE":
            acked = self._unacked[branch(req)] = asyncio.Event()  # before any ACK can come
            self._spawn(self._refused(bytes(answer), addr, acked, branch(req)))
        if code >= 400:
            log.info("SIP %s from %s refused: %d %s", req.method, addr[0], code, reason)

    async def _repeat(self, data: bytes, addr: tuple, acked: asyncio.Event,
                      gone: Callable[[], bool] = lambda: False) -> bool:
        """Send `data` again at RFC 3261's growing intervals until `acked` is set (True), or until a
        transaction's life has passed or `gone()` says no ACK is wanted any more (False)."""
        interval, start = T1, time.monotonic()
        while not gone():
            try:
                await asyncio.wait_for(acked.wait(), interval)
                return True
            except TimeoutError:
                if time.monotonic() - start > TIMEOUT_S:
                    return False
                self._send_raw(data, addr)
                interval = min(2 * interval, T2)
        return False

    async def _refused(self, data: bytes, addr: tuple, acked: asyncio.Event, key: str) -> None:
        """A refusal of an INVITE, repeated until the ACK of its transaction (`key`) comes."""
        try:
            await self._repeat(data, addr, acked)
        finally:
            self._unacked.pop(key, None)

    def _answer(self, req: Request, addr: tuple, answer: Response) -> None:
        data = bytes(answer)
        self._answers[(branch(req), req.method)] = (data, addr, time.monotonic())
        self._answers.move_to_end((branch(req), req.method))
        while len(self._answers) > REMEMBERED or (
                self._answers and time.monotonic() - next(iter(self._answers.values()))[2] > TIMEOUT_S):
            self._answers.popitem(last=False)
        self._send_raw(data, addr)

    def _send_raw(self, data: bytes, addr: tuple) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.sendto(data, addr)

    # -- inside ----------------------------------------------------------------------------------------------
    def _gone(self, call: SipCall) -> None:
        self.calls.pop(call.key, None)

    def _trusted(self, host: str) -> bool:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in network for network in self.settings.networks)

    def _refuse_malformed(self, data: bytes, addr: tuple, why: str) -> None:
        """A request this side cannot read gets 400 where its headers allow an answer at all (RFC 3261
        8.2.1); anything else is dropped."""
        head = data.split(b"\r\n\r\n", 1)[0].decode("utf-8", "replace").split("\r\n")
        if len(head[0].split(" ")) != 3 or not head[0].endswith("SIP/2.0") or head[0].startswith("ACK "):
            return
        lines = [line for line in head[1:] if ":" in line]
        kept = {k.strip().lower(): line for line in lines for k in [line.split(":", 1)[0]]}
        needed = ("via", "from", "to", "call-id", "cseq")
        if not all(name in kept for name in needed):
            return
        reply = "SIP/2.0 400 Bad Request\r\n" + "".join(kept[n] + "\r\n" for n in needed) + \
            f'Warning: 399 voicepipe "{why[:120]}"\r\nServer: voicepipe\r\nContent-Length: 0\r\n\r\n'
        self._send_raw(reply.encode("utf-8", "replace"), addr)

    def _spawn(self, work: Coroutine) -> asyncio.Task:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


