"""uvicorn's HTTP/1.1 protocol, with a deadline for the first request: a socket that connects and never
finishes its request line and headers (a half-open upgrade) is dropped instead of held forever."""

import asyncio

from uvicorn.protocols.http.h11_impl import H11Protocol

FIRST_REQUEST_S = 10.0


class DeadlineH11Protocol(H11Protocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._first_request = self.loop.call_later(FIRST_REQUEST_S, self._drop_if_silent)

    def connection_lost(self, exc: Exception | None) -> None:
        self._first_request.cancel()
        super().connection_lost(exc)

    def _drop_if_silent(self) -> None:
        # After a websocket upgrade the transport belongs to the websocket protocol: leave it be.
        if self.cycle is None and self.transport.get_protocol() is self and not self.transport.is_closing():
            self.transport.close()
