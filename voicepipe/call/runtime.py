"""What a server needs, built once and shared by every call: a client of the engine that runs every
model's device work, the tokenizer, and the server's own metrics. The engine runs either on a thread of
this process (`start`, `load`: the notebook, the tests, one-shot commands) or in a process of its own
(`spawn`: `serve`, the replicas, the mixed-traffic bench), behind the same client interface."""

from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from scheduler import EngineConfig
from scheduler.channel.client import EngineClient
from scheduler.channel.local import LocalEngine
from voicepipe.backends.base import ASR, TTS
from voicepipe.backends.loading import (
    ModelOptions,
    build_engine,
    check_call_policy,
    engine_config,
    load_models,
    ready_engine,
    set_torch_threads,
    voice_info,
)
from voicepipe.mcp_servers import McpPolicy
from voicepipe.pipeline.tts_stage import SaidPhrases


@dataclass
class Runtime:
    engine: EngineClient
    tokenizer: Any
    model_id: str
    asr_rate: int
    tts_rate: int
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)  # the calls' and the API's metrics
    mcp: McpPolicy = field(default_factory=McpPolicy)  # the MCP servers calls may use
    # Learnt across calls: how long each client-run function takes (by name), and the set phrases' audio.
    function_times: dict[str, float] = field(default_factory=dict)
    said: SaidPhrases = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return self.engine.alive  # every engine is warmed up before it serves

    @classmethod
    def start(cls, model: Any, tokenizer: Any, asr: ASR, tts: TTS, config: EngineConfig | None = None) -> "Runtime":
        """An engine on a thread of this process, over models already loaded, warmed up before it starts."""
        config = config or EngineConfig()
        check_call_policy(config.policy)
        engine = ready_engine(model, tokenizer, asr, tts, config)
        client = LocalEngine(engine)
        client.start()
        return cls(client, tokenizer, **voice_info(model, asr, tts))

    @classmethod
    def load(cls, options: ModelOptions) -> "Runtime":
        """Load the models the options name and start their engine on a thread of this process."""
        config = engine_config(options)
        if options.torch_threads is not None:
            set_torch_threads(options, config)
        return cls.start(*load_models(options, config), config)

    @classmethod
    async def spawn(cls, options: ModelOptions) -> "Runtime":
        """Start the engine process, which loads and warms up every model; this process keeps only the
        tokenizer (for chat templates). RuntimeError if the engine cannot start."""
        from scheduler.channel.engine_process import ProcessEngine
        from voicepipe.backends.models import load_tokenizer

        config = engine_config(options)  # bad paths or placement fail here, before a process starts
        tokenizer = load_tokenizer(options.llm_model)
        engine = ProcessEngine(build_engine, config, options=options)  # the process is handed this very config
        await engine.start()
        info = engine.info
        return cls(engine, tokenizer, info["model_id"], info["asr_rate"], info["tts_rate"])


    async def metrics_text(self) -> bytes:
        """Every metric for /metrics: this process's (calls, API) and the engine's."""
        return generate_latest(self.registry) + await self.engine.metrics_text()

    async def close(self) -> None:
        await self.engine.stop()
