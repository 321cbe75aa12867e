"""The `openai` package's own Realtime server event types, and what is wrong with an event against them: a
missing or mistyped field, or one the types do not declare beyond this server's documented extensions."""

import typing

from openai.types.beta.realtime import RealtimeServerEvent as BetaServerEvent
from openai.types.realtime import RealtimeServerEvent
from pydantic import BaseModel, ValidationError

# This server's own additions, documented in DESIGN.md (Protocol): the session's scheduler knobs and limits,
# whether its echo canceller runs (docs/audio-front-end.md), whether a barge-in cancels the server's tool calls,
# a reply's timings, waterfall and deadline verdict; `id` and `object` on a session, as the Realtime API
# itself sends.
EXTENSIONS = {"session.id", "session.object", "session.scheduler", "session.limits", "session.echo_cancellation",
              "session.interrupt_tool_calls", "response.timings", "response.waterfall", "response.deadline_met",
              "response.underruns"}


def by_type(union: typing.Any) -> dict[str, type[BaseModel]]:
    """The union's event classes by the literal of their `type` field."""
    members = typing.get_args(typing.get_args(union)[0])
    return {typing.get_args(m.model_fields["type"].annotation)[0]: m for m in members}


GA_EVENTS, BETA_EVENTS = by_type(RealtimeServerEvent), by_type(BetaServerEvent)


def unknown_fields(model: typing.Any, path: str = "") -> list[str]:
    """Every field of `model` (recursively) that its type does not declare, by dotted path."""
    found = []
    if isinstance(model, BaseModel):
        found += [f"{path}.{k}".lstrip(".") for k in model.model_extra or {}]
        for name in type(model).model_fields:
            found += unknown_fields(getattr(model, name), f"{path}.{name}")
    elif isinstance(model, list):
        for item in model:
            found += unknown_fields(item, path)
    return found


def violations(event: dict, events: dict[str, type[BaseModel]]) -> list[str]:
    """What is wrong with one server event against its dialect's types (nothing: an empty list)."""
    kind = event.get("type")
    if kind not in events:
        return [f"{kind}: not an event of this dialect"]
    try:
        model = events[kind].model_validate(event)
    except ValidationError as e:
        # The beta's types list OpenAI's own model names; this server reports its own model.
        errors = [err for err in e.errors() if err["loc"] != ("session", "model")]
        if errors:
            return [f"{kind}: {err['loc']} {err['msg']}" for err in errors]
        model = events[kind].model_construct(**event)
        return [f"{kind}: {f}" for f in unknown_fields(model.session) if f"session.{f}" not in EXTENSIONS]
    return [f"{kind}: {f}" for f in unknown_fields(model) if f not in EXTENSIONS]
