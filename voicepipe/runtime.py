"""What a server needs, built once and shared by every call: the three models and the engine that runs
all of their device work. `serve`, the benchmarks and the tests all start from here."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from scheduler import Engine, EngineConfig, RequestClass, SamplingParams
from voicepipe.backends.base import ASR, TTS, chat_prompt_ids

if TYPE_CHECKING:
    from voicepipe.pipeline.asr_batch import ASRBatcher


@dataclass
class Runtime:
    engine: Engine
    tokenizer: Any
    asr: ASR
    tts: TTS
    asr_finals: "ASRBatcher" = field(init=False)  # final ASR passes of all calls, batched
    ready: bool = field(init=False, default=False)  # warmed up: the first caller waits for no lazy set-up

    def __post_init__(self) -> None:
        from voicepipe.pipeline.asr_batch import ASRBatcher  # here: the pipeline package imports this module

        self.asr_finals = ASRBatcher(self.engine, self.asr)

    @classmethod
    def load(cls, llm_model: str | Path | None = None, asr_model: str | Path | None = None,
             tts: TTS | None = None, policy: str = "o4", config: EngineConfig | None = None
             ) -> "Runtime":
        """Load the models (the embedded defaults unless paths or a TTS stage are given); start the engine."""
        from voicepipe.backends.asr_whisper import WhisperASR
        from voicepipe.backends.tts_piper import PiperTTS
        from voicepipe.models import load_llm

        model, tokenizer = load_llm(llm_model)
        return cls.start(model, tokenizer, WhisperASR(asr_model), tts or PiperTTS(), policy, config)

    @classmethod
    def start(cls, model: Any, tokenizer: Any, asr: ASR, tts: TTS, policy: str = "o4",
              config: EngineConfig | None = None) -> "Runtime":
        """Start an engine over models already loaded."""
        if policy not in ("o4", "fcfs"):
            raise ValueError(f"policy must be 'o4' or 'fcfs', not {policy!r}")
        engine = Engine(model, tokenizer, (config or EngineConfig()).with_knobs(policy=policy))
        engine.start()
        return cls(engine, tokenizer, asr, tts)

    async def warm_up(self) -> None:
        """Run each model once, so the first caller does not wait for lazy initialisation."""
        silence = np.zeros(self.asr.sample_rate, np.float32)
        await self.engine.run_job(lambda: self.asr.transcribe(silence), RequestClass.BATCH, kind="asr_warm_up")
        await self.engine.run_job(lambda: list(self.tts.synthesize("Hello.")), RequestClass.BATCH,
                                  kind="tts_warm_up")
        prompt = chat_prompt_ids(self.tokenizer, [{"role": "user", "content": "Hello."}])
        async for _ in self.engine.generate(prompt, SamplingParams(max_tokens=2), RequestClass.BATCH):
            pass
        self.ready = True

    def close(self) -> None:
        self.engine.stop()
