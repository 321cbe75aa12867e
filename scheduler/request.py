"""Requests, their classes and sampling settings, and the per-sequence state the scheduler moves."""

import enum
import itertools
import time
from dataclasses import dataclass, field

from scheduler.detokenizer import Detokenizer
from scheduler.grammar.constraint import Grammar


class RequestClass(enum.IntEnum):
    """Lower value is served first."""

    REALTIME = 0
    INTERACTIVE = 1
    BATCH = 2


# The tier before every class: pressing realtime decodes and realtime device jobs, weighed against each
# other by deadline (see `StepPlanner.urgency` and `jobs.make_job`).
PRESSING_TIER = -1


class Status(enum.Enum):
    WAITING_FOR_GRAMMAR = "waiting_for_grammar"  # its grammar compiles: holds nothing, planned once it is ready
    WAITING = "waiting"  # not admitted, or preempted: holds no pages
    RUNNING = "running"  # admitted: prefilling shard by shard, then decoding
    FINISHED = "finished"


@dataclass(slots=True)
class SamplingParams:
    max_tokens: int = 128
    temperature: float = 0.0  # 0 is greedy
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None
    # Report the probability that the next token is one of these, at each sampled position (`Output.probe`):
    # how a caller reads the model's own belief that, say, a sentence is over (its final punctuation or the
    # end-of-message token next).
    probe_tokens: tuple[int, ...] = ()
    # With `probe_tokens`: read the probe once, at this prompt position (the logits that predict the token
    # after it), in the request's own prefill, and report it with the first token. A reply so carries a
    # question about its own prompt (has the caller finished?) without a second request.
    probe_at: int | None = None
    grammar: Grammar | None = None  # what the output must match (constrained decoding), if anything


def check_request(prompt_ids: list[int], params: SamplingParams) -> None:
    """ValueError for a request no engine can run."""
    if not prompt_ids:
        raise ValueError("empty prompt")
    if params.max_tokens < 1:
        raise ValueError("max_tokens must be at least 1")
    if any(t < 0 for t in params.probe_tokens):
        raise ValueError("probe_tokens must be token ids")
    if params.probe_at is not None and not (params.probe_tokens and 0 <= params.probe_at < len(prompt_ids)):
        raise ValueError("probe_at must be a prompt position, with probe_tokens")
    if params.grammar is not None:
        params.grammar.check()


@dataclass(slots=True)
class Output:
    """One streamed piece of a request's answer."""

    token_id: int | None
    text: str
    finished: bool = False
    finish_reason: str | None = None
    probe: float | None = None  # P(next token in params.probe_tokens) where this token was sampled (or at
    # params.probe_at, with the first token)
    cached: int | None = None  # with the first token: how many prompt tokens were read from the KV cache


_ids = itertools.count()


@dataclass(eq=False)
class Sequence:
    """A request as the scheduler sees it: tokens, how many are in the KV cache, and its pages.

    Like vLLM v1 there is no prefill or decode phase flag: a sequence whose cached tokens lag its tokens by
    more than one is prefilling (a shard per step), otherwise the next step decodes it.
    """

    prompt_ids: list[int]
    params: SamplingParams
    cls: RequestClass = RequestClass.INTERACTIVE
    deadline: float | None = None
    session: str | None = None
    request_id: str = field(default_factory=lambda: f"req-{next(_ids)}")
    arrival: float = field(default_factory=time.monotonic)
    output_ids: list[int] = field(default_factory=list)
    num_cached: int = 0  # tokens whose K/V are in the cache
    reused: int = 0  # of those, the prompt tokens taken over from cached pages when it was admitted
    pages: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    finish_reason: str | None = None
    preemptions: int = 0
    first_token_at: float | None = None
    last_token_at: float | None = None
    detokenizer: Detokenizer | None = None  # made by the engine when the request is added
    page_keys: list[tuple] = field(default_factory=list)  # prefix-cache keys of its full pages so far
    probe: float | None = None  # read at params.probe_at, once its prefill got there
    last_step: int = -1  # the planner's count of the last step that carried it

    @property
    def probe_pending(self) -> bool:
        return self.params.probe_at is not None and self.probe is None

    @property
    def cacheable(self) -> list[int]:
        """The tokens whose cached pages it may take over: all but a position it must still compute to probe,
        and none for a seeded request. A seed promises the same answer every time, and a prefix taken from
        the cache was computed in other steps (other chunks, other batches) whose rounding differs enough to
        change a sampled token: measured with the default model, the second of four seeded requests parted
        from the first at about its 14th token."""
        if self.params.seed is not None:
            return []
        return self.tokens[:self.params.probe_at + 1] if self.probe_pending else self.tokens

    @property
    def text(self) -> str:
        """The answer's text streamed so far."""
        return self.detokenizer.text if self.detokenizer is not None else ""

    @property
    def tokens(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def remaining_prefill(self) -> int:
        """Tokens still to be put through the model before the next one can be sampled."""
        return self.num_tokens - self.num_cached
