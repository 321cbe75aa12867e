"""One call: its pipeline, the client's messages, and cleaning everything up when the client goes away."""

import asyncio
import copy
import logging
import threading
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from scheduler import KNOBS
from scheduler.channel.client import EngineUnavailable
from voicepipe.audio import SAMPLE_RATE
from voicepipe.call import client_events
from voicepipe.call.limits import Limits
from voicepipe.call.mcp_listings import McpListings
from voicepipe.call.pipeline import build_pipeline
from voicepipe.call.runtime import Runtime
from voicepipe.call.transport import Inbound, Transport
from voicepipe.constrained import grammars, tools
from voicepipe.constrained.grammars import FieldRefused
from voicepipe.constrained.tools import Tool
from voicepipe.frontend.recording import FrontEndRecording
from voicepipe.frontend.stage import AudioFrontEnd
from voicepipe.ids import new_id
from voicepipe.mcp_servers import McpPolicy, Toolbox
from voicepipe.pipeline import CallConfig, Conversation
from voicepipe.pipeline.events import Error, Event
from voicepipe.pipeline.outbound import SessionDescribed, StatsReported
from voicepipe.pipeline.output import ClientOutput
from voicepipe.pipeline.requests import (
    CancelRequested,
    ClearRequested,
    CommitRequested,
    SessionUpdate,
)
from voicepipe.pipeline.turn_metrics import turn_metrics
from voicepipe.protocol import ClientEvent
from voicepipe.protocol.transport import Disconnected

log = logging.getLogger(__name__)
# Client events with nothing to check: the request each makes, given the event's id.
SIMPLE: dict[str, Callable[[str | None], Event]] = {
    ClientEvent.RESPONSE_CANCEL: lambda cause: CancelRequested(),
    ClientEvent.AUDIO_COMMIT: CommitRequested,
    ClientEvent.AUDIO_CLEAR: lambda cause: ClearRequested(),
}
STATS_INTERVAL_S = 0.5



class Session:
    """One client and the pipeline answering it.

    Every malformed message gets an `error` event and the call goes on. When the client goes away, the
    pipeline's tasks are cancelled (which aborts the turn's LLM request and skips its unstarted jobs) and
    the call's conversation prefix is released from the KV pool.
    """

    def __init__(self, transport: Transport, runtime: Runtime, limits: Limits, config: CallConfig | None = None,
                 may_tune: bool = True, front: AudioFrontEnd | None = None, mcp: McpPolicy | None = None) -> None:
        self.transport, self.runtime, self.limits = transport, runtime, limits
        self.may_tune = may_tune  # may turn the engine's knobs, which every call shares
        self.id = new_id("sess")
        self.config = copy.deepcopy(config) if config is not None else CallConfig()  # this call's own settings
        self.config.max_utterance_s = limits.max_utterance_s
        self.conversation = Conversation(self.config.instructions, runtime.tokenizer, limits.max_conversation_items,
                                         limits.max_conversation_bytes)
        self.conversation.retention = self.config.retention_ratio
        if front is not None:
            front.config = self.config
            front.configure()
        self.front = front or AudioFrontEnd(self.config)
        if self.config.record_front_end:
            self.front.recording = FrontEndRecording()
        self.mcp = mcp or runtime.mcp  # the MCP servers this call may use (a phone line adds its keypad)
        self.toolbox = Toolbox(self.mcp)
        self.pipeline = build_pipeline(runtime, self.id, self.config, self.conversation, self.send, self.describe,
                                       self.front, self.hang_up, self.toolbox)
        self.listings = McpListings(self.toolbox, self.config, self.send, self.pipeline.push, self._compile)
        self._send_lock = asyncio.Lock()
        self._cause: str | None = None  # the event_id of the client event being handled

    @property
    def replying(self) -> bool:
        """A reply is in progress (what a draining server waits for)."""
        return self.pipeline.stage(ClientOutput).replying

    # -- the call --------------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Serve the call until the client leaves or idles out; always cleans up."""
        self.runtime.engine.open_session(self.id)
        self.pipeline.start()
        stats = asyncio.create_task(self._send_stats())
        log.info("call %s started", self.id)
        try:
            await self.send(SessionDescribed(self.describe(), created=True))
            await self._receive()
        finally:
            stats.cancel()
            await self.listings.close()
            await self.pipeline.stop()
            await asyncio.gather(stats, return_exceptions=True)
            await self.toolbox.close()
            self.runtime.engine.release_session(self.id)
            self._save_recording()
            log.info("call %s ended", self.id)

    def _save_recording(self) -> None:
        """The front end's recording, where kept, as `<call id>.npz` in its folder: written on a thread of
        its own (a call of minutes compresses for a second or more), so the call's slot is free at once and
        the next caller is not refused meanwhile; the process waits for the thread before it exits."""
        recording, folder = self.front.recording, self.config.record_front_end
        if recording is None or not folder or not recording.samples:
            return
        path = Path(folder) / f"{self.id}.npz"

        def save() -> None:
            try:
                recording.save(path)
            except Exception:
                log.exception("call %s: could not write its recording to %s", self.id, path)

        threading.Thread(target=save, name=f"record-{self.id}").start()

    async def _receive(self) -> None:
        while True:
            try:
                message = await asyncio.wait_for(self.transport.recv(), self.limits.idle_timeout_s)
            except TimeoutError:
                idle = self.limits.idle_timeout_s
                await self.error("idle_timeout", f"no message for {idle:g} s; closing the call")
                await self.transport.close(1000, "idle timeout")
                return
            except Disconnected:
                return
            await self._handle(message)
            await asyncio.sleep(0)  # a transport with a burst buffered returns at once: let the rest of the loop run

    async def send(self, *events: Event) -> None:
        """Tell the client of `events` together, in order; a client that has gone is noticed by the
        receiving loop, so a failed send is dropped here."""
        async with self._send_lock:
            for event in events:
                try:
                    await self.transport.send(event)
                except Disconnected:
                    return

    async def hang_up(self) -> None:
        """End the call from the server's side (the client's line closes, and the call is cleaned up)."""
        log.info("call %s: hanging up on an idle caller", self.id)
        await self.transport.close(1000, "the caller stayed silent")

    async def error(self, code: str, message: str) -> None:
        """An error caused by the client event being handled (its `event_id` goes back with it)."""
        await self.send(Error(code, message, event_id=self._cause))

    # -- client messages -------------------------------------------------------------------------------------
    async def _handle(self, message: Inbound) -> None:
        """One client message, as the transport read it: audio, or an event."""
        if isinstance(message, bytes):
            await self._audio(message)
            return
        event, kind = message, message.get("type")
        self._cause = client_events.event_id_of(event)
        try:
            await self._dispatch(kind, event)
        finally:
            self._cause = None

    async def _dispatch(self, kind: Any, event: Any) -> None:
        try:
            request = await self._request(kind, event)
        except client_events.ClientError as e:
            await self.send(Error(e.code, str(e), event_id=self._cause, param=e.param))
            return
        if request is not None:
            self.pipeline.push(request)

    async def _request(self, kind: Any, event: Any) -> Event | None:
        """The pipeline's request for one client event (None: nothing to do)."""
        if not isinstance(kind, str):
            raise client_events.ClientError("an event must be a JSON object with a string 'type'", "invalid_event")
        simple = SIMPLE.get(kind)
        if kind == ClientEvent.RESPONSE_CANCEL:
            self.listings.cancel_replies()
        if simple is not None:
            return simple(self._cause)
        if kind == ClientEvent.AUDIO_APPEND:
            return client_events.audio_in(client_events.audio_bytes(event))
        if kind == ClientEvent.KEY_PRESSED:
            return client_events.key_pressed(event)
        if kind == ClientEvent.SESSION_UPDATE:
            return await self._update(event.get("session"))
        if kind == ClientEvent.RESPONSE_CREATE:
            response = event.get("response")
            request = client_events.response_requested(response if response is not None else {}, self._cause,
                                                       self.config, self.mcp)
            own = request.tools
            if own is not None and own.servers:
                self.listings.reply_named(request, self._cause)  # it starts once they are listed
                return None
            if own is not None:  # a choice alone: among the session's tools as they are now
                await self._compile(list(own.tools if own.tools is not None else self.config.offered), own.choice,
                                    "response")
            return request
        if kind == ClientEvent.ITEM_CREATE:
            item = event.get("item")
            return client_events.item_created(item, client_events.item_id_of(item) or new_id("item"))
        if kind == ClientEvent.ITEM_TRUNCATE:
            return client_events.truncate_requested(event)
        if kind in (ClientEvent.ITEM_DELETE, ClientEvent.ITEM_RETRIEVE):
            return client_events.item_requested(kind, event, self._cause)
        raise client_events.ClientError(f"unknown event type {kind!r}", "unknown_event")

    async def _audio(self, pcm: bytes) -> None:
        try:
            audio = client_events.audio_in(pcm)
        except client_events.ClientError as e:
            await self.error(e.code, str(e))
            return
        if audio is not None:
            self.pipeline.push(audio)

    async def _update(self, fields: Any) -> SessionUpdate:
        """Check every field first (new tools' grammars compiled in the engine, so a reply can use them at
        once, and the scheduler's knobs, which the engine checks all of before applying any); the stages
        apply the rest, and the output stage answers `session.updated`."""
        update = client_events.session_update(fields, self.config, self.mcp)
        # Without new tools, a new choice is among the functions and the servers' tools listed already.
        if "tools" in fields or "tool_choice" in fields:
            offered = list(update.tools) if "tools" in fields else list(self.config.offered)
            await self._compile(offered, update.tool_choice, "session")
        knobs = fields.get("scheduler", {})
        if not isinstance(knobs, dict):
            raise client_events.ClientError("scheduler must be an object", "invalid_session_update")
        if knobs and not self.may_tune:
            raise client_events.ClientError("the scheduler's knobs are shared by every call: changing them needs "
                                            "the API key or the server's own page", "invalid_session_update")
        if knobs:
            try:
                self.runtime.engine.update_config(**knobs)
            except (ValueError, TypeError) as e:
                raise client_events.ClientError(f"scheduler: {e}", "invalid_session_update") from None
        if update.servers is not None:
            self.listings.session_named(update)
        return update

    async def _compile(self, offered: list[Tool], choice: Any, where: str) -> None:
        """Compile, in the engine, the grammars a reply that may call `offered` under `choice` needs (none when
        it may call nothing); ValueError for a choice naming no offered tool, ClientError for what the engine
        refused, each naming the field of `where` ("session" or "response") at fault."""
        chosen = tools.choose(offered, choice, f"{where}.tool_choice")
        if not chosen:
            return
        try:
            await grammars.prepare(self.runtime.engine, tools.grammars(offered, chosen, f"{where}.tools"))
        except FieldRefused as e:
            raise client_events.ClientError(str(e), e.code, e.param) from None
        except EngineUnavailable:
            raise client_events.ClientError("the engine is restarting; send it again in a few seconds",
                                            "engine_unavailable") from None

    def describe(self) -> dict:
        """The session as the client sees it. The knobs are the engine's, shared by every call, as its client
        last set them (the engine applies them between two steps)."""
        config = self.runtime.engine.config
        scheduler = {"policy": config.policy, "max_batch_tokens": config.max_batch_tokens,
                     "max_batch_seqs": config.max_batch_seqs}
        return {
            "id": self.id,
            "object": "realtime.session",
            "instructions": self.config.instructions,
            "output_modalities": ["audio" if self.config.spoken else "text"],
            "input_audio_format": {"type": "pcm16", "sample_rate": SAMPLE_RATE},
            "output_audio_format": {"type": "pcm16", "sample_rate": self.runtime.tts_rate},
            "turn_detection": self.config.turn_detection.describe(),
            "echo_cancellation": self.config.echo_cancellation,
            "interrupt_tool_calls": self.config.interrupt_tool_calls,
            "noise_reduction": {"type": self.config.noise_reduction} if self.config.noise_reduction else None,
            "tools": [*({"type": "function", "name": t.name, "description": t.description,
                         "parameters": t.parameters} for t in self.config.tools),
                      *(spec.described for spec in self.config.servers)],
            "tool_choice": self.config.tool_choice,
            "truncation": "auto" if self.config.retention_ratio == 1 else {
                "type": "retention_ratio", "retention_ratio": self.config.retention_ratio},
            "time_to_first_audio_deadline_s": self.config.ttfa_s,
            "scheduler": scheduler,
            "limits": {**asdict(self.limits), "scheduler": {k: list(v) for k, v in KNOBS.items()}},
        }

    # -- scheduler stats -------------------------------------------------------------------------------------
    async def _send_stats(self) -> None:
        while True:
            await asyncio.sleep(STATS_INTERVAL_S)
            try:
                stats = await page_stats(self.runtime)
            except EngineUnavailable:
                continue  # restarting: the page hears again when it is back
            await self.send(StatsReported({**stats, "audio_input": self.audio_state()}))

    def audio_state(self) -> dict:
        """This call's audio front end as the page shows it: what runs, which canceller's output the call
        hears, and the echo removed (dB)."""
        front = self.front
        erle = front.echo.erle_db()
        return {"echo_cancellation": self.config.echo_cancellation, "noise_reduction": self.config.noise_reduction,
                "canceller": front.processing.canceller,
                "echo_return_loss_enhancement_db": None if erle is None else round(erle, 1)}


async def page_stats(runtime: Runtime) -> dict:
    """The engine's page view (trimmed in the engine), plus the deadline outcomes of all calls."""
    snap = await runtime.engine.view("page")
    outcomes = turn_metrics(runtime.registry).outcomes
    return {**snap, "deadlines": {"hit": outcomes.get("met", 0), "miss": outcomes.get("missed", 0)}}
