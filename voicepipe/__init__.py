"""voicepipe: a streaming voice assistant (ASR -> LLM -> TTS) on one deadline-aware scheduler."""

__version__ = "0.1.0"
