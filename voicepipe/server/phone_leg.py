"""The phone leg of a media-stream call, as its packets arrive: each 20 ms `media` message carries its
sequence (`chunk`) and the caller's clock (`timestamp`, ms), so the server can tell packets lost on the
way, packets that came too late to be played in order, and the arrival jitter (RFC 3550's running
estimate). A lost packet becomes silence of its length, so the audio keeps the caller's clock (the VAD's
and the turn's times stay theirs); a late one is dropped, as a jitter buffer that has moved on would."""

from dataclasses import dataclass

from prometheus_client import Counter, Histogram

MAX_GAP = 50  # packets of silence put in for a gap at most (a second): a longer one is the stream's own pause


@dataclass
class PhoneLeg:
    received: int = 0
    lost: int = 0
    late: int = 0
    jitter_s: float = 0.0
    _next: int | None = None  # the sequence expected next
    _transit: float | None = None  # the last packet's arrival less its timestamp

    def packet(self, sequence: int, timestamp_ms: int, arrival_s: float) -> int | None:
        """One packet: how many packets of silence go before it (None: it is late, and dropped)."""
        if self._next is not None and sequence < self._next:
            self.late += 1  # it came after all: counted late, no longer lost (its silence has been played)
            self.lost = max(0, self.lost - 1)
            return None
        gap = 0 if self._next is None else sequence - self._next
        self.lost += gap
        self.received += 1
        self._next = sequence + 1
        transit = arrival_s - timestamp_ms / 1000
        if self._transit is not None:
            self.jitter_s += (abs(transit - self._transit) - self.jitter_s) / 16
        self._transit = transit
        return min(gap, MAX_GAP)

    def record(self, provider: str, packets: Counter, jitter: Histogram) -> None:
        """The call has ended: its packets by outcome, and its jitter."""
        for outcome, count in (("received", self.received), ("lost", self.lost), ("late", self.late)):
            packets.labels(provider, outcome).inc(count)
        if self.received > 1:
            jitter.labels(provider).observe(self.jitter_s)

    def figures(self) -> dict:
        return {"packets_received": self.received, "packets_lost": self.lost, "packets_late": self.late,
                "jitter_ms": round(1000 * self.jitter_s, 2)}
