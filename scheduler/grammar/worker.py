"""Grammars compiled in a process beside the engine, one at a time, each within a budget of compute time
and memory: the engine's loop never waits for a compile, and one past its budget is abandoned for real.

Why a process and not a thread: xgrammar gives up the interpreter lock while it compiles (measured here:
a Python thread beside a compile kept 86-89% of its speed), so a thread would not slow the model steps
much; but a thread cannot be stopped, so a compile past its budget (an enum of 20,000 strings took 20 s
with xgrammar's default threads) would go on holding a core and every compile queued behind it. A
process is killed at the budget, and its memory can be watched from outside.

A new worker would take about 3 s to start (xgrammar imports torch), and under a stream of hostile
schemas every compile queued behind a killed one would wait that out (the soak bench measured 20 s). So
one seed process imports xgrammar once, at a lower priority than the engine, and forks each worker from
itself: a fresh worker in milliseconds. Plain subprocesses and fork, not multiprocessing: the engine
process is a daemonic multiprocessing child, and those may not have children of their own.

The budget is compute time (the worker's own CPU seconds), so a grammar is judged by how hard it is, not
by how busy the machine is; a wall-clock bound of `WALL_FACTOR` times it caps how long a client waits. The
compiled grammar comes back serialized (xgrammar's JSON) and is rebuilt against the engine's own tokenizer
info: a few milliseconds for a schema within `schema_limits`.
"""

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from multiprocessing.connection import Connection
from typing import Any

from scheduler.grammar.cache import Key
from scheduler.grammar.choice import choice_ebnf

log = logging.getLogger(__name__)
JSON_OBJECT = '{"type": "object"}'  # any object: OpenAI's json_object mode
NICENESS = 5  # compiles are throughput work: the engine's steps and the server go first
WALL_FACTOR = 2.0  # a compile that has not finished in this many budgets of wall-clock time is abandoned too
PAGE = os.sysconf("SC_PAGE_SIZE")
TICK = os.sysconf("SC_CLK_TCK")
# The seed's entry, given its socket's descriptor (not `-m`: the package imports this module first).
LAUNCH = "import sys; from scheduler.grammar.worker import seed; seed(int(sys.argv[1]))"


class GrammarWorker:
    """Compiles what `submit` is given, in order; `poll` returns what finished (the grammar, or why
    not). A compile that takes more than `budget_s` of compute (or WALL_FACTOR times it in all), or grows
    the worker by more than `memory_bytes`, is abandoned: the worker is killed, a fresh one forked."""

    def __init__(self, tokenizer_info: str, budget_s: float, memory_bytes: int) -> None:
        self.tokenizer_info, self.budget_s, self.memory_bytes = tokenizer_info, budget_s, memory_bytes
        self.queue: deque[Key] = deque()
        self.restarts = 0
        self._launch_seed()
        self._start()

    @property
    def pending(self) -> bool:
        return bool(self.queue) or self._current is not None

    def submit(self, key: Key) -> None:
        self.queue.append(key)
        self._next()

    def poll(self, wait_s: float = 0.0) -> list[tuple[Key, str | None, str | None]]:
        """(key, the compiled grammar as xgrammar's JSON or None, the error or None) for each compile that
        ended, waiting up to `wait_s` for the first."""
        done: list[tuple[Key, str | None, str | None]] = []
        while self._conn.poll(wait_s if not done else 0):
            try:
                message = self._conn.recv()
            except (EOFError, OSError):  # the worker died on its own (a crash in the compiler)
                self._abandon(done, "invalid_grammar: the grammar compiler crashed on it")
                break
            if message[0] == "ready":
                self._ready, self._pid = True, message[1]
                self._baseline = _resident(self._pid)
            else:
                key, compiled, error = message
                self._current = None
                done.append((key, compiled, error))
            self._next()
        self._watch(done)
        return done

    def close(self) -> None:
        self._kill()
        self._conn.close()
        self._seed_socket.close()  # the seed reads the end of its socket and exits
        self._seed.kill()
        self._seed.wait(5)

    # -- inside --------------------------------------------------------------------------------------------
    def _launch_seed(self) -> None:
        ours, theirs = socket.socketpair()
        self._seed = subprocess.Popen([sys.executable, "-c", LAUNCH, str(theirs.fileno())],
                                      pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        theirs.close()
        self._seed_socket = ours

    def _start(self) -> None:
        """Ask the seed for a fresh worker over a new socket pair (a new seed, if this one is gone); the
        worker says it is ready when it has read the tokenizer (sent from a thread: a seed still importing
        forks it only seconds later, and the engine's loop must not wait for that)."""
        ours, theirs = socket.socketpair()
        try:
            socket.send_fds(self._seed_socket, [b"fork"], [theirs.fileno()])
        except OSError:  # the seed died (killed from outside): start another, which forks on its start
            log.warning("the grammar seed process was gone; starting another")
            self._seed_socket.close()
            self._seed.wait(5)
            self._launch_seed()
            socket.send_fds(self._seed_socket, [b"fork"], [theirs.fileno()])
        theirs.close()
        self._conn = Connection(ours.detach())
        threading.Thread(target=_send, args=(self._conn, self.tokenizer_info), name="voicepipe-grammar-start",
                         daemon=True).start()
        self._ready, self._pid, self._baseline = False, None, 0
        self._current: tuple[Key, float, float] | None = None  # what it compiles now: since when, its CPU then

    def _next(self) -> None:
        if self._ready and self._current is None and self.queue:
            key = self.queue.popleft()
            self._conn.send(key)
            self._current = (key, time.monotonic(), _cpu_seconds(self._pid))

    def _watch(self, done: list) -> None:
        """Abandon the compile in progress if it is past its budget of compute, time or memory."""
        if self._current is None:
            return
        _, started, cpu = self._current
        if _cpu_seconds(self._pid) - cpu > self.budget_s:
            self._abandon(done, f"grammar_too_complex: compiling it took more than {self.budget_s:g} s")
        elif time.monotonic() - started > WALL_FACTOR * self.budget_s:
            self._abandon(done, f"grammar_too_complex: compiling it did not finish within "
                                f"{WALL_FACTOR * self.budget_s:g} s")
        elif _resident(self._pid) - self._baseline > self.memory_bytes:
            self._abandon(done, f"grammar_too_complex: compiling it took more than {self.memory_bytes >> 20} MiB")

    def _abandon(self, done: list, error: str) -> None:
        if self._current is not None:
            done.append((self._current[0], None, error))
            log.warning("abandoned a grammar compile: %s", error)
        self._kill()
        self._conn.close()
        self.restarts += 1
        self._start()

    def _kill(self) -> None:
        if self._pid is not None:
            try:
                os.kill(self._pid, signal.SIGKILL)  # the seed's child: the seed reaps it
            except ProcessLookupError:
                pass


def _send(conn: Connection, message: Any) -> None:
    try:
        conn.send(message)
    except OSError:  # the worker was killed before it read it: its successor gets its own
        pass


def _resident(pid: int | None) -> int:
    """A process's resident memory in bytes (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def _cpu_seconds(pid: int | None) -> float:
    """The CPU time a process has used, user and system (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / TICK
    except (OSError, IndexError, ValueError):
        return 0.0


def seed(fd: int) -> None:
    """The seed process: import xgrammar once, then fork a worker for each socket it is handed, until its
    own socket closes (the engine stopped, or died)."""
    os.nice(NICENESS)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # workers that end, or are killed, are reaped at once
    import xgrammar  # noqa: F401  (what every worker needs, loaded before any fork)

    own = socket.socket(fileno=fd)
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(own, 16, 1)
        except OSError:
            return
        if not message:
            return
        if os.fork() == 0:
            own.close()
            serve(Connection(fds[0]))
            os._exit(0)
        os.close(fds[0])


def serve(conn: Connection) -> None:
    """A worker: read the tokenizer, then compile each key it is sent and send back the result, until its
    socket closes."""
    import xgrammar as xgr

    try:
        info = xgr.TokenizerInfo.deserialize_json(conn.recv())
    except (EOFError, OSError):
        return
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)  # the engine caches
    conn.send(("ready", os.getpid()))
    while True:
        try:
            key = conn.recv()
        except (EOFError, OSError):
            return
        try:
            conn.send((key, compile_grammar(compiler, *key).serialize_json(), None))
        except Exception as e:  # xgrammar's own errors (RuntimeError, InvalidJSONError, ...) read as bad input
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            conn.send((key, None, f"invalid_grammar: the {key[0]} grammar does not compile: {first}"))


def compile_grammar(compiler: Any, kind: str, source: str) -> Any:
    """One grammar, as the engine's masks read it. JSON is compact (no free whitespace): a small model
    cannot pad its answer with blank lines forever."""
    if kind == "json_schema":
        return compiler.compile_json_schema(source, any_whitespace=False, strict_mode=True)
    if kind == "json_object":
        return compiler.compile_json_schema(JSON_OBJECT, any_whitespace=False, strict_mode=False)
    if kind == "regex":
        return compiler.compile_regex(source)
    if kind == "choice":
        return compiler.compile_grammar(choice_ebnf(source))
    return compiler.compile_structural_tag(source)
