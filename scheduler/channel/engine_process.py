"""The engine in a process of its own, owning the device and every model, behind two ZeroMQ pipes.

Why a process: in one process the engine's host work and the server's event loop share the interpreter
lock, and every torch op gives it up and waits to take it back; beside a busy server a model step took
25-36x as long (docs/architecture.md). Across processes they share only the cores.

The channel is two PUSH/PULL pairs over Unix sockets: commands in, events out, MessagePack both ways
(`scheduler.channel.messages`). ZeroMQ's I/O thread does the writing, outside the interpreter lock, and the queues
have no high-water mark, so a send never blocks the event loop or the engine (what waits is memory, and
both sides drain their inbox every step). The server notices the process's end at once through its
sentinel, fails what was in flight, and starts a new one with the same models.
"""

import asyncio
import logging
import multiprocessing
import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterable
from typing import Any

import zmq
import zmq.asyncio

from scheduler.channel import driver
from scheduler.channel import messages as m
from scheduler.channel.client import EngineClient, EngineUnavailable
from scheduler.config import EngineConfig
from scheduler.engine import Engine

log = logging.getLogger(__name__)
Factory = Callable[..., tuple[Engine, dict[str, Any]]]  # (config, **options) -> (engine, info for the clients)
POLL_MS = 200  # how often an idle engine looks whether its server is still there
RESTART_DELAYS_S = (0.0, 1.0, 2.0, 5.0, 10.0)  # after each failed start in a row; then every 10 s


class ProcessEngine(EngineClient):
    """An engine process made by `factory(config, **options)` (a module-level function: it is imported by
    name in the new process), restarted whenever it dies until `stop`. The process is handed the client's
    own `config`, so both sides hold one configuration."""

    def __init__(self, factory: Factory, config: EngineConfig, start_timeout_s: float = 600.0,
                 **options: Any) -> None:
        super().__init__(config)
        self.factory, self.options, self.start_timeout_s = factory, options, start_timeout_s
        self.restarts = 0
        self.process: multiprocessing.process.BaseProcess | None = None
        self._codec = m.Codec()
        self._context = zmq.Context()
        self._async = zmq.asyncio.Context(self._context)
        self._folder = tempfile.mkdtemp(prefix="voicepipe-engine-")
        self._commands: zmq.Socket | None = None
        self._events: zmq.asyncio.Socket | None = None
        self._reader: asyncio.Task | None = None
        self._ready: asyncio.Future | None = None
        self._restarting: asyncio.Task | None = None
        self._stopping = False

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    async def start(self) -> None:
        """Start the process and wait until its models are loaded; RuntimeError if it cannot start."""
        self._loop = asyncio.get_running_loop()
        self._stopping = False
        await self._launch()

    async def stop(self) -> None:
        """Ask the engine to finish, give it a few seconds, then kill it; no process is left behind."""
        self._stopping = True
        if self._restarting is not None:
            self._restarting.cancel()
        process = self.process
        if process is not None and process.is_alive():
            self._send(m.Shutdown())
            await asyncio.to_thread(process.join, 10)
            if process.is_alive():
                process.kill()
                await asyncio.to_thread(process.join, 5)
        self._close_channel()
        self._lost("the engine was stopped")
        self._context.term()
        shutil.rmtree(self._folder, ignore_errors=True)

    # -- the process ------------------------------------------------------------------------------------
    async def _launch(self) -> None:
        self._close_channel()
        generation = self.restarts
        commands, events = (f"ipc://{self._folder}/{name}-{generation}" for name in ("commands", "events"))
        self._commands = self._context.socket(zmq.PUSH)
        self._events = self._async.socket(zmq.PULL)
        for sock, address in ((self._commands, commands), (self._events, events)):
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.setsockopt(zmq.RCVHWM, 0)
            sock.setsockopt(zmq.LINGER, 0)
            sock.bind(address)
        self._ready = self._loop.create_future()
        spawn = multiprocessing.get_context("spawn")
        self.process = spawn.Process(target=serve, name="voicepipe-engine", daemon=True,
                                     args=(self.factory, self.config, self.options, commands, events, os.getpid()))
        self.process.start()
        self._loop.add_reader(self.process.sentinel, self._exited, self.process)
        self._reader = self._loop.create_task(self._read())
        try:
            self.info = await asyncio.wait_for(asyncio.shield(self._ready), self.start_timeout_s)
        except TimeoutError:
            self.process.kill()
            raise RuntimeError("the engine process did not start in time") from None
        self._resume()

    async def _read(self) -> None:
        assert self._events is not None
        while True:
            event = self._codec.event((await self._events.recv(copy=False)).buffer)
            if isinstance(event, m.Ready):
                if not self._ready.done():
                    self._ready.set_result(event.info)
            elif isinstance(event, m.StartFailed):
                if not self._ready.done():
                    self._ready.set_exception(RuntimeError(event.error))
            else:
                self._receive(event)

    def _exited(self, process: multiprocessing.process.BaseProcess) -> None:
        """The process ended (its sentinel fd became readable): fail what it held, start another."""
        self._loop.remove_reader(process.sentinel)
        if process is not self.process:
            return
        process.join(1)
        code = process.exitcode
        if self._ready is not None and not self._ready.done():  # whoever is starting it decides what next
            self._ready.set_exception(RuntimeError(f"the engine process exited while starting (exit code {code})"))
            return
        if self._stopping:
            return
        log.error("the engine process stopped (exit code %s); failing its requests and restarting it", code)
        self._lost(f"the engine process stopped (exit code {code})", restarting=True)
        self._restarting = self._loop.create_task(self._restart())

    async def _restart(self) -> None:
        for attempt in range(1 << 30):
            await asyncio.sleep(RESTART_DELAYS_S[min(attempt, len(RESTART_DELAYS_S) - 1)])
            self.restarts += 1
            try:
                await self._launch()
                log.warning("the engine process is back (restart %d)", self.restarts)
                return
            except RuntimeError as e:
                log.error("restarting the engine failed: %s", e)

    def _close_channel(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            self._reader = None
        for sock in (self._commands, self._events):
            if sock is not None:
                sock.close(0)
        self._commands = self._events = None

    def _send(self, command: m.Command) -> None:
        if self._commands is None:
            raise EngineUnavailable("the engine is not running")
        self._commands.send(self._codec.encode(command), copy=False)


def serve(factory: Factory, config: EngineConfig, options: dict[str, Any], commands: str, events: str,
          parent: int) -> None:
    """The engine process: load the models, say Ready, then run the driver's loop until Shutdown or until
    the server is gone."""
    # Ctrl-C, or a SIGTERM sent to the whole process group, is the server's to handle: it drains its calls,
    # which still need this engine, and then stops it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    context = zmq.Context()
    inbox, outbox = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    for sock, address in ((inbox, commands), (outbox, events)):
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.connect(address)
    codec = m.Codec()

    def send(event: m.Event) -> None:
        outbox.send(codec.encode(event), copy=False)

    try:
        engine, info = factory(config, **options)
    except Exception as e:  # the server says why and stops trying the same thing forever
        logging.getLogger(__name__).exception("the engine could not start")
        send(m.StartFailed(f"{type(e).__name__}: {e}"))
        outbox.close(linger=2000)
        return
    send(m.Ready({"max_context": engine.max_context, **info}))

    def receive(block: bool) -> Iterable[m.Command]:
        while block and not inbox.poll(POLL_MS):
            if os.getppid() != parent:
                return [m.Shutdown()]  # the server died without stopping us
        commands: list[m.Command] = []
        while True:
            try:
                commands.append(codec.command(inbox.recv(zmq.NOBLOCK, copy=False).buffer))
            except zmq.Again:
                return commands

    driver.run(engine, receive, send)
    outbox.close(linger=1000)
    inbox.close(0)
