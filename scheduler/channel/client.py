"""The engine as an asyncio program sees it: streams of tokens, device jobs and views, over commands.

`EngineClient` holds everything a client keeps (each request's stream, each job's future, the live
sessions, the knobs as last set) and speaks only in `scheduler.channel.messages`. Its two drivers differ in
where the engine runs: `LocalEngine` (`scheduler/channel/local.py`) on a thread beside the caller's event
loop (unit tests, the notebook, scripts), `ProcessEngine` (`scheduler/channel/engine_process.py`) in a
process of its own (the server: the engine's host work then never waits for the server's interpreter lock).
"""

import asyncio
import copy
import itertools
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from scheduler.channel import messages as m
from scheduler.config import EngineConfig, check_knobs
from scheduler.grammar.constraint import Grammar, GrammarRefused
from scheduler.request import Output, RequestClass, SamplingParams, check_request

log = logging.getLogger(__name__)
_ids = itertools.count()
# How long realtime work lost to a dead engine process (a call's transcription, reply, speech) waits for
# the restarted one before it fails after all: past this, a caller is better told to speak again.
REDO_WITHIN_S = 60.0


class EngineUnavailable(RuntimeError):
    """The engine is not running (it stopped, or is restarting); try again shortly."""


class JobFailed(RuntimeError):
    """A device job raised in the engine; the message is its error."""


@dataclass(slots=True)
class Sent:
    """A request as it was sent (its class, deadline and session kept current) and the tokens it has
    streamed: what it takes to go on with it on a restarted engine."""

    add: m.Add
    generated: list[int] = field(default_factory=list)

    def again(self) -> m.Add | None:
        """The request that continues it from where it was (the same greedy tokens), or None when it cannot
        be continued: a constrained one that had begun (its grammar's state went with the engine)."""
        if self.generated and self.add.params.grammar is not None:
            return None
        params = replace(self.add.params, max_tokens=self.add.params.max_tokens - len(self.generated))
        return m.Add(self.add.request_id, self.add.prompt_ids + self.generated, params, self.add.cls,
                     self.add.deadline, self.add.session)


def a_calls(cls: int, deadline: float | None) -> bool:
    """Whether work is a call's: realtime, or with a deadline (only calls' work has one)."""
    return cls == RequestClass.REALTIME or deadline is not None


class EngineClient:
    """One engine's requests, jobs and views, seen from one event loop.

    A call's work that a dead engine process took with it (realtime, or with a deadline: its final
    transcription, its reply, speculative or not, its speech) is not failed but held, and sent again once
    the restarted engine is up: a reply goes on from the tokens it had streamed, a job runs again. So a
    caller's turn survives a restart, late rather than lost, and one that starts during it waits too. Past
    `redo_within_s` they fail after all. Other work (text API requests, partial transcripts) fails at
    once: its clients retry, or need it no more.
    """

    def __init__(self, config: EngineConfig, info: dict[str, Any] | None = None) -> None:
        self.config = copy.copy(config)  # the knobs as this client last set them
        self.info: dict[str, Any] = info or {}
        self.alive = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._streams: dict[str, asyncio.Queue[Output]] = {}
        self._requests: dict[str, Sent] = {}
        self._jobs: dict[str, tuple[asyncio.Future, m.SubmitJob]] = {}  # job id -> (its future, as sent)
        self._held: set[str] = set()  # realtime requests and jobs waiting for the engine to be back
        self._holding = False  # the engine died and is being restarted: realtime work is held meanwhile
        self._give_up: asyncio.TimerHandle | None = None
        self.redo_within_s = REDO_WITHIN_S
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
        self._takes(cls, deadline)
        request_id = request_id or f"req-{next(_ids)}"
        box: asyncio.Queue[Output] = asyncio.Queue()
        sent = Sent(m.Add(request_id, [int(t) for t in prompt_ids], params, int(cls), deadline, session))
        self._streams[request_id], self._requests[request_id] = box, sent
        self._send_or_hold(request_id, sent.add)
        finished = False
        try:
            while not finished:
                out = await box.get()
                finished = out.finished
                if out.token_id is not None:
                    sent.generated.append(out.token_id)
                yield out
        finally:
            self._streams.pop(request_id, None)
            self._requests.pop(request_id, None)
            self._held.discard(request_id)
            if not finished and self.alive:
                self._send(m.Abort(request_id))

    def abort(self, request_id: str) -> None:
        self._send_if_alive(m.Abort(request_id))

    def set_deadline(self, request_id: str, deadline: float | None) -> None:
        """Move a request's deadline, e.g. to when its caller's buffered audio will run out."""
        if request_id in self._requests:
            self._requests[request_id].add.deadline = deadline
        self._send_if_alive(m.SetDeadline(request_id, deadline))

    def promote(self, request_id: str, cls: RequestClass, deadline: float | None, session: str | None) -> None:
        """Raise a request's class (a speculative reply whose turn was confirmed); see `Engine.promote`."""
        if request_id in self._requests:
            add = self._requests[request_id].add
            add.cls, add.deadline, add.session = int(cls), deadline, session
        self._send_if_alive(m.Promote(request_id, int(cls), deadline, session))

    def open_session(self, session: str) -> None:
        self._sessions.add(session)
        self._send_if_alive(m.OpenSession(session))

    def expect(self, session: str, until: float | None) -> None:
        """A call's caller may be finishing their turn: the engine keeps its steps short until `until`
        (None: no longer); see `Engine.expect`."""
        self._send_if_alive(m.Expect(session, until))

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
        """Run the engine's `kind` handler on `args`, most urgent first (between model steps, or on the
        engine's job lane beside them). A caller
        cancelled before the job starts takes it out of the queue."""
        self._takes(cls, deadline)
        job_id = f"job-{next(_ids)}"
        future = self._loop.create_future()
        submit = m.SubmitJob(job_id, kind, list(args), int(cls), deadline)
        self._jobs[job_id] = (future, submit)
        try:
            self._send_or_hold(job_id, submit)
            return await future
        except asyncio.CancelledError:
            self._send_if_alive(m.CancelJob(job_id))
            raise
        finally:
            self._jobs.pop(job_id, None)
            self._held.discard(job_id)

    def mean_job_seconds(self, kinds: tuple[str, ...]) -> float:
        """The mean duration of the jobs of these kinds so far (0 before any ran)."""
        times = [self._job_times.get(kind, (0.0, 0)) for kind in kinds]
        count = sum(n for _, n in times)
        return sum(t for t, _ in times) / count if count else 0.0

    def busy(self) -> bool:
        """Jobs in flight, a realtime request, or no engine to run anything: optional work had better wait."""
        return not self.alive or bool(self._jobs) or any(s.add.cls == RequestClass.REALTIME
                                                         for s in self._requests.values())

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
        future, submit = self._jobs[done.job_id]
        kind = submit.kind
        total, count = self._job_times.get(kind, (0.0, 0))
        self._job_times[kind] = (total + done.seconds, count + 1)
        if future.done():
            return
        if done.error is None:
            future.set_result(done.value)
        else:
            future.set_exception(JobFailed(done.error))

    def _lost(self, reason: str, restarting: bool = False) -> None:
        """The engine went away: every stream ends with an error, every job and view fails; while it is
        `restarting`, realtime work is held instead, to be sent again when it is back."""
        self._set_alive(False)
        if self._give_up is not None:
            self._give_up.cancel()
        self._held.clear()  # what is held is decided again, below
        self._holding = restarting and self._loop is not None
        for request_id, box in self._streams.items():
            sent = self._requests[request_id]
            if self._holding and a_calls(sent.add.cls, sent.add.deadline) and sent.again() is not None:
                self._held.add(request_id)
            else:
                box.put_nowait(Output(None, "", True, f"error: {reason}"))
        for job_id, (future, submit) in self._jobs.items():
            if self._holding and a_calls(submit.cls, submit.deadline):
                self._held.add(job_id)
            elif not future.done():
                future.set_exception(EngineUnavailable(reason))
        for future in self._answers.values():
            if not future.done():
                future.set_exception(EngineUnavailable(reason))
        if self._holding:
            self._give_up = self._loop.call_later(self.redo_within_s, self._fail_held, reason)

    def _fail_held(self, reason: str) -> None:
        """The engine was not back in time: what was held fails after all, and new realtime work too."""
        self._holding, self._give_up = False, None
        why = f"{reason}, and was not back within {self.redo_within_s:g} s"
        for key in self._held:
            if key in self._streams:
                self._streams[key].put_nowait(Output(None, "", True, f"error: {why}"))
            elif key in self._jobs and not self._jobs[key][0].done():
                self._jobs[key][0].set_exception(EngineUnavailable(why))
        self._held.clear()

    def _resume(self) -> None:
        """A (re)started engine: the live calls' sessions and the knobs as last set are sent again, then the
        realtime work held while it was down."""
        for session in self._sessions:
            self._send(m.OpenSession(session))
        if self._knobs:
            self._send(m.SetKnobs(dict(self._knobs)))
        if self._give_up is not None:
            self._give_up.cancel()
        self._holding, self._give_up = False, None
        for key in self._held:
            if key in self._requests:
                self._send(self._requests[key].again())
            elif key in self._jobs:
                self._send(self._jobs[key][1])
        self._held.clear()
        self._set_alive(True)

    def _takes(self, cls: RequestClass, deadline: float | None) -> None:
        """EngineUnavailable unless this work can be taken now: the engine is up, or it is restarting and
        the work is a call's (held until it is back)."""
        if not (self._holding and a_calls(cls, deadline)):
            self._ready_loop()

    def _send_or_hold(self, key: str, command: m.Command) -> None:
        if self.alive:
            self._send(command)
        else:
            self._held.add(key)

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
