"""Smart Turn v3.2 (an audio model: is the sentence in the last 8 s of speech complete?), measured by
`bench turns` against the LLM's own verdict. Its int8 ONNX weights ship inside the `pipecat-ai` wheel,
installed without its dependencies and found without importing it; its input is Whisper's log-mel
features of the last 8 s, zero-padded at the front, which transformers' feature extractor computes."""

import functools
import importlib.util
from pathlib import Path

import numpy as np

from voicepipe.backends.threads import onnx_options

SECONDS = 8
RATE = 16000
MODEL = "audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx"


def smart_turn_path() -> Path | None:
    spec = importlib.util.find_spec("pipecat")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if (Path(folder) / MODEL).is_file():
            return Path(folder) / MODEL
    return None


class SmartTurn:
    """P(the utterance is complete) for 16 kHz float32 audio ending where the caller paused."""

    def __init__(self, path: Path) -> None:
        import onnxruntime
        from transformers import WhisperFeatureExtractor

        self.session = onnxruntime.InferenceSession(str(path), sess_options=onnx_options(threads=1),
                                                    providers=["CPUExecutionProvider"])
        self.features = WhisperFeatureExtractor(chunk_length=SECONDS)

    def __call__(self, audio: np.ndarray) -> float:
        audio = audio[-SECONDS * RATE:]
        audio = np.pad(audio, (SECONDS * RATE - len(audio), 0))
        features = self.features(audio, sampling_rate=RATE, return_tensors="np", do_normalize=True).input_features
        return float(self.session.run(None, {"input_features": features.astype(np.float32)})[0].ravel()[0])


@functools.cache
def load_smart_turn() -> SmartTurn | None:
    path = smart_turn_path()
    return SmartTurn(path) if path is not None else None
