"""One call's pipeline: VAD -> ASR -> LLM -> sentences -> TTS -> client, written as a list of stages."""

from voicepipe.pipeline.asr_stage import ASRStage
from voicepipe.pipeline.config import CallConfig
from voicepipe.pipeline.conversation import Conversation
from voicepipe.pipeline.llm_stage import LLMStage
from voicepipe.pipeline.output import ClientOutput, Send
from voicepipe.pipeline.sentences import SentenceAggregator
from voicepipe.pipeline.stage import Pipeline, Stage
from voicepipe.pipeline.tts_stage import TTSStage
from voicepipe.pipeline.vad_stage import VADStage
from voicepipe.runtime import Runtime
from voicepipe.vad import Endpointer

__all__ = ["CallConfig", "Conversation", "Pipeline", "Stage", "build_pipeline"]


def build_pipeline(runtime: Runtime, call_id: str, config: CallConfig, conversation: Conversation,
                   send: Send) -> Pipeline:
    """The stages of one call. The endpointer reads `config.turn_detection` live, so updates apply at once."""
    engine = runtime.engine
    endpointer = Endpointer(config.turn_detection, max_utterance_s=config.max_utterance_s,
                            early_pause_ms=config.early_final_ms)
    return Pipeline([
        VADStage(endpointer),
        ASRStage(engine, runtime.asr_rate, config),
        LLMStage(engine, runtime.tokenizer, conversation, config, call_id),
        SentenceAggregator(),
        TTSStage(engine, runtime.tts_rate),
        ClientOutput(send, runtime.registry, runtime.tts_rate),
    ])
