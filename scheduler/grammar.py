"""Constrained decoding: a request may carry a grammar its output must match, applied as a token mask
at sampling, row by row in the batch.

xgrammar does the work (compiling a JSON schema, a regex, a choice list or a structural tag against the
tokenizer, and a matcher per sequence). It was picked by measurement at the default 49k vocabulary on
the 2-core CPU: a mask per token in 3 us (llguidance 27 us, outlines-core 1.3 ms mean with 7 ms peaks),
a schema compiled in ~5 ms. At 3 us a mask is a thousandth of a model step, so masks are filled on the
engine thread just before sampling; overlapping them with the step would not pay. A batch without
constrained rows never touches any of this.
"""

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # a hint only: the command line loads this module (requests carry grammars) before torch
    import torch

from scheduler.schema_limits import check_schema

Kind = Literal["json_schema", "json_object", "regex", "choice", "structural_tag"]
KINDS = ("json_schema", "json_object", "regex", "choice", "structural_tag")
JSON_OBJECT = '{"type": "object"}'  # any object: OpenAI's json_object mode
# The magnitude a number without bounds of its own is held under: unbounded, a small model's greedy choice
# writes "1111..." until its length runs out (SmolLM2-135M did, for a city's population).
NUMBER_BOUND = 10**15


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

    def check(self) -> None:
        """ValueError if the grammar cannot be compiled (needs no tokenizer: callers check before sending)."""
        import xgrammar as xgr

        try:
            if self.kind not in KINDS:
                raise ValueError(f"unknown grammar kind {self.kind!r}")
            if self.kind == "json_schema":
                xgr.Grammar.from_json_schema(self.source, any_whitespace=False, strict_mode=True)
            elif self.kind == "regex":
                xgr.Grammar.from_regex(self.source)
            elif self.kind == "choice":
                _choice_ebnf(self.source)
            elif self.kind == "structural_tag":
                xgr.Grammar.from_structural_tag(self.source)
        except ValueError:
            raise
        except Exception as e:  # xgrammar's own errors (RuntimeError, InvalidJSONError, ...) read as bad input
            raise ValueError(f"invalid {self.kind} grammar: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
                             ) from None


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


def _choice_ebnf(source: str) -> str:
    options = json.loads(source)
    if not isinstance(options, list) or not options or not all(isinstance(o, str) and o for o in options):
        raise ValueError("a choice grammar needs a non-empty list of non-empty strings")
    return "root ::= " + " | ".join(json.dumps(o) for o in options)


class Constraints:
    """The engine's side: grammars compiled once each (cached by their text), a matcher per constrained
    sequence, and the step's masks."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: set[int]) -> None:
        self.tokenizer, self.vocab_size, self.stop_ids = tokenizer, vocab_size, sorted(stop_ids)
        self._compiler: Any = None  # built on the first constrained request (~0.15 s)
        self._matchers: dict[str, Any] = {}  # request id -> its matcher

    def _compile(self, grammar: Grammar) -> Any:
        import xgrammar as xgr

        if self._compiler is None:
            info = xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=self.vocab_size,
                                                      stop_token_ids=self.stop_ids)
            self._compiler = xgr.GrammarCompiler(info, cache_enabled=True)
        c = self._compiler
        # Compact JSON (no free whitespace): a small model cannot pad its answer with blank lines forever.
        if grammar.kind == "json_schema":
            return c.compile_json_schema(grammar.source, any_whitespace=False, strict_mode=True)
        if grammar.kind == "json_object":
            return c.compile_json_schema(JSON_OBJECT, any_whitespace=False, strict_mode=False)
        if grammar.kind == "regex":
            return c.compile_regex(grammar.source)
        if grammar.kind == "choice":
            return c.compile_grammar(_choice_ebnf(grammar.source))
        return c.compile_structural_tag(grammar.source)

    def add(self, request_id: str, grammar: Grammar) -> None:
        """A matcher for a new request, whose grammar `check_request` has checked."""
        import xgrammar as xgr

        self._matchers[request_id] = xgr.GrammarMatcher(self._compile(grammar))

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
