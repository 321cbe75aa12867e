"""What a client sends, read once for every line that speaks the protocol: the native websocket, `talk`
and both Realtime dialects."""

from typing import Any

from voicepipe.protocol.server_events import error


def event_id_of(event: Any) -> str | None:
    """The `event_id` a client gave its event (a string of up to 64 characters), for the errors it causes."""
    cause = event.get("event_id") if isinstance(event, dict) else None
    return cause if isinstance(cause, str) and len(cause) <= 64 else None


def too_large(message: str | bytes, limit: int) -> dict | None:
    """The error for a client message of more than `limit` bytes (None when it is within it): checked
    before a message is parsed, by whoever parses it first."""
    size = len(message) if isinstance(message, bytes) else len(message.encode())
    if size <= limit:
        return None
    return error("message_too_large", f"a message of {size} bytes is over the limit of {limit}")
