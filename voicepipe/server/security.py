"""Who may use the server: the Host a request names, the Origin a browser sends, and the API key.

A server on 127.0.0.1 is still reachable from every web page the user opens: such a page can open a
websocket to it (browsers send its Origin, which is checked here), or reach it under a name of its own
that resolves to 127.0.0.1 (DNS rebinding: the Host header then carries that name, which a loopback
server refuses). The API key, when set, is required of every API request and call.
"""

import base64
import binascii
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from voicepipe.server.listen import is_loopback

# Browsers cannot set headers on a websocket; the Realtime API's convention is a subprotocol holding it.
KEY_SUBPROTOCOL = "openai-insecure-api-key."


@dataclass(frozen=True, slots=True)
class Access:
    """What the checks decided about one request."""

    allowed: bool
    status: int = 200  # 401 (no or wrong key) or 403 (foreign origin or host) when refused
    reason: str = ""
    may_tune: bool = False  # may turn the engine's knobs, shared by every call


@dataclass(frozen=True, slots=True)
class Security:
    api_key: str | None = None
    allow_origins: frozenset[str] = frozenset()  # other origins allowed to open calls ("*": any)
    loopback_only: bool = True  # bound to a loopback address: only loopback names are valid hosts

    def check(self, headers: Mapping[str, str], query: str = "", websocket: bool = False) -> Access:
        """Decide on a request from its headers (lower-case names) and query string."""
        host = headers.get("host", "")
        if self.loopback_only and not is_loopback(_hostname(host)):
            return Access(False, 403, f"host {host!r} is not a name of this machine")
        origin = headers.get("origin")
        same_origin = origin is not None and _authority(origin) == host.lower()
        if websocket and origin is not None and not same_origin and not self._listed(origin):
            return Access(False, 403, f"origin {origin!r} may not open calls here (see --allow-origin)")
        keyed = self._key_given(headers, query if websocket else "")
        if self.api_key is not None and not keyed:
            return Access(False, 401, "a valid API key is required (Authorization: Bearer KEY)")
        # Knobs: with the key, from the server's own page, or from a local program when there is no key.
        may_tune = keyed or same_origin or (origin is None and self.api_key is None)
        return Access(True, may_tune=may_tune)

    def _listed(self, origin: str) -> bool:
        return "*" in self.allow_origins or origin.rstrip("/") in self.allow_origins

    def _key_given(self, headers: Mapping[str, str], query: str) -> bool:
        if self.api_key is None:
            return False
        offered = []
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            offered.append(token.strip())
        elif scheme.lower() == "basic":  # the key as the password: how a Twilio webhook URL carries it
            try:
                offered.append(base64.b64decode(token.strip(), validate=True).decode().partition(":")[2])
            except (ValueError, binascii.Error):
                pass
        offered += parse_qs(query).get("api_key", [])
        offered += [p.strip()[len(KEY_SUBPROTOCOL):] for p in headers.get("sec-websocket-protocol", "").split(",")
                    if p.strip().startswith(KEY_SUBPROTOCOL)]
        return any(hmac.compare_digest(o.encode(), self.api_key.encode()) for o in offered)


def _hostname(host: str) -> str:
    """The name in a Host header, without its port ('[::1]:8000' -> '::1')."""
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def _authority(origin: str) -> str:
    """'http://127.0.0.1:8000' -> '127.0.0.1:8000', as a Host header would name it."""
    return urlsplit(origin).netloc.lower()
