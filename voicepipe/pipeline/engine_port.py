"""The engine as a call's stages use it, and nothing more: what `EngineClient` gives them (a thread or a
process behind it) and what the tests' fake engine implements."""

from collections.abc import AsyncIterator
from typing import Any, Protocol

from scheduler import Output, RequestClass, SamplingParams


class Engine(Protocol):
    def generate(self, prompt_ids: list[int], params: SamplingParams | None = None,
                 cls: RequestClass = RequestClass.INTERACTIVE, deadline: float | None = None,
                 session: str | None = None, request_id: str | None = None) -> AsyncIterator[Output]:
        """Stream a request's outputs; leaving the loop early aborts it."""

    async def run_job(self, kind: str, *args: Any, cls: RequestClass = RequestClass.INTERACTIVE,
                      deadline: float | None = None) -> Any:
        """Run a device job (an ASR pass, a TTS sentence) on the engine, most urgent first."""

    def set_deadline(self, request_id: str, deadline: float | None) -> None:
        """When the request must deliver its next tokens (the TTS stage's pacing)."""

    def promote(self, request_id: str, cls: RequestClass, deadline: float | None, session: str | None) -> None:
        """A reply begun ahead of the caller becomes the turn's."""

    def expect(self, session: str, until: float | None) -> None:
        """The caller is about to need the device until `until` (None: no longer)."""

    def mean_job_seconds(self, kinds: tuple[str, ...]) -> float:
        """How long jobs of these kinds have taken, for pacing."""

    def busy(self) -> bool:
        """Work is in flight that a caller waits on: optional work (a partial transcript) had better wait."""
