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
