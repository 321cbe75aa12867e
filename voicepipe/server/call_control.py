"""Who answers a phone call and how, decided by the operator's application, as OpenAI's Realtime API does
it for SIP: each call that comes in is announced to a webhook (`realtime.call.incoming`, with the INVITE's
headers, signed as Standard Webhooks are where a secret is set, so the `openai` SDK's `webhooks.unwrap`
checks it), and the application answers through the calls API (`/v1/realtime/calls/{id}/accept` with the
session's settings, `reject` with a SIP status), and later ends or transfers the call (`hangup`, `refer`).

Without a webhook every call is taken with the server's own settings; either way the calls API reaches the
calls in progress.
"""

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from voicepipe.ids import new_id
from voicepipe.sip.dialog import SipCall

log = logging.getLogger(__name__)
DECLINE = 603  # a rejected call's status when the application names none (OpenAI's default too)
UNAVAILABLE = 480  # the application could not be reached, or did not answer in time


@dataclass
class Decision:
    """The application's answer: a session's settings (Realtime's shape) to accept with, or a status."""

    session: dict[str, Any] | None = None
    status: int | None = None


@dataclass
class PhoneCalls:
    """The phone calls known by id: those waiting for the application's decision, and those in progress."""

    webhook: str | None = None
    secret: str | None = None  # Standard Webhooks' whsec_... (or any string) to sign the announcements
    timeout_s: float = 10.0  # how long a call waits for the application's decision
    waiting: dict[str, asyncio.Future[Decision]] = field(default_factory=dict)
    active: dict[str, SipCall] = field(default_factory=dict)
    sessions: dict[SipCall, dict[str, Any]] = field(default_factory=dict)  # settings accepted with, until started

    async def decide(self, call: SipCall) -> Decision:
        """The application's decision on a call (accepted as it is, where there is no webhook)."""
        call_id = new_id("rtc")
        call.public_id = call_id
        if self.webhook is None:
            return Decision(session=None)
        decided: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
        self.waiting[call_id] = decided
        try:
            await self._announce(call_id, call)
            return await asyncio.wait_for(decided, self.timeout_s)
        except (httpx.HTTPError, TimeoutError) as e:
            log.warning("phone call %s: no decision from %s (%s)", call_id, self.webhook, e or type(e).__name__)
            return Decision(status=UNAVAILABLE)
        finally:
            self.waiting.pop(call_id, None)

    def started(self, call: SipCall) -> None:
        self.active[call.public_id] = call

    def ended(self, call: SipCall) -> None:
        self.active.pop(call.public_id, None)
        self.sessions.pop(call, None)

    async def _announce(self, call_id: str, call: SipCall) -> None:
        event = {"object": "event", "id": new_id("evt"), "type": "realtime.call.incoming",
                 "created_at": int(time.time()), "data": {"call_id": call_id, "sip_headers": [
                     h for h in call.headers() if h["name"].lower() not in ("authorization", "proxy-authorization")],
                     "sip_media_security": "rtp"}}
        body = json.dumps(event)
        headers = {"content-type": "application/json", **signed(event["id"], body, self.secret)}
        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            answer = await client.post(self.webhook, content=body, headers=headers)  # type: ignore[arg-type]
            answer.raise_for_status()


def signed(event_id: str, body: str, secret: str | None) -> dict[str, str]:
    """Standard Webhooks' headers: the id, the time, and an HMAC-SHA256 of both with the body."""
    if secret is None:
        return {}
    key = base64.b64decode(secret.removeprefix("whsec_")) if secret.startswith("whsec_") else secret.encode()
    stamp = str(int(time.time()))
    mac = hmac.new(key, f"{event_id}.{stamp}.{body}".encode(), hashlib.sha256).digest()
    return {"webhook-id": event_id, "webhook-timestamp": stamp,
            "webhook-signature": "v1," + base64.b64encode(mac).decode()}
