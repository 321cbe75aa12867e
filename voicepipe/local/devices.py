"""The sound devices `talk` uses, found and checked before anything slow loads (this module imports
nothing heavy: a machine without a sound card hears so at once)."""

from dataclasses import dataclass
from types import ModuleType

Device = int | str | None  # a PortAudio device number, part of its name, or None for the system's default


class NoAudioDevice(OSError):
    """No sound device to talk through, or no PortAudio library to find one with."""

    def __init__(self, detail: object) -> None:
        super().__init__(f"no audio input/output device found ({detail})")


def portaudio() -> ModuleType:
    """sounddevice, imported on first use: importing it loads the PortAudio library, which may be missing."""
    try:
        import sounddevice
    except OSError as e:
        raise NoAudioDevice(e) from None
    return sounddevice


@dataclass(frozen=True)
class Devices:
    """The microphone and the speaker a call uses, and the rates they run at."""

    input: Device
    output: Device
    input_rate: int
    output_rate: int


def find_devices(input_device: Device = None, output_device: Device = None) -> Devices:
    """Check that both devices exist and take mono PCM16 at their own rate (before anything slow loads)."""
    sd = portaudio()
    try:
        input_rate = int(sd.query_devices(input_device, "input")["default_samplerate"])
        output_rate = int(sd.query_devices(output_device, "output")["default_samplerate"])
        sd.check_input_settings(input_device, channels=1, dtype="int16", samplerate=input_rate)
        sd.check_output_settings(output_device, channels=1, dtype="int16", samplerate=output_rate)
    except (sd.PortAudioError, ValueError) as e:  # ValueError: no device matches the name given
        raise NoAudioDevice(e) from None
    return Devices(input_device, output_device, input_rate, output_rate)
