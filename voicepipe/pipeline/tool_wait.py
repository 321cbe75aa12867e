"""While the client runs a function the reply called: how long each function takes, learnt from its past
calls, and when the caller should hear a filler rather than silence.

The answer is due when the turn's first audio was (its deadline, from the caller's last word); the caller
hears the filler as soon as the function's expected time, and the answer written after it, would miss
that, or when the deadline comes with no result yet. A function never called before gets GRACE_S to
answer first: most return at once (a calculator in the page), and a filler cut short by its answer is
worse than none.
"""

from dataclasses import dataclass, field

GRACE_S = 0.3  # how long a function never called before may take before the caller hears a filler
ANSWER_S = 0.5  # from the function's result to the answer's first audio
SMOOTHING = 0.5  # each call's time weighs this much in the function's expected time
MAX_KEPT = 1024  # functions whose times are kept (shared by a server's calls, named by its clients): oldest go first


@dataclass
class ToolWait:
    """The functions' expected times, and the call the reply is waiting on."""

    expected_s: dict[str, float] = field(default_factory=dict)
    _waiting: tuple[tuple[str, ...], float] | None = None  # (functions called, when)

    def called(self, names: tuple[str, ...], now: float, deadline: float) -> float:
        """A reply called `names` at `now`; the answer is due at `deadline`. How long from now until the
        filler, if the result has not come by then."""
        self._waiting = (names, now)
        if any(name not in self.expected_s for name in names):
            return GRACE_S
        slack = deadline - now - ANSWER_S
        return 0.0 if max(self.expected_s[name] for name in names) > slack else max(0.0, slack)

    def answered(self, now: float) -> None:
        """The client sent a function's result: its time is learnt."""
        if self._waiting is None:
            return
        names, since = self._waiting
        self._waiting = None
        for name in names:
            took = now - since
            old = self.expected_s.get(name)
            if old is None and len(self.expected_s) >= MAX_KEPT:
                del self.expected_s[next(iter(self.expected_s))]
            self.expected_s[name] = took if old is None else (1 - SMOOTHING) * old + SMOOTHING * took

    @property
    def waiting(self) -> bool:
        return self._waiting is not None
