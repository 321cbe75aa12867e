"""Phone calls over SIP, served as the websocket calls are: the user agent answers a call when the server
has room for it (a full server answers 486 Busy Here, a draining one or one whose engine is restarting
503) and the operator's application, where it has a webhook, accepts it; each answered call runs a
session of its own over a `SipLine`, with the settings it was accepted with."""

import asyncio
import logging

from voicepipe.server.call_control import PhoneCalls
from voicepipe.server.host import CallHost
from voicepipe.server.sip_line import SipLine
from voicepipe.sip.agent import Refusal, SipAgent, SipSettings
from voicepipe.sip.dialog import SipCall

log = logging.getLogger(__name__)
SIP_STATUS = {"too_many_calls": 486, "server_shutting_down": 503, "engine_unavailable": 503}


class SipCalls:
    def __init__(self, server: CallHost, settings: SipSettings, control: PhoneCalls | None = None) -> None:
        self.server = server
        self.control = control or PhoneCalls()
        self.agent = SipAgent(settings, self._decide, self._start)
        self._sessions: set[asyncio.Task] = set()
        self._admitted: set[SipCall] = set()  # taken, not yet answered: their places are held

    async def listen(self) -> None:
        await self.agent.listen()
        host, port = self.agent.address
        log.info("SIP: answering calls on %s:%d (UDP)", host, port)

    async def close(self) -> None:
        await self.agent.close()
        await asyncio.gather(*self._sessions, return_exceptions=True)

    async def _decide(self, call: SipCall) -> Refusal:
        self._admitted = {c for c in self._admitted if c.ended is None}
        refusal = self.server.refusal(pending=len(self._admitted))
        if refusal is not None:
            _, reason, message = refusal
            self.server.metrics.refused.labels(reason).inc()
            return SIP_STATUS.get(reason, 503), message
        self._admitted.add(call)  # its place is held while the application decides
        decision = await self.control.decide(call)
        if decision.status is not None:
            self._admitted.discard(call)
            return decision.status, "refused by the application"
        if decision.session is not None:
            self.control.sessions[call] = decision.session
        return None

    def _start(self, call: SipCall) -> None:
        line = SipLine(call, self.server.runtime, self.control.sessions.pop(call, None))
        self.control.started(call)
        task = asyncio.ensure_future(self._serve(call, line))
        self._sessions.add(task)
        task.add_done_callback(lambda _: (self._sessions.discard(task), self.control.ended(call)))

    async def _serve(self, call: SipCall, line: SipLine) -> None:
        # Its place stops being held in the same step as its session joins the server's calls.
        self._admitted.discard(call)
        await self.server.host(line, "sip", may_tune=False)
