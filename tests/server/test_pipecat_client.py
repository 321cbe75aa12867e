"""A real framework client end to end: Pipecat's `OpenAIRealtimeLLMService`, unchanged, pointed at a
voicepipe server (the fake engine behind it; real VAD). A context answered in text and speech, then a
spoken turn whose item Pipecat reads back: each a whole response, no error frame (Pipecat treats an error
event as fatal)."""

import asyncio
import wave
from importlib import resources

import numpy as np
import pytest
import soxr
from support.fake_call import fake_server

from voicepipe.call.limits import Limits

pipecat_frames = pytest.importorskip("pipecat.frames.frames")
from pipecat.pipeline.pipeline import Pipeline  # noqa: E402
from pipecat.pipeline.runner import PipelineRunner  # noqa: E402
from pipecat.pipeline.task import PipelineParams, PipelineTask  # noqa: E402
from pipecat.processors.aggregators.llm_context import LLMContext  # noqa: E402
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor  # noqa: E402
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService  # noqa: E402

F = pipecat_frames
QUESTION = "What is the capital of France?"
REPLY = "Paris is the capital of France."


class Listener(FrameProcessor):
    """What reaches the end of the pipeline: text, audio, each response's end, errors."""

    def __init__(self) -> None:
        super().__init__()
        self.text, self.audio_bytes, self.errors = [], 0, []
        self.ends = asyncio.Queue()

    async def process_frame(self, frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, F.ErrorFrame):
            self.errors.append(frame.error)
        elif isinstance(frame, F.TTSAudioRawFrame):
            self.audio_bytes += len(frame.audio)
        elif isinstance(frame, F.LLMTextFrame):
            self.text.append(frame.text)
        elif isinstance(frame, F.LLMFullResponseEndFrame):
            self.ends.put_nowait("".join(self.text))
            self.text = []
        await self.push_frame(frame, direction)


def question_frames() -> list:
    """The packaged spoken question and a second of silence, as 20 ms microphone frames at 24 kHz."""
    with resources.as_file(resources.files("voicepipe.samples") / "question.wav") as path, wave.open(str(path)) as w:
        rate, pcm = w.getframerate(), np.frombuffer(w.readframes(w.getnframes()), "<i2")
    pcm = np.concatenate([soxr.resample(pcm, rate, 24000).astype("<i2"), np.zeros(24000, "<i2")])
    return [F.InputAudioRawFrame(audio=pcm[i:i + 480].tobytes(), sample_rate=24000, num_channels=1)
            for i in range(0, len(pcm), 480)]


@pytest.mark.asyncio
async def test_pipecat_realtime_service_answers_a_context_and_a_spoken_turn():
    async with fake_server(Limits(), reply=REPLY, heard=QUESTION) as (server, _):
        llm = OpenAIRealtimeLLMService(api_key="unused", base_url=f"ws://127.0.0.1:{server.port}/v1/realtime",
                                       settings=OpenAIRealtimeLLMService.Settings(model="voicepipe"))
        listener, transcribed = Listener(), []
        llm.add_event_handler("on_conversation_item_updated",  # item None: a transcription completed
                              lambda _, item_id, item: item is None and transcribed.append(item_id))
        task = PipelineTask(Pipeline([llm, listener]), params=PipelineParams(audio_in_sample_rate=24000,
                                                                             audio_out_sample_rate=24000))
        runner = asyncio.create_task(PipelineRunner(handle_sigint=False).run(task))
        try:
            await task.queue_frame(F.LLMContextFrame(LLMContext([{"role": "user", "content": "Hello?"}])))
            assert await asyncio.wait_for(listener.ends.get(), 20) == REPLY
            spoken = listener.audio_bytes
            assert spoken > 0  # the reply was spoken too
            for frame in question_frames():
                await task.queue_frame(frame)
                await asyncio.sleep(0.002)
            assert await asyncio.wait_for(listener.ends.get(), 20) == REPLY
            assert listener.audio_bytes > spoken and transcribed
            item = await asyncio.wait_for(llm.retrieve_conversation_item(transcribed[-1]), 10)
            assert item.content[0].transcript == QUESTION  # the caller's turn, read back through retrieve
            assert listener.errors == []
        finally:
            await task.queue_frame(F.EndFrame())
            await asyncio.wait_for(runner, 20)


@pytest.mark.asyncio
async def test_pipecat_runs_a_function_the_server_calls_and_speaks_the_answer():
    from pipecat.adapters.schemas.function_schema import FunctionSchema
    from pipecat.adapters.schemas.tools_schema import ToolsSchema
    from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair

    from voicepipe.constrained import tools

    asked = "What is 37 times 43?"
    replies = {asked: tools.call_text("multiply", '{"a": 37, "b": 43}')}
    async with fake_server(Limits(), replies=replies) as (server, engine):
        llm = OpenAIRealtimeLLMService(api_key="unused", base_url=f"ws://127.0.0.1:{server.port}/v1/realtime",
                                       settings=OpenAIRealtimeLLMService.Settings(model="voicepipe"))
        ran = []

        async def multiply(params) -> None:
            ran.append(params.arguments)
            await params.result_callback(params.arguments["a"] * params.arguments["b"])

        llm.register_function("multiply", multiply)
        schema = FunctionSchema(name="multiply", description="The product of a and b.",
                                properties={"a": {"type": "integer"}, "b": {"type": "integer"}}, required=["a", "b"])
        context = LLMContext([{"role": "user", "content": asked}], tools=ToolsSchema(standard_tools=[schema]))
        aggregators = LLMContextAggregatorPair(context)
        listener = Listener()
        task = PipelineTask(Pipeline([aggregators.user(), llm, listener, aggregators.assistant()]),
                            params=PipelineParams(audio_in_sample_rate=24000, audio_out_sample_rate=24000))
        runner = asyncio.create_task(PipelineRunner(handle_sigint=False).run(task))
        try:
            await task.queue_frame(F.LLMRunFrame())
            answer = ""
            while "1591" not in answer:
                answer = await asyncio.wait_for(listener.ends.get(), 20)
            assert ran == [{"a": 37, "b": 43}] and answer == "The answer is 1591."
            assert listener.errors == [] and listener.audio_bytes > 0  # the answer, spoken
            assert engine.requests[0].params.grammar is not None  # the call was constrained
        finally:
            await task.queue_frame(F.EndFrame())
            await asyncio.wait_for(runner, 20)
