"""Grammars compiled in a process beside the engine, one at a time, each within a budget of time and
memory: the engine's loop never waits for a compile, and one past its budget is abandoned for real.

Why a process and not a thread: xgrammar gives up the interpreter lock while it compiles (measured here:
a Python thread beside a compile kept 86-89% of its speed), so a thread would not slow the model steps
much; but a thread cannot be stopped, so a compile past its budget (an enum of 20,000 strings took 20 s
with xgrammar's default threads) would go on holding a core and every compile queued behind it. A
process is killed at the budget and started again (about 3 s: it imports xgrammar, which imports torch),
and its memory can be watched from outside. It runs at a lower priority than the engine, one thread.

The compiled grammar comes back serialized (xgrammar's JSON) and is rebuilt against the engine's own
tokenizer info: a few milliseconds for a schema within `schema_limits`.
"""

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from multiprocessing.connection import Connection
from typing import Any

from scheduler.grammar_cache import Key

log = logging.getLogger(__name__)
JSON_OBJECT = '{"type": "object"}'  # any object: OpenAI's json_object mode
NICENESS = 10  # compiles are throughput work: the engine's steps and the server go first
PAGE = os.sysconf("SC_PAGE_SIZE")
# The worker's entry, given its socket's descriptor (not `-m`: the package imports this module first).
LAUNCH = "import sys; from multiprocessing.connection import Connection; from scheduler.grammar_worker import serve; " \
    "serve(Connection(int(sys.argv[1])))"


class GrammarWorker:
    """Compiles what `submit` is given, in order; `poll` returns what finished (the grammar, or why
    not). A compile that runs past `budget_s`, or grows the process by more than `memory_bytes`, is
    abandoned: the process is killed and a new one started for the rest."""

    def __init__(self, tokenizer_info: str, budget_s: float, memory_bytes: int) -> None:
        self.tokenizer_info, self.budget_s, self.memory_bytes = tokenizer_info, budget_s, memory_bytes
        self.queue: deque[Key] = deque()
        self.restarts = 0
        self._current: tuple[Key, float] | None = None  # what the process compiles now, since when
        self._ready = False
        self._baseline = 0  # the process's resident bytes once ready
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
            except (EOFError, OSError):  # the process died on its own (a crash in the compiler)
                self._abandon(done, "invalid_grammar: the grammar compiler crashed on it")
                break
            if message[0] == "ready":
                self._ready, self._baseline = True, _resident(self._process.pid)
            else:
                key, compiled, error = message
                self._current = None
                done.append((key, compiled, error))
            self._next()
        self._watch(done)
        return done

    def close(self) -> None:
        self._process.kill()
        self._process.wait(5)
        self._conn.close()

    # -- inside --------------------------------------------------------------------------------------------
    def _start(self) -> None:
        """A new process, over a socket pair. A plain subprocess, not multiprocessing's: the engine process
        is itself a daemonic multiprocessing child, and those may not have children of their own."""
        ours, theirs = socket.socketpair()
        self._process = subprocess.Popen([sys.executable, "-c", LAUNCH, str(theirs.fileno())],
                                         pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        theirs.close()
        self._conn = Connection(ours.detach())
        # From a thread: the new process reads it only once it has imported its libraries (seconds), and the
        # engine's loop must not wait for that. Nothing else is sent before the process says it is ready.
        threading.Thread(target=_send, args=(self._conn, self.tokenizer_info), name="voicepipe-grammar-start",
                         daemon=True).start()
        self._ready, self._current = False, None

    def _next(self) -> None:
        if self._ready and self._current is None and self.queue:
            key = self.queue.popleft()
            self._conn.send(key)
            self._current = (key, time.monotonic())

    def _watch(self, done: list) -> None:
        """Abandon the compile in progress if it is past its budget of time or memory."""
        if self._current is None:
            return
        if time.monotonic() - self._current[1] > self.budget_s:
            self._abandon(done, f"grammar_too_complex: compiling it took longer than {self.budget_s:g} s")
        elif _resident(self._process.pid) - self._baseline > self.memory_bytes:
            self._abandon(done, f"grammar_too_complex: compiling it took more than {self.memory_bytes >> 20} MiB")

    def _abandon(self, done: list, error: str) -> None:
        if self._current is not None:
            done.append((self._current[0], None, error))
            log.warning("abandoned a grammar compile: %s", error)
        self._process.kill()
        self._process.wait(5)
        self._conn.close()
        self.restarts += 1
        self._start()


def _send(conn: Connection, message: Any) -> None:
    try:
        conn.send(message)
    except OSError:  # the process was killed before it read it: its successor gets its own
        pass


def _resident(pid: int) -> int:
    """A process's resident memory in bytes (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def serve(conn: Connection) -> None:
    """The worker process: read the tokenizer, then compile each key it is sent and send back the result,
    until its socket closes (the engine stopped, or died)."""
    os.nice(NICENESS)
    import xgrammar as xgr

    info = xgr.TokenizerInfo.deserialize_json(conn.recv())
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)  # the engine caches
    conn.send(("ready",))
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
    from scheduler.grammar import choice_ebnf

    if kind == "json_schema":
        return compiler.compile_json_schema(source, any_whitespace=False, strict_mode=True)
    if kind == "json_object":
        return compiler.compile_json_schema(JSON_OBJECT, any_whitespace=False, strict_mode=False)
    if kind == "regex":
        return compiler.compile_regex(source)
    if kind == "choice":
        return compiler.compile_grammar(choice_ebnf(source))
    return compiler.compile_structural_tag(source)
