"""Stand-ins for the models and the engine, for unit tests of the pipeline that run in milliseconds.

`FakeEngine` runs device jobs inline (through the real job handlers, over fake models) and answers LLM
requests with scripted replies, a word per token;
the fake tokenizer keeps the chat behind each prompt so the engine can tell which question it was asked.
They implement only what the pipeline calls, and record it, so tests can assert on what was asked of
the device.
"""

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scheduler import EngineConfig, RequestClass, SamplingParams
from scheduler.grammar.constraint import Grammar, GrammarRefused
from scheduler.request import Output
from voicepipe.backends.loading import device_jobs


class FakeTokenizer:
    """Each distinct "role: content" of a chat is one token id, each message closed by the end token (0)."""

    END = "<end>"

    def __init__(self) -> None:
        self.strings: list[str] = [self.END]
        self.eos_token_id = 0

    def get_vocab(self) -> dict[str, int]:
        return {text: i for i, text in enumerate(self.strings)}

    def apply_chat_template(self, messages: list[dict[str, str]], **_: Any) -> list[int]:
        ids = []
        for m in messages:
            text = f"{m['role']}: {m['content']}"
            if text not in self.strings:
                self.strings.append(text)
            ids += [self.strings.index(text), self.eos_token_id]
        return ids

    def last_message(self, ids: list[int]) -> str:
        said = [self.strings[i] for i in ids if i != self.eos_token_id]
        return said[-1] if said else ""

    def last_user_message(self, ids: list[int]) -> str:
        users = [self.strings[i] for i in ids if self.strings[i].startswith("user: ")]
        return users[-1].removeprefix("user: ") if users else ""


@dataclass
class Request:
    prompt: list[int]
    params: SamplingParams
    cls: RequestClass
    session: str | None
    request_id: str | None
    deadlines: list[float | None] = field(default_factory=list)
    tokens: int = 0
    closed: bool = False  # its stream was closed (finished, or aborted by the caller)


CONTINUING = {"of", "the", "a", "an", "is", "are", "to", "does", "do", "me", "there", "what", "and"}


def end_probability(text: str) -> float:
    """The fake LLM's belief that a sentence is finished: low after a word that wants more, as the real one's."""
    words = text.lower().split()
    return 0.001 if not words or words[-1] in CONTINUING else 0.9


class FakeEngine:
    """Jobs run at once; a request streams its scripted reply a word per token, each after `gate` opens
    (set by default: replies stream as fast as the event loop runs) if its question is `gated`. A request
    with a probe token gets the fake `end_probability` of its prompt's last user message; a prompt ending in
    a tool's output is answered by reading it out."""

    def __init__(self, tokenizer: FakeTokenizer, replies: dict[str, str] | None = None,
                 default_reply: str = "Yes.", asr: "FakeASR | None" = None, tts: "FakeTTS | None" = None) -> None:
        self.tokenizer, self.replies, self.default_reply = tokenizer, replies or {}, default_reply
        self.asr = asr or FakeASR("")  # what its device jobs hear: a test may change its words between turns
        self.handlers = device_jobs(self.asr, tts or FakeTTS())
        self.alive = True
        self.config = EngineConfig()
        self.max_context = 2048
        self.requests: list[Request] = []
        self.jobs: list[tuple[str, RequestClass]] = []
        self.promoted: list[tuple[str, RequestClass]] = []
        self.prepared: list = []  # grammars compiled ahead (as the engine's worker would), in order
        self.sessions: set[str] = set()  # the calls open
        self.expected: list[tuple[str, float | None]] = []  # the hints that a caller may be finishing, in order
        self.gate = asyncio.Event()
        self.gate.set()
        self.gated: Callable[[str], bool] = lambda question: True  # which questions' replies wait on `gate`

    def by_id(self, request_id: str) -> Request:
        return next(r for r in self.requests if r.request_id == request_id)

    async def generate(self, prompt_ids: list[int], params: SamplingParams | None = None,
                       cls: RequestClass = RequestClass.INTERACTIVE, deadline: float | None = None,
                       session: str | None = None, request_id: str | None = None) -> AsyncIterator[Output]:
        params = params or SamplingParams()
        request = Request(prompt_ids, params, cls, session, request_id, [deadline])
        self.requests.append(request)
        question = self.tokenizer.last_user_message(prompt_ids)
        last = self.tokenizer.last_message(prompt_ids)
        reply = f"The answer is {last.removeprefix('tool: ')}." if last.startswith("tool: ") \
            else self.replies.get(question, self.default_reply)
        words = reply.split()[:params.max_tokens]
        try:
            for n, word in enumerate(words):
                if self.gated(question):
                    await self.gate.wait()
                request.tokens += 1
                probe = end_probability(question) if params.probe_tokens and (n == 0 or params.probe_at is None) \
                    else None
                yield Output(n, word if n == 0 else " " + word, probe=probe)
            yield Output(None, "", True, "stop" if len(words) < params.max_tokens else "length")
        finally:
            request.closed = True

    async def run_job(self, kind: str, *args: Any, cls: RequestClass = RequestClass.INTERACTIVE,
                      deadline: float | None = None) -> Any:
        self.jobs.append((kind, cls))
        handler = self.handlers[kind]
        return handler.fn([args])[0] if handler.batch > 1 else handler.fn(*args)

    def mean_job_seconds(self, kinds: tuple[str, ...]) -> float:
        return 0.0

    def watch(self, callback: Callable[[bool], None]) -> None:
        pass

    async def prepare_grammar(self, grammar: Grammar) -> None:
        """As the engine's compile worker says: GrammarRefused for a schema or call format xgrammar cannot
        read (parsed here, not compiled: there is no vocabulary to compile against)."""
        import xgrammar as xgr

        self.prepared.append(grammar)
        try:
            if grammar.kind == "json_schema":
                xgr.Grammar.from_json_schema(grammar.source, any_whitespace=False, strict_mode=True)
            elif grammar.kind == "structural_tag":
                xgr.Grammar.from_structural_tag(grammar.source)
        except Exception as e:
            raise GrammarRefused(f"invalid_grammar: {str(e).splitlines()[0]}") from None

    def set_deadline(self, request_id: str, deadline: float) -> None:
        if any(r.request_id == request_id for r in self.requests):
            self.by_id(request_id).deadlines.append(deadline)

    def promote(self, request_id: str, cls: RequestClass, deadline: float | None, session: str | None) -> None:
        self.promoted.append((request_id, cls))

    def busy(self) -> bool:
        return False

    async def view(self, name: str) -> dict:
        return {}

    def open_session(self, session: str) -> None:
        self.sessions.add(session)

    def release_session(self, session: str) -> None:
        self.sessions.discard(session)

    def expect(self, session: str, until: float | None) -> None:
        self.expected.append((session, until))


class FakeASR:
    """Hears `text` in any audio; counts its passes."""

    sample_rate = 16000

    def __init__(self, text: str) -> None:
        self.text, self.passes = text, 0

    def transcribe(self, audio: np.ndarray) -> str:
        self.passes += 1
        return self.text


class FakeTTS:
    """A tenth of a second of a constant tone per word."""

    sample_rate = 16000

    def synthesize(self, text: str) -> Iterator[np.ndarray]:
        yield np.full(len(text.split()) * self.sample_rate // 10, 1000, np.int16)
