"""Which packets arriving from the caller's address are the caller's stream, numbered on one count for the
whole call (after RFC 3550's appendix A.1).

A packet whose sequence number lies far from the stream's (a jump of more than `MAX_DROPOUT` ahead or
`MAX_MISORDER` behind), or whose SSRC is another, is not taken on its own word: stray or forged packets
would otherwise move the count so far that every packet the caller sends after them reads as late, and the
caller goes unheard. Two such packets in sequence are a restart (a PBX re-bridging the call sends a new
SSRC and a new sequence): the count goes on from where it was, so what is downstream sees no jump.
"""

from voicepipe.sip.rtp_packet import sequence_unwrapped

MAX_DROPOUT = 3000  # packets ahead taken as loss (a minute of 20 ms packets)
MAX_MISORDER = 100  # packets behind taken as reordered or late


class RtpSource:
    def __init__(self) -> None:
        self.ssrc: int | None = None
        self.restarts = 0
        self._highest: int | None = None  # the highest sequence taken, unwrapped
        self._offset = 0  # from the stream's unwrapped sequence to the call's count
        self._probation: tuple[int, int] | None = None  # (ssrc, sequence) that would confirm a restart

    def number(self, ssrc: int, sequence: int) -> int | None:
        """The packet's place on the call's count, or None: not (yet) taken as the caller's stream."""
        if self._highest is None:
            return self._restart(ssrc, sequence, sequence)
        if ssrc == self.ssrc:
            ahead = (sequence - self._highest) & 0xFFFF
            if ahead < MAX_DROPOUT or ahead > 0x10000 - MAX_MISORDER:
                self._probation = None
                unwrapped = sequence_unwrapped(self._highest, sequence)
                self._highest = max(self._highest, unwrapped)
                return unwrapped + self._offset
        if self._probation == (ssrc, sequence):
            self.restarts += 1
            return self._restart(ssrc, sequence, self._highest + self._offset + 1)
        self._probation = (ssrc, (sequence + 1) & 0xFFFF)
        return None

    def _restart(self, ssrc: int, sequence: int, number: int) -> int:
        """The stream is (again) `ssrc`'s, from `sequence`, which takes `number` on the call's count."""
        self.ssrc, self._highest, self._offset, self._probation = ssrc, sequence, number - sequence, None
        return number
