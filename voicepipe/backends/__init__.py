"""The model adapters behind the pipeline, pluggable by name: speech recognition (Whisper), language
models (the mini-O4 engine, or transformers' `generate`) and speech synthesis (Piper, Coqui)."""
