"""The calls API of OpenAI's Realtime SIP (`/v1/realtime/calls/{call_id}/...`), as the `openai` SDK's
`realtime.calls` calls it: accept or reject a phone call the webhook announced, hang up or transfer one in
progress."""

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from voicepipe.server.call_control import DECLINE, Decision, PhoneCalls
from voicepipe.server.chat_api import openai_error
from voicepipe.server.realtime_session import UnsupportedSession, native_update


def build_calls_router(calls: PhoneCalls) -> APIRouter:
    router = APIRouter(prefix="/v1/realtime/calls")

    @router.post("/{call_id}/accept")
    async def accept(call_id: str, request: Request) -> Response:
        body = await _body(request)
        if isinstance(body, JSONResponse):
            return body
        try:
            native_update(body)  # refused now, not when the call has been answered
        except UnsupportedSession as e:
            return openai_error(400, str(e), "unsupported_session")
        return _decide(calls, call_id, Decision(session=body))

    @router.post("/{call_id}/reject")
    async def reject(call_id: str, request: Request) -> Response:
        body = await _body(request)
        if isinstance(body, JSONResponse):
            return body
        status = body.get("status_code", DECLINE)
        if not isinstance(status, int) or not 400 <= status <= 699:
            return openai_error(400, "status_code must be a SIP failure status (400-699)", param="status_code")
        return _decide(calls, call_id, Decision(status=status))

    @router.post("/{call_id}/hangup")
    async def hangup(call_id: str) -> Response:
        call = calls.active.get(call_id)
        if call is None:
            return _unknown(call_id)
        await call.hang_up("hung up by the application")
        return Response(status_code=200)

    @router.post("/{call_id}/refer")
    async def refer(call_id: str, request: Request) -> Response:
        body = await _body(request)
        if isinstance(body, JSONResponse):
            return body
        call = calls.active.get(call_id)
        if call is None:
            return _unknown(call_id)
        target = body.get("target_uri")
        if not isinstance(target, str) or not target.startswith(("sip:", "sips:", "tel:")) or any(
                c in target for c in "<>\r\n"):
            return openai_error(400, "target_uri must be a sip:, sips: or tel: URI", param="target_uri")
        status = await call.transfer(target)
        if not 200 <= status < 300:
            return openai_error(502, f"the caller's side did not take the transfer (SIP status {status or 'none'})",
                                "refer_failed", kind="server_error")
        return Response(status_code=200)

    return router


async def _body(request: Request) -> dict[str, Any] | JSONResponse:
    raw = await request.body()
    try:
        body = json.loads(raw) if raw.strip() else {}
    except ValueError:
        return openai_error(400, "the body must be JSON")
    return body if isinstance(body, dict) else openai_error(400, "the body must be a JSON object")


def _decide(calls: PhoneCalls, call_id: str, decision: Decision) -> Response:
    waiting = calls.waiting.get(call_id)
    if waiting is None or waiting.done():
        return _unknown(call_id, "waiting for a decision")
    waiting.set_result(decision)
    return Response(status_code=200)


def _unknown(call_id: str, state: str = "in progress") -> JSONResponse:
    return openai_error(404, f"no phone call {call_id!r} {state} here", "call_not_found", param="call_id")
