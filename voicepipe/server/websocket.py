"""A Starlette websocket as the `Transport` a call's session talks to."""

import json

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from voicepipe.protocol.transport import Disconnected


class WebSocketLine:
    """recv/send/close over an accepted websocket; a client that has gone raises `Disconnected`."""

    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws

    async def recv(self) -> str | bytes:
        try:
            message = await self.ws.receive()
        except (RuntimeError, WebSocketDisconnect, OSError) as e:  # RuntimeError: already closed
            raise Disconnected() from e
        if message["type"] == "websocket.disconnect":
            raise Disconnected()
        data = message.get("bytes")
        return data if data is not None else message.get("text") or ""

    async def send(self, message: dict | bytes) -> None:
        try:
            if isinstance(message, bytes):
                await self.ws.send_bytes(message)
            else:
                await self.ws.send_text(json.dumps(message))
        except (RuntimeError, WebSocketDisconnect, OSError) as e:
            raise Disconnected() from e

    async def close(self, code: int = 1000, reason: str = "") -> None:
        if self.ws.application_state == WebSocketState.CONNECTED:
            try:
                await self.ws.close(code, reason)
            except (RuntimeError, WebSocketDisconnect, OSError):
                pass  # the client went first
