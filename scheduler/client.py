"""The engine as an asyncio program sees it: streams of tokens, device jobs and views, over commands.

`EngineClient` holds everything a client keeps (each request's stream, each job's future, the live
sessions, the knobs as last set) and speaks only in `scheduler.messages`. Its two drivers differ in where
the engine runs: `LocalEngine` on a thread beside the caller's event loop (unit tests, the notebook,
scripts), `scheduler.engine_process.ProcessEngine` in a process of its own (the server: the engine's host
work then never waits for the server's interpreter lock).
"""

import asyncio
import copy
import itertools
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from scheduler import driver
from scheduler import messages as m
from scheduler.config import EngineConfig, check_knobs
from scheduler.engine import Engine
from scheduler.grammar import Grammar, GrammarRefused
from scheduler.request import Output, RequestClass, SamplingParams, check_request

log = logging.getLogger(__name__)
_ids = itertools.count()


class EngineUnavailable(RuntimeError):
    """The engine is not running (it stopped, or is restarting); try again shortly."""


class JobFailed(RuntimeError):
    """A device job raised in the engine; the message is its error."""


class EngineClient:
    """One engine's requests, jobs and views, seen from one event loop."""

    def __init__(self, config: EngineConfig, info: dict[str, Any] | None = None) -> None:
        self.config = copy.copy(config)  # the knobs as this client last set them
        self.info: dict[str, Any] = info or {}
        self.alive = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._streams: dict[str, asyncio.Queue[Output]] = {}
        self._classes: dict[str, RequestClass] = {}
        self._jobs: dict[str, tuple[asyncio.Future, str]] = {}  # job id -> (its future, its kind)
        self._answers: dict[int, asyncio.Future] = {}
        self._sessions: set[str] = set()
        self._knobs: dict[str, int] = {}
        self._job_times: dict[str, tuple[float, int]] = {}  # kind -> (seconds, count)
        self._watchers: list[Callable[[bool], None]] = []

    @property
    def max_context(self) -> int:
        return self.info["max_context"]

    # -- requests ----------------------------------------------------------------------------------------
    async def generate(self, prompt_ids: list[int], params: SamplingParams | None = None,
                       cls: RequestClass = RequestClass.INTERACTIVE, deadline: float | None = None,
                       session: str | None = None, request_id: str | None = None) -> AsyncIterator[Output]:
        """Stream a request's outputs; leaving the loop early (or being cancelled) aborts it. A request
        that the engine's failure ends finishes with an "error: ..." reason."""
        params = params or SamplingParams()
        check_request(prompt_ids, params)  # here too, so the caller gets the ValueError and nothing is sent
        self._ready_loop()
        request_id = request_id or f"req-{next(_ids)}"
        box: asyncio.Queue[Output] = asyncio.Queue()
        self._streams[request_id], self._classes[request_id] = box, cls
        self._send(m.Add(request_id, [int(t) for t in prompt_ids], params, int(cls), deadline, session))
        finished = False
        try:
            while not finished:
                out = await box.get()
                finished = out.finished
                yield out
        finally:
            self._streams.pop(request_id, None)
            self._classes.pop(request_id, None)
            if not finished and self.alive:
                self._send(m.Abort(request_id))

    def abort(self, request_id: str) -> None:
        self._send_if_alive(m.Abort(request_id))

    def set_deadline(self, request_id: str, deadline: float | None) -> None:
        """Move a request's deadline, e.g. to when its caller's buffered audio will run out."""
        self._send_if_alive(m.SetDeadline(request_id, deadline))

    def promote(self, request_id: str, cls: RequestClass, deadline: float | None, session: str | None) -> None:
        """Raise a request's class (a speculative reply whose turn was confirmed); see `Engine.promote`."""
        if request_id in self._classes:
            self._classes[request_id] = cls
        self._send_if_alive(m.Promote(request_id, int(cls), deadline, session))

    def open_session(self, session: str) -> None:
        self._sessions.add(session)
        self._send_if_alive(m.OpenSession(session))

    def release_session(self, session: str) -> None:
        self._sessions.discard(session)
        self._send_if_alive(m.ReleaseSession(session))

    def update_config(self, **knobs: int) -> None:
        """Turn the knobs of the running engine: checked here (ValueError), applied between two steps."""
        check_knobs(knobs)
        for name, value in knobs.items():
            setattr(self.config, name, value)
        self._knobs.update(knobs)
        self._send_if_alive(m.SetKnobs(dict(knobs)))

    # -- device jobs -------------------------------------------------------------------------------------
    async def run_job(self, kind: str, *args: Any, cls: RequestClass = RequestClass.INTERACTIVE,
                      deadline: float | None = None) -> Any:
        """Run the engine's `kind` handler on `args` between model steps, in priority order. A caller
        cancelled before the job starts takes it out of the queue."""
        self._ready_loop()
        job_id = f"job-{next(_ids)}"
        future = self._loop.create_future()
        self._jobs[job_id] = (future, kind)
        try:
            self._send(m.SubmitJob(job_id, kind, list(args), int(cls), deadline))
            return await future
        except asyncio.CancelledError:
            self._send_if_alive(m.CancelJob(job_id))
            raise
        finally:
            self._jobs.pop(job_id, None)

    def mean_job_seconds(self, kinds: tuple[str, ...]) -> float:
        """The mean duration of the jobs of these kinds so far (0 before any ran)."""
        times = [self._job_times.get(kind, (0.0, 0)) for kind in kinds]
        count = sum(n for _, n in times)
        return sum(t for t, _ in times) / count if count else 0.0

    def busy(self) -> bool:
        """Jobs in flight, or a realtime request: optional work had better wait."""
        return bool(self._jobs) or RequestClass.REALTIME in self._classes.values()

    # -- views -------------------------------------------------------------------------------------------
    async def view(self, name: str) -> Any:
        """One of `scheduler.views.VIEWS`, read in the engine between two steps."""
        self._ready_loop()
        query_id = next(_ids)
        future = self._answers[query_id] = self._loop.create_future()
        try:
            self._send(m.Query(query_id, name))
            return await future
        finally:
            self._answers.pop(query_id, None)

    async def prepare_grammar(self, grammar: Grammar) -> None:
        """Return once the engine has `grammar` compiled (cached: the requests that use it start at once);
        GrammarRefused if it is past the compile budget or does not compile. The engine goes on meanwhile."""
        self._ready_loop()
        query_id = next(_ids)
        future = self._answers[query_id] = self._loop.create_future()
        try:
            self._send(m.Prepare(query_id, grammar))
            await future
        except EngineUnavailable:
            raise
        except RuntimeError as e:  # the answer's error: why the engine would not compile it
            raise GrammarRefused(str(e)) from None
        finally:
            self._answers.pop(query_id, None)

    async def snapshot(self) -> dict:
        return await self.view("snapshot")

    async def holdings(self) -> dict:
        return await self.view("holdings")

    async def metrics_text(self) -> bytes:
        return await self.view("metrics_text")

    def watch(self, callback: Callable[[bool], None]) -> None:
        """Call `callback(alive)` on the event loop each time the engine goes down or comes back."""
        self._watchers.append(callback)

    # -- events in ---------------------------------------------------------------------------------------
    def _receive(self, event: m.Event) -> None:
        """Deliver one engine event (on the event loop)."""
        if isinstance(event, m.StepOutputs):
            for request_id, out in event.tokens:
                box = self._streams.get(request_id)
                if box is not None:
                    box.put_nowait(out)
            for done in event.jobs:
                self._job_finished(done)
        elif isinstance(event, m.Answer):
            future = self._answers.get(event.query_id)
            if future is not None and not future.done():
                if event.error is None:
                    future.set_result(event.value)
                else:
                    future.set_exception(RuntimeError(event.error))

    def _job_finished(self, done: m.JobDone) -> None:
        if done.job_id not in self._jobs:
            return
        future, kind = self._jobs[done.job_id]
        total, count = self._job_times.get(kind, (0.0, 0))
        self._job_times[kind] = (total + done.seconds, count + 1)
        if future.done():
            return
        if done.error is None:
            future.set_result(done.value)
        else:
            future.set_exception(JobFailed(done.error))

    def _lost(self, reason: str) -> None:
        """The engine went away: every stream ends with an error, every job and view fails."""
        self._set_alive(False)
        for box in self._streams.values():
            box.put_nowait(Output(None, "", True, f"error: {reason}"))
        for future in [*(f for f, _ in self._jobs.values()), *self._answers.values()]:
            if not future.done():
                future.set_exception(EngineUnavailable(reason))

    def _resume(self) -> None:
        """A (re)started engine: the live calls' sessions and the knobs as last set are sent again."""
        for session in self._sessions:
            self._send(m.OpenSession(session))
        if self._knobs:
            self._send(m.SetKnobs(dict(self._knobs)))
        self._set_alive(True)

    def _set_alive(self, alive: bool) -> None:
        changed, self.alive = self.alive != alive, alive
        if changed:
            for callback in list(self._watchers):
                callback(alive)

    # -- the driver's part -------------------------------------------------------------------------------
    def _ready_loop(self) -> None:
        if not self.alive:
            raise EngineUnavailable("the engine is not running")
        if self._loop is None:
            self._loop = asyncio.get_running_loop()

    def _send_if_alive(self, command: m.Command) -> None:
        if self.alive:
            self._send(command)

    def _send(self, command: m.Command) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError


class LocalEngine(EngineClient):
    """The engine on a thread of this process: what the notebook, unit tests and small scripts use, with
    the engine itself at hand as `core` (its planner and pool, to look at between steps)."""

    def __init__(self, engine: Engine, info: dict[str, Any] | None = None) -> None:
        super().__init__(engine.config, {"max_context": engine.max_context, **(info or {})})
        self.core = engine
        self._inbox: queue.SimpleQueue[m.Command] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="voicepipe-engine", daemon=True)
            self._thread.start()
            self._resume()

    async def stop(self) -> None:
        if self._thread is not None:
            self._inbox.put(m.Shutdown())
            self._thread.join()
            self._thread = None
            self._lost("the engine was stopped")

    def _send(self, command: m.Command) -> None:
        self._inbox.put(command)

    def _serve(self) -> None:
        driver.run(self.core, self._take, self._deliver)

    def _take(self, block: bool) -> Iterable[m.Command]:
        commands = [self._inbox.get()] if block else []
        while True:
            try:
                commands.append(self._inbox.get_nowait())
            except queue.Empty:
                return commands

    def _deliver(self, event: m.Event) -> None:
        loop = self._loop
        if loop is None:
            return  # nobody has asked for anything that answers
        try:
            loop.call_soon_threadsafe(self._receive, event)
        except RuntimeError:
            log.debug("dropped an engine event for a closed event loop")
