"""The events a call's client is told of that only the output stage and the session make: how its reply's
audio went out, each response's end, and the session as it stands.

With the pipeline's own events (transcripts, a reply's words, its calls, errors) they are everything a
serializer renders for the client's wire format; none of them is a message of any one format.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from voicepipe.pipeline.events import Event

if TYPE_CHECKING:
    from voicepipe.pipeline.turn import Reply, Turn


@dataclass(frozen=True, slots=True)
class SessionDescribed(Event):
    """The session as the client sees it (`Session.describe`), when the call starts or an update applied."""

    session: dict
    created: bool = False


@dataclass(frozen=True, slots=True)
class AudioSent(Event):
    """A piece of a reply's audio, sent when the caller's playback needs it: PCM16 at `sample_rate`."""

    turn: Turn
    pcm: np.ndarray
    sample_rate: int


@dataclass(frozen=True, slots=True)
class AudioEnded(Event):
    """The reply's last audio has been sent."""

    turn: Turn


@dataclass(frozen=True, slots=True)
class PlaybackCleared(Event):
    """The reply's audio still queued in the client must be dropped (the caller spoke over it, or it was
    cancelled)."""

    turn: Turn


@dataclass(frozen=True, slots=True)
class ResponseDone(Event):
    """A response ended: `status` completed or cancelled, `said` its item's final text (what the caller
    heard, for one cut off), `details` the turn's own numbers (timings, waterfall, deadline_met, underruns,
    and status_details when cancelled)."""

    turn: Turn
    reply: Reply
    status: str
    said: str
    details: dict


@dataclass(frozen=True, slots=True)
class StatsReported(Event):
    """The scheduler's view and this call's audio front end, for the web page's panel."""

    stats: dict


@dataclass(frozen=True, slots=True)
class McpListing(Event):
    """A session's MCP server is being listed (`described` None and no `failure`), or its listing ended."""

    item_id: str
    label: str
    described: tuple[dict, ...] | None = None
    failure: str | None = None
