"""The conversation's items as the client and the caller edit them: items created, read and deleted by the
client, and replies cut to what the caller heard of them (by a barge-in, a cancel or the client's truncate)."""

import time
from collections.abc import Callable

from voicepipe.pipeline.conversation import Conversation
from voicepipe.pipeline.events import Error, Event, ItemFound, PlaybackPaused, Played, Truncated
from voicepipe.pipeline.heard import RecentReplies
from voicepipe.pipeline.requests import ItemCreated, ItemRequested, TruncateRequested
from voicepipe.pipeline.turn import Turn


class Items:
    """Edits `conversation` for the LLM stage, which owns it; `heard` holds what the caller heard of the
    recent replies (from the output stage's `Played` and `PlaybackPaused`)."""

    def __init__(self, conversation: Conversation, emit: Callable[[Event], None]) -> None:
        self.conversation, self.emit = conversation, emit
        self.heard = RecentReplies()

    def created(self, event: ItemCreated) -> None:
        self.conversation.add(event.role, event.text, event.item_id)

    def requested(self, event: ItemRequested, cancel: Callable[[str], None]) -> None:
        """Read or delete an item; `cancel` the reply it is, if it is the one in progress."""
        item = self.conversation.get(event.item_id)
        if item is None:
            self.emit(Error("item_not_found", f"no conversation item {event.item_id!r}", event_id=event.event_id))
            return
        if event.action == "delete":
            cancel(event.item_id)
            self.conversation.delete(event.item_id)
        self.emit(ItemFound(event.item_id, event.action, item["role"], item["content"], item["spoken"]))

    def cut(self, turn: Turn, now: float, audio_end_ms: int | None = None) -> None:
        """The reply stops where the caller is (or where the client stopped playing it): its item keeps
        the words heard by then, and the output stage stops its audio."""
        said = self.heard.cut(turn, now, audio_end_ms)
        in_conversation = self.conversation.get(turn.output_item_id) is not None
        if in_conversation:
            self.conversation.truncate(turn.output_item_id, said)
        self.emit(Truncated(turn, said if in_conversation else None, audio_end_ms))

    def truncate(self, event: TruncateRequested) -> None:
        turn = self.heard.turn(event.item_id)
        if turn is None:
            self.emit(Error("item_not_found", f"no assistant item {event.item_id!r} to truncate"))
        else:
            self.cut(turn, time.monotonic(), event.audio_end_ms)

    def played(self, event: Played) -> bool:
        """A chunk of a reply's audio was scheduled for the caller; True when it is the reply's first."""
        heard = self.heard.of(event.turn)
        if heard is None:
            return False
        first = not heard.chunks
        heard.add(event.index, event.text, event.start, event.seconds, event.resumed, event.ends)
        return first

    def paused(self, event: PlaybackPaused) -> None:
        """The caller's speech stopped a reply's audio: what had played by then is all they heard, unless
        it resumes."""
        if event.at is not None and (heard := self.heard.of(event.turn)) is not None:
            heard.cut(event.at)

    def resumed(self, turn: Turn | None) -> None:
        """The caller only said "mm-hm": the reply plays on, and all of it counts as heard again."""
        if (heard := self.heard.of(turn)) is not None:
            heard.resume()

    def cut_playing(self, now: float) -> None:
        """Every reply whose audio is still playing stops, even a finished one."""
        for turn in self.heard.playing(now):
            self.cut(turn, now)
