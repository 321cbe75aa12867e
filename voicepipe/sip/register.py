"""Registration with a PBX or a SIP trunk (RFC 3261 section 10): this user agent tells the registrar where
calls for its address of record go, answers the registrar's digest challenge, refreshes the binding before
it expires, and removes it when the server stops."""

import asyncio
import logging
import secrets
from collections.abc import Callable, Coroutine
from dataclasses import dataclass

from sipmessage import URI, Address, Request, Response

from voicepipe.sip.digest import authorization
from voicepipe.sip.messages import new_tag, request

log = logging.getLogger(__name__)
RETRY_S = 30.0  # after a failed registration
# sends a request to an address and waits for its final answer (None: none came)
Transact = Callable[[Request, tuple], Coroutine[None, None, Response | None]]


@dataclass(frozen=True)
class Registration:
    """`sip:USER:PASSWORD@HOST[:PORT]`: the account at the registrar, and the registrar itself."""

    user: str
    password: str
    host: str
    port: int = 5060
    expires: int = 300

    @staticmethod
    def parse(text: str) -> "Registration":
        uri = URI.parse(text if text.startswith("sip:") else f"sip:{text}")
        if not uri.user or not uri.password:
            raise ValueError(f"a registration needs a user and a password: sip:USER:PASSWORD@HOST, got {text!r}")
        return Registration(uri.user, uri.password, uri.host, uri.port or 5060)

    @property
    def aor(self) -> Address:
        return Address(URI("sip", self.host, user=self.user))


class Registrar:
    """Keeps one registration alive; `registered` tells whether the last attempt succeeded."""

    def __init__(self, registration: Registration, contact: Address, local: tuple[str, int],
                 transact: Transact) -> None:
        self.registration, self.contact, self.local, self.transact = registration, contact, local, transact
        self.call_id, self.tag, self.cseq = secrets.token_hex(8), new_tag(), 0
        self.registered = False

    async def run(self) -> None:
        """Register, then refresh the binding until cancelled."""
        while True:
            expires = await self.register(self.registration.expires)
            await asyncio.sleep(max(30.0, 0.8 * expires) if expires else RETRY_S)

    async def register(self, expires: int) -> int:
        """One registration (or, with `expires` 0, its removal): the binding's life granted (0: failed)."""
        reg = self.registration
        loop = asyncio.get_running_loop()
        try:
            info = await loop.getaddrinfo(reg.host, reg.port, type=2)  # SOCK_DGRAM
        except OSError as e:
            log.warning("SIP registration with %s failed: %s", reg.host, e)
            self.registered = False
            return 0
        where = info[0][4][:2]
        answer = await self.transact(self._request(expires), where)
        if answer is not None and answer.code in (401, 407):
            challenge = answer.www_authenticate if answer.code == 401 else answer.proxy_authenticate
            header = "Authorization" if answer.code == 401 else "Proxy-Authorization"
            if challenge is not None:
                proof = authorization(challenge, reg.user, reg.password, "REGISTER", f"sip:{reg.host}")
                answer = await self.transact(self._request(expires, {header: str(proof)}), where)
        self.registered = answer is not None and 200 <= answer.code < 300 and expires > 0
        if not self.registered:
            if expires:
                log.warning("SIP registration of %s with %s failed: %s", reg.user, reg.host,
                            f"{answer.code} {answer.phrase}" if answer is not None else "no answer")
            return 0
        granted = answer.expires if answer.expires is not None else expires
        log.info("SIP: registered as %s at %s for %d s", reg.user, reg.host, granted)
        return granted

    def _request(self, expires: int, extra: dict[str, str] | None = None) -> Request:
        self.cseq += 1
        aor = self.registration.aor
        return request("REGISTER", URI("sip", self.registration.host, port=self.registration.port), *self.local,
                       Address(aor.uri, parameters=aor.parameters.replace(tag=self.tag)), aor, self.call_id,
                       self.cseq, contact=self.contact, extra={"Expires": str(expires), **(extra or {})})
