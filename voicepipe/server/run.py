"""`voicepipe serve`'s main loop: listen, warm up, serve, and on SIGTERM or Ctrl-C drain and exit cleanly."""

import asyncio
import signal
import socket
import sys
from typing import TYPE_CHECKING

from voicepipe.backends.loading import ModelOptions
from voicepipe.call.runtime import Runtime
from voicepipe.server.voice_server import VoiceServer

if TYPE_CHECKING:
    from voicepipe.server.settings import ServeSettings


def say(line: str) -> None:
    print(f"voicepipe: {line}", file=sys.stderr, flush=True)


async def serve_spawned(options: ModelOptions, settings: "ServeSettings", sock: socket.socket) -> None:
    """Start the engine process with the models, then serve on `sock` (see `run_server`)."""
    runtime = await Runtime.spawn(options)
    await run_server(runtime, settings, sock)


async def run_server(runtime: Runtime, settings: "ServeSettings", sock: socket.socket) -> None:
    """Serve on `sock` until SIGTERM or SIGINT.

    The runtime's engine is warmed up before it serves (in its process, or before its thread starts). On
    a signal it drains: new calls are refused, replies in progress get
    `settings.drain_s` to finish, then the calls are closed and the engine stopped (its process joined)
    while this event loop still runs, so the aborts of their requests find a loop to report to.
    """
    runtime.mcp = settings.mcp()
    server = VoiceServer(runtime, settings.limits(), settings.call_config(), settings.security(),
                         sip=settings.sip_settings(), phone_calls=settings.phone_calls())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start(sock=sock, ssl_certfile=settings.ssl_certfile, ssl_keyfile=settings.ssl_keyfile)
        print(f"voicepipe: listening on {server.url}", flush=True)
        if server.sip is not None:
            host, port = server.sip.agent.address
            print(f"voicepipe: answering SIP calls on sip:voicepipe@{host}:{port}", flush=True)
        await stop.wait()
        say(f"shutting down: finishing replies in progress (up to {settings.drain_s:g} s) ...")
        await server.drain(settings.drain_s)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await server.close()
        await runtime.close()
