"""Calls from this machine instead of a websocket: `talk` through the microphone and speakers, and one recorded
turn from a file."""
