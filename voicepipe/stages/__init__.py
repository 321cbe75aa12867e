"""The pluggable stages of a turn: speech recognition, language model and speech synthesis."""
