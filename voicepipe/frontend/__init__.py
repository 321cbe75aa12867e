"""The audio front end: what a microphone in a real room sends, cleaned before the VAD hears it.

Echo cancellation against the call's own reply audio (`reference`, `processing`), noise suppression, and
the stage that puts them first in a call's pipeline (`stage`).
"""
