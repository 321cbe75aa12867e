"""The two clocks a driver can run an engine on: the wall clock (a real engine) and a virtual one."""

import time


class WallClock:
    """Real time: a step takes what it takes, waiting sleeps."""

    def now(self) -> float:
        return time.monotonic()

    def wait_until(self, t: float) -> None:
        time.sleep(max(0.0, t - time.monotonic()))


class VirtualClock:
    """Simulated time: it moves only when a priced step or job advances it, or a wait jumps it."""

    def __init__(self, start: float = 0.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"time cannot go back ({seconds} s)")
        self.t += seconds

    def wait_until(self, t: float) -> None:
        self.t = max(self.t, t)


class ThreadClock:
    """A real engine timed by the work its own thread did: this thread's CPU time, plus jumps.

    On cores shared with other processes, wall-clock time counts whatever they ran too (on 2 cores at a load
    average of 5, the same run took 13 to 70 s). A single-threaded engine's steps run on the calling thread,
    so its CPU time is what the steps cost this machine alone; waiting for an arrival costs no work and jumps.
    A device job that stands in for work (a priced ASR or TTS pass) advances it by its price.
    """

    def __init__(self) -> None:
        self.offset = 0.0

    def now(self) -> float:
        return time.thread_time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds

    def wait_until(self, t: float) -> None:
        self.offset += max(0.0, t - self.now())
