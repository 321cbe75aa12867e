"""What crosses between a client and the engine: typed commands in, typed events out, never closures or
model objects. The thread driver passes these objects as they are; the process driver sends them as
MessagePack (msgspec), numpy arrays as raw bytes in an extension type, so audio crosses without a copy
into Python lists.

Deadlines are `time.monotonic()` values: on Linux that clock is the system's, shared by every process.
"""

from typing import Any

import msgspec
import numpy as np

from scheduler.grammar.constraint import Grammar
from scheduler.request import Output, SamplingParams


class Command(msgspec.Struct, tag=True, array_like=True):
    """Client to engine."""


class Add(Command):
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    cls: int
    deadline: float | None = None
    session: str | None = None


class Abort(Command):
    request_id: str


class SetDeadline(Command):
    request_id: str
    deadline: float | None


class Promote(Command):
    request_id: str
    cls: int
    deadline: float | None
    session: str | None


class OpenSession(Command):
    session: str


class Expect(Command):
    session: str
    until: float | None


class ReleaseSession(Command):
    session: str


class SetKnobs(Command):
    knobs: dict[str, int]


class SubmitJob(Command):
    job_id: str
    kind: str
    args: list[Any]
    cls: int
    deadline: float | None = None


class CancelJob(Command):
    job_id: str


class Prepare(Command):
    """Compile a grammar ahead of the requests that will use it; answered (an `Answer` whose error says
    why not, if it cannot be) once it is compiled."""

    query_id: int
    grammar: Grammar


class Query(Command):
    """Ask for one of `scheduler.views.VIEWS`; the answer comes back as an `Answer`."""

    query_id: int
    view: str


class Shutdown(Command):
    pass


class Event(msgspec.Struct, tag=True, array_like=True):
    """Engine to client."""


class Ready(Event):
    """The engine is up: what a client needs to know of it."""

    info: dict[str, Any]


class JobDone(Event):
    job_id: str
    value: Any
    error: str | None
    seconds: float


class StepOutputs(Event):
    """Everything one step produced: each request's new tokens and finishes, and the jobs it ran."""

    tokens: list[tuple[str, Output]]
    jobs: list[JobDone]


class Answer(Event):
    query_id: int
    value: Any
    error: str | None = None


class StartFailed(Event):
    """The engine could not load its models; it exits after this."""

    error: str


COMMANDS = Add | Abort | SetDeadline | Promote | OpenSession | Expect | ReleaseSession | SetKnobs | SubmitJob \
    | CancelJob | Prepare | Query | Shutdown
EVENTS = Ready | JobDone | StepOutputs | Answer | StartFailed
_NDARRAY = 1


def _encode_extra(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        header = msgspec.msgpack.encode((obj.dtype.str, obj.shape))
        return msgspec.msgpack.Ext(_NDARRAY, len(header).to_bytes(2, "little") + header
                                   + np.ascontiguousarray(obj).tobytes())
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot send a {type(obj).__name__} to or from the engine")


def _decode_extra(code: int, data: memoryview) -> Any:
    if code != _NDARRAY:
        raise ValueError(f"unknown extension type {code}")
    size = int.from_bytes(data[:2], "little")
    dtype, shape = msgspec.msgpack.decode(data[2:2 + size])
    return np.frombuffer(data[2 + size:], dtype=dtype).reshape(shape).copy()


class Codec:
    """One encoder and the two typed decoders, made once per connection end."""

    def __init__(self) -> None:
        self._encoder = msgspec.msgpack.Encoder(enc_hook=_encode_extra)
        self._commands = msgspec.msgpack.Decoder(COMMANDS, ext_hook=_decode_extra)
        self._events = msgspec.msgpack.Decoder(EVENTS, ext_hook=_decode_extra)

    def encode(self, message: Command | Event) -> bytes:
        return self._encoder.encode(message)

    def command(self, data: bytes) -> Command:
        return self._commands.decode(data)

    def event(self, data: bytes) -> Event:
        return self._events.decode(data)

