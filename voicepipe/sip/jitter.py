"""A small jitter buffer for a phone call's incoming packets: put back in order what the network reordered,
waiting at most `hold_s` for a missing packet before going on without it (counted lost, downstream).

A phone's ASR hears 20 ms packets; holding a few of them (60 ms by default) costs less than the reordering
it mends, and a packet that comes after its place has been given up is late: dropped, as a player would.
"""

from typing import Generic, TypeVar

Item = TypeVar("Item")


class JitterBuffer(Generic[Item]):
    def __init__(self, hold_s: float = 0.06) -> None:
        self.hold_s = hold_s
        self._next: int | None = None  # the sequence expected next
        self._held: dict[int, tuple[float, Item]] = {}

    def push(self, sequence: int, item: Item, now: float) -> list[tuple[int, Item]]:
        """A packet arrived: those now ready to play, in order (a late one is among them, for the caller
        to count; it is never held)."""
        if self._next is not None and sequence < self._next:
            return [(sequence, item)]
        if self._next is None:
            self._next = sequence
        self._held.setdefault(sequence, (now, item))
        return self.ready(now)

    def ready(self, now: float) -> list[tuple[int, Item]]:
        """The packets in order from the next expected; past a gap only once its oldest has waited `hold_s`."""
        out: list[tuple[int, Item]] = []
        while self._held:
            if self._next not in self._held:
                if now - min(arrival for arrival, _ in self._held.values()) < self.hold_s:
                    break
                self._next = min(self._held)  # the gap is given up on
            out.append((self._next, self._held.pop(self._next)[1]))
            self._next += 1
        return out
