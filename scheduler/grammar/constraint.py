"""Constrained decoding: a request may carry a grammar its output must match, applied as a token mask
at sampling, row by row in the batch.

xgrammar does the work (compiling a JSON schema, a regex, a choice list or a structural tag against the
tokenizer, and a matcher per sequence). It was picked by measurement at the default 49k vocabulary on
the 2-core CPU: a mask per token in 3 us (llguidance 27 us, outlines-core 1.3 ms mean with 7 ms peaks),
a small schema compiled in ~5 ms. At 3 us a mask is a thousandth of a model step, so masks are filled on
the engine thread just before sampling; overlapping them with the step would not pay. A batch without
constrained rows never touches any of this.

Compiling is another matter: it grows with the schema (an enum of 20,000 strings took up to 20 s), so it
happens in a worker process (`grammar_worker`) under a budget, while the engine goes on stepping; a
request waits for its grammar outside the planner, holding no pages and no slot (vLLM's
WAITING_FOR_FSM).
"""

import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # a hint only: the command line loads this module (requests carry grammars) before torch
    import torch

from scheduler.grammar.cache import GrammarCache, Key
from scheduler.grammar.choice import choice_ebnf
from scheduler.grammar.schema_limits import check_schema
from scheduler.grammar.worker import GrammarWorker

Kind = Literal["json_schema", "json_object", "regex", "choice", "structural_tag"]
KINDS = ("json_schema", "json_object", "regex", "choice", "structural_tag")
# The magnitude a number without bounds of its own is held under: unbounded, a small model's greedy choice
# writes "1111..." until its length runs out (SmolLM2-135M did, for a city's population).
NUMBER_BOUND = 10**15
MAX_REFUSALS = 1024  # grammars that did not compile, remembered by digest


@dataclass(frozen=True, slots=True)
class Grammar:
    """What a request's output must match. `source` is text (a JSON schema or structural tag as JSON, a
    regex, the choices as a JSON list; empty for json_object), so a request crosses the process channel
    as it is and the engine compiles it there."""

    kind: Kind
    source: str = ""

    @classmethod
    def json_schema(cls, schema: dict[str, Any]) -> "Grammar":
        """The grammar of a schema within `schema_limits` (SchemaTooComplex past them)."""
        check_schema(schema)
        return cls("json_schema", json.dumps(bounded(schema)))

    @classmethod
    def choice(cls, options: list[str]) -> "Grammar":
        return cls("choice", json.dumps(options))

    @property
    def key(self) -> Key:
        return self.kind, self.source

    def check(self) -> None:
        """ValueError for a kind no engine knows, or a malformed choice list. Whether the grammar compiles
        is the compile worker's to say (`Constraints`): parsing a schema is work that grows with it, and
        belongs nowhere near an event loop or the engine's loop."""
        if self.kind not in KINDS:
            raise ValueError(f"unknown grammar kind {self.kind!r}")
        if self.kind == "choice":
            choice_ebnf(self.source)


class GrammarRefused(ValueError):
    """A grammar the engine would not compile: `code` is "grammar_too_complex" (past its compile budget)
    or "invalid_grammar" (it does not compile), `reason` says why."""

    def __init__(self, error: str) -> None:
        code, _, reason = error.partition(": ")
        super().__init__(reason or error)
        self.code, self.reason = code, reason or error


def bounded(schema: Any) -> Any:
    """`schema` with every integer or number that has no bound on a side held within +-NUMBER_BOUND there
    (xgrammar then allows finitely many digits)."""
    if isinstance(schema, list):
        return [bounded(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: bounded(v) for k, v in schema.items()}
    kinds = schema.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if "integer" in kinds or "number" in kinds:
        if "minimum" not in out and "exclusiveMinimum" not in out:
            out["minimum"] = -NUMBER_BOUND
        if "maximum" not in out and "exclusiveMaximum" not in out:
            out["maximum"] = NUMBER_BOUND
    return out


def _digest(key: Key) -> bytes:
    return hashlib.blake2b(f"{key[0]}\0{key[1]}".encode(errors="surrogatepass"), digest_size=16).digest()


class Constraints:
    """The engine's side: grammars compiled in the compile worker and kept in a bounded cache by their
    text, a matcher per constrained sequence, and the step's masks."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: set[int], budget_s: float, memory_bytes: int,
                 cache: GrammarCache) -> None:
        self.tokenizer, self.vocab_size, self.stop_ids = tokenizer, vocab_size, sorted(stop_ids)
        self.budget_s, self.memory_bytes, self.cache = budget_s, memory_bytes, cache
        self._info: Any = None  # the tokenizer as xgrammar reads it, built on the first grammar (~0.25 s)
        self._worker: GrammarWorker | None = None
        self._compiling: set[Key] = set()
        self._refused: OrderedDict[bytes, str] = OrderedDict()  # digest of a key -> why it did not compile
        self._matchers: dict[str, Any] = {}  # request id -> its matcher

    def compiled(self, grammar: Grammar) -> Any | None:
        """The grammar compiled, if it is in the cache."""
        return self.cache.get(grammar.key)

    def refusal(self, grammar: Grammar) -> str | None:
        """Why the grammar did not compile, if it failed lately: a client that sends the same hostile schema
        again is answered at once, without another budget's worth of compiling."""
        return self._refused.get(_digest(grammar.key))

    def compile(self, grammar: Grammar) -> None:
        """Have the worker compile `grammar` (once, however many ask meanwhile); `finished` says when."""
        if grammar.key in self._compiling:
            return
        if self._worker is None:
            try:
                info = self._tokenizer_info().serialize_json()
            except Exception as e:  # a tokenizer without a vocabulary (the random-weight benches' ids)
                raise ValueError(f"this engine's tokenizer cannot constrain output ({type(e).__name__}: {e})") from None
            self._worker = GrammarWorker(info, self.budget_s, self.memory_bytes)
        self._compiling.add(grammar.key)
        self._worker.submit(grammar.key)

    @property
    def pending(self) -> bool:
        """Whether a compile is queued or running."""
        return bool(self._compiling)

    def finished(self, wait_s: float = 0.0) -> list[tuple[Key, Any | None, str | None]]:
        """(key, the compiled grammar or None, the error or None) of each compile that ended since the last
        call, waiting up to `wait_s` for one; the compiled ones are cached."""
        import xgrammar as xgr

        if self._worker is None or not self._compiling:
            return []
        ended = []
        for key, serialized, error in self._worker.poll(wait_s):
            self._compiling.discard(key)
            compiled = None
            if serialized is not None:
                compiled = xgr.CompiledGrammar.deserialize_json(serialized, self._tokenizer_info())
                self.cache.put(key, compiled, compiled.memory_size_bytes)
            else:
                self._refused[_digest(key)] = error
                while len(self._refused) > MAX_REFUSALS:
                    self._refused.popitem(last=False)
            ended.append((key, compiled, error))
        return ended

    def add(self, request_id: str, compiled: Any) -> None:
        """A matcher for a new request, over its compiled grammar."""
        import xgrammar as xgr

        self._matchers[request_id] = xgr.GrammarMatcher(compiled)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()
            self._worker = None

    def _tokenizer_info(self) -> Any:
        import xgrammar as xgr

        if self._info is None:
            self._info = xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.vocab_size,
                                                            stop_token_ids=self.stop_ids)
        return self._info

    def drop(self, request_id: str) -> None:
        self._matchers.pop(request_id, None)

    @property
    def active(self) -> bool:
        """Whether any request is constrained (none: a step need not look)."""
        return bool(self._matchers)

    def mask(self, logits: "torch.Tensor", request_ids: list[str]) -> bool:
        """Forbid, in place, each constrained row's tokens its grammar does not allow next; False when no
        row of the step is constrained."""
        import xgrammar as xgr

        rows = [row for row, rid in enumerate(request_ids) if rid in self._matchers]
        if not rows:
            return False
        bitmask = xgr.allocate_token_bitmask(len(request_ids), logits.shape[-1])
        for row in rows:
            self._matchers[request_ids[row]].fill_next_token_bitmask(bitmask, row)
        xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), indices=rows)
        return True

    def accept(self, request_id: str, token: int) -> bool:
        """Advance the request's matcher by its sampled token; True when its grammar is complete."""
        matcher = self._matchers.get(request_id)
        if matcher is None:
            return False
        if not matcher.accept_token(token):
            raise RuntimeError(f"token {token} broke the grammar of {request_id}")
        return matcher.is_terminated()
