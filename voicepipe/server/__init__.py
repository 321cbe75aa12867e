"""The server: the web page, the voice calls and the OpenAI-compatible APIs, as one ASGI app on uvicorn."""

from voicepipe.server.run import run_server
from voicepipe.server.voice_server import VoiceServer

__all__ = ["VoiceServer", "run_server"]
