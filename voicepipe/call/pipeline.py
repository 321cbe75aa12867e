"""One call's pipeline: audio front end -> VAD -> ASR -> turn-taking -> LLM -> sentences -> TTS -> client,
as a list of stages."""


from collections.abc import Callable

from voicepipe.call.runtime import Runtime
from voicepipe.frontend.stage import AudioFrontEnd, FrontEndStage
from voicepipe.mcp_servers import Toolbox
from voicepipe.pipeline.asr_stage import ASRStage
from voicepipe.pipeline.config import CallConfig
from voicepipe.pipeline.conversation import Conversation
from voicepipe.pipeline.llm_stage import LLMStage
from voicepipe.pipeline.output import ClientOutput, HangUp, Send
from voicepipe.pipeline.sentences import SentenceAggregator
from voicepipe.pipeline.stage import Pipeline
from voicepipe.pipeline.tts_stage import TTSStage
from voicepipe.turns.endpointer import Endpointer
from voicepipe.turns.turn_taking import TurnTaking
from voicepipe.turns.vad_stage import VADStage


def build_pipeline(runtime: Runtime, call_id: str, config: CallConfig, conversation: Conversation,
                   send: Send, describe: Callable[[], dict] = dict, front: AudioFrontEnd | None = None,
                   hang_up: HangUp | None = None, toolbox: Toolbox | None = None) -> Pipeline:
    """The stages of one call; `describe` gives the session as the client sees it, for `session.updated`;
    `hang_up` ends the call (after the goodbye to an idle caller); `toolbox` runs the tools of the MCP
    servers the session names.
    The endpointer reads `config.turn_detection` live, so updates apply at once. `front` is the audio front
    end, given where its far end is known better than the output stage's clock says (`talk`)."""
    engine = runtime.engine
    endpointer = Endpointer(config.turn_detection, max_utterance_s=config.max_utterance_s,
                            early_pause_ms=config.early_final_ms)
    return Pipeline([
        FrontEndStage(front or AudioFrontEnd(config)),
        VADStage(endpointer),
        ASRStage(engine, runtime.asr_rate, config),
        TurnTaking(engine, runtime.tokenizer, conversation, config, call_id),
        LLMStage(engine, runtime.tokenizer, conversation, config, call_id, toolbox, runtime.function_times),
        SentenceAggregator(),
        TTSStage(engine, runtime.tts_rate, lambda: config.synthesis_horizon_s, lambda: config.fillers,
                 runtime.said),
        ClientOutput(send, runtime.registry, runtime.tts_rate, describe, hang_up),
    ])
