"""The server: the web page, the voice calls and the OpenAI-compatible APIs, as one ASGI app on uvicorn.

`VoiceServer` and `run_server` load on first use: the CLI reads `voicepipe.server.settings` for every
command, and must not pay for FastAPI and the models' libraries to print its help.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from voicepipe.server.run import run_server
    from voicepipe.server.voice_server import VoiceServer

__all__ = ["VoiceServer", "run_server"]


def __getattr__(name: str) -> Any:
    if name == "VoiceServer":
        from voicepipe.server.voice_server import VoiceServer

        return VoiceServer
    if name == "run_server":
        from voicepipe.server.run import run_server

        return run_server
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
