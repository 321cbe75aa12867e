"""The engine side of a client: applies commands between steps, steps, and sends one `StepOutputs` per
step. The thread driver and the process driver both run this loop; only their inbox and `send` differ."""

import logging
from collections.abc import Callable, Iterable

from scheduler.channel import messages as m
from scheduler.engine import Engine
from scheduler.jobs import make_job
from scheduler.request import RequestClass, Sequence
from scheduler.views import VIEWS

log = logging.getLogger(__name__)
Send = Callable[[m.Event], None]


def apply(engine: Engine, command: m.Command, send: Send) -> None:
    """Carry out one command; a bad one is answered, never raised into the loop."""
    match command:
        case m.Add():
            seq = Sequence(command.prompt_ids, command.params, RequestClass(command.cls), command.deadline,
                           command.session, command.request_id)
            try:
                engine.add_request(seq)
            except ValueError:
                pass  # the request has ended, its output saying why (the client checks first: rare)
        case m.Abort():
            engine.abort(command.request_id)
        case m.SetDeadline():
            engine.set_deadline(command.request_id, command.deadline)
        case m.Promote():
            engine.promote(command.request_id, RequestClass(command.cls), command.deadline, command.session)
        case m.OpenSession():
            engine.open_session(command.session)
        case m.Expect():
            engine.expect(command.session, command.until)
        case m.ReleaseSession():
            engine.release_session(command.session)
        case m.SetKnobs():
            try:
                engine.update_config(**command.knobs)
            except ValueError:
                log.warning("refused knobs %s", command.knobs)  # the client checked them first
        case m.SubmitJob():
            engine.submit_job(make_job(command.kind, tuple(command.args), RequestClass(command.cls),
                                       command.deadline, command.job_id))
        case m.CancelJob():
            engine.cancel_job(command.job_id)
        case m.Prepare():
            engine.prepare_grammar(command.query_id, command.grammar)
        case m.Query():
            try:
                send(m.Answer(command.query_id, VIEWS[command.view](engine)))
            except Exception as e:  # an unknown view or a failing one: the asker hears why
                send(m.Answer(command.query_id, None, f"{type(e).__name__}: {e}"))


def step(engine: Engine, send: Send) -> bool:
    """One unit of device work and its outputs sent; False when there was nothing to do."""
    try:
        worked = engine.step()
    except Exception:  # a fault outside the model step (a planner bug): fail what is in flight, go on
        log.exception("an engine step failed; failing every request in flight")
        for request_id in list(engine.requests):
            engine.abort(request_id, "error: the engine failed")
        worked = True
    flush(engine, send)
    return worked


def flush(engine: Engine, send: Send) -> None:
    outputs, results, answers = engine.take_outputs()
    if outputs or results:
        send(m.StepOutputs(outputs, [m.JobDone(r.job_id, r.value, r.error, r.seconds) for r in results]))
    for query_id, error in answers:
        send(m.Answer(query_id, None, error))


def has_work(engine: Engine) -> bool:
    return bool(engine.jobs) or engine.lane.busy or not engine.planner.idle or engine.constraints.pending


def run(engine: Engine, receive: Callable[[bool], Iterable[m.Command]], send: Send) -> None:
    """The loop: take every command waiting (blocking only while there is no work), then one step.
    Returns on `Shutdown`."""
    while True:
        for command in receive(not has_work(engine)):
            if isinstance(command, m.Shutdown):
                engine.close()
                return
            apply(engine, command, send)
        step(engine, send)  # its outputs carry those of the commands too (an abort's finish)
