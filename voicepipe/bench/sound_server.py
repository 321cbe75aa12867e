"""A PulseAudio server of one's own as the sound card, for `talk` on a machine without one.

Two null sinks: `speaker`, the default sink, whose monitor records what is played; and `mic`, whose monitor
is the default source, so what is played into `mic` is what a microphone hears. PortAudio reaches the server
through ALSA's pulse plugin, in real time both ways, as it would a sound card. Needs Debian's pulseaudio,
pulseaudio-utils and libasound2-plugins.
"""

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TOOLS = ("pulseaudio", "pactl", "paplay", "parec", "pacat")
SCRIPT = """\
load-module module-native-protocol-unix socket={socket} auth-anonymous=1
load-module module-null-sink sink_name=speaker
load-module module-null-sink sink_name=mic
set-default-sink speaker
set-default-source mic.monitor
"""


def available() -> bool:
    return all(shutil.which(tool) for tool in TOOLS)


@contextmanager
def sound_server(folder: Path) -> Iterator[str]:
    """Run the server from `folder`; its address is in PULSE_SERVER meanwhile, and PortAudio lists the
    devices again (it lists them once, at its start)."""
    script = folder / "sound.pa"
    script.write_text(SCRIPT.format(socket=folder / "native"))
    server = f"unix:{folder / 'native'}"
    daemon = subprocess.Popen(
        ["pulseaudio", "-n", "-F", str(script), "--daemonize=no", "--exit-idle-time=-1", "--use-pid-file=no",
         "--disable-shm=yes"],
        env={**os.environ, "HOME": str(folder), "XDG_RUNTIME_DIR": str(folder)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    before = os.environ.get("PULSE_SERVER")
    try:
        end = time.monotonic() + 30
        while subprocess.run(["pactl", "--server", server, "info"], capture_output=True).returncode:
            if daemon.poll() is not None or time.monotonic() > end:
                raise RuntimeError("pulseaudio did not start")
            time.sleep(0.1)
        os.environ["PULSE_SERVER"] = server
        import sounddevice

        sounddevice._terminate()
        sounddevice._initialize()
        yield server
    finally:
        if before is None:
            os.environ.pop("PULSE_SERVER", None)
        else:
            os.environ["PULSE_SERVER"] = before
        daemon.terminate()
        daemon.wait(30)
