"""A real SIP phone for tests and benchmarks: drives a `baresip` 1.0.0 user agent over its ctrl_tcp
interface, so they can dial, answer, send DTMF and hear what they were sent against a real SIP/RTP stack.

baresip 1.0.0 has no file *player*, only a file *source* (`aufile`), so what a phone hears is taken from the
`sndfile` filter's dump of decoded audio; and when the source file ends, the `menu` module hangs the call up,
so every WAV it plays is followed by `tail` seconds of silence."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import soundfile as sf
import soxr

HOST = "127.0.0.1"


def free_port(*taken: int) -> int:
    """A loopback port free for both TCP and UDP (SIP listens on both) and not in `taken`."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
            tcp.bind((HOST, 0))
            port = tcp.getsockname()[1]
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
                try:
                    udp.bind((HOST, port))
                except OSError:
                    continue
        if port not in taken:
            return port


class Baresip:
    """One baresip process in a throwaway dir, without audio devices. From the start of each call it plays
    `source` (any WAV; silence if None) and records what it hears (see `recordings`).

    `codecs` is the account's G.711 offer, most preferred first: the caller's order decides. `auto_answer`
    answers every incoming call. `args` go to baresip (`-s` traces SIP, `-v` is verbose); everything it
    prints goes to `log_path`."""

    def __init__(
        self,
        source: Path | str | None = None,
        *,
        codecs: Sequence[str] = ("PCMU", "PCMA"),
        auto_answer: bool = False,
        user: str = "tester",
        tail: float = 60.0,
        grace: float = 3.0,
        args: Sequence[str] = (),
    ) -> None:
        self.source = Path(source) if source is not None else None
        self.codecs = tuple(codecs)
        self.auto_answer = auto_answer
        self.user = user
        self.tail = tail
        self.grace = grace
        self.args = tuple(args)
        self.events: list[dict[str, Any]] = []
        self.dir = Path()
        self.log_path = Path()
        self.sip_port = 0
        self.ctrl_port = 0
        self.rate = sf.info(str(self.source)).samplerate if self.source is not None else 8000
        self._made = False
        self._proc: asyncio.subprocess.Process | None = None
        self._log: IO[bytes] | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pump: asyncio.Task[None] | None = None
        self._replies: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._seen = asyncio.Condition()
        self._sent = 0

    @property
    def uri(self) -> str:
        """Where to dial this phone."""
        return f"sip:{self.user}@{HOST}:{self.sip_port}"

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def __aenter__(self) -> Baresip:
        self.dir = Path(tempfile.mkdtemp(prefix="baresip-"))
        self._made = True
        try:
            self._write_config()
            self.log_path = self.dir / "baresip.log"
            self._log = self.log_path.open("wb")
            argv = ["baresip", "-f", str(self.dir), *self.args]
            self._proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=self._log, stderr=self._log
            )
            await self._connect()
        except BaseException:
            await self._close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._close()

    async def _close(self) -> None:
        """Hang up, SIGTERM (baresip then sends its BYEs), SIGKILL after `grace`, remove the dir."""
        running = self._proc is not None and self._proc.returncode is None
        if self._writer is not None and running:
            with contextlib.suppress(Exception):
                await self.command("hangup", timeout=1.0)
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(BaseException):
                await self._pump
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()
        if self._proc is not None and self._proc.returncode is None:
            self._proc.terminate()
            try:
                await asyncio.wait_for(self._proc.wait(), self.grace)
            except TimeoutError:
                self._proc.kill()
                await self._proc.wait()
        if self._log is not None:
            self._log.close()
        if self._made:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _write_config(self) -> None:
        """Loopback only, G.711 only, no devices, no NAT helpers: nothing that waits on the outside world.
        `menu` is needed: it provides the commands (dial, hangup, sndcode, ...) and auto-answer."""
        self.sip_port = free_port()
        self.ctrl_port = free_port(self.sip_port)
        lines = [
            "poll_method epoll",
            f"net_interface {HOST}",  # an address; the name `lo` fails on 1.0.0
            f"sip_listen {HOST}:{self.sip_port}",
            "call_local_timeout 120",
            f"audio_source aufile,{self._padded(self.source)}",
            f"ausrc_srate {self.rate}",  # aufile insists the file is at this rate; baresip resamples to 8 kHz
            "audio_player none,none",  # no file player in 1.0.0; `sndfile` records instead
            "audio_alert none,none",
            "audio_level no",
            "rtp_stats no",
            "statmode_default off",  # else `menu` prints call statistics ten times a second
            "module_path /usr/lib/baresip/modules",
            "module g711.so",
            "module aufile.so",
            "module sndfile.so",
            f"snd_path {self.dir}",
            "module_tmp account.so",
            "module_app menu.so",
            "module_app ctrl_tcp.so",
            f"ctrl_tcp_listen {HOST}:{self.ctrl_port}",
        ]
        (self.dir / "config").write_text("\n".join(lines) + "\n")
        params = f";regint=0;audio_codecs={','.join(self.codecs)}"
        if self.auto_answer:
            params += ";answermode=auto"
        (self.dir / "accounts").write_text(f"<sip:{self.user}@{HOST}>{params}\n")

    def _padded(self, wav: Path | None) -> Path:
        """`wav` as aufile needs it (mono 16-bit at `rate`), then `tail` seconds of silence, as a new file."""
        audio = np.zeros(0, np.float32)
        if wav is not None:
            audio, rate = sf.read(str(wav), dtype="float32", always_2d=True)
            audio = audio.mean(axis=1)
            if rate != self.rate:
                audio = soxr.resample(audio, rate, self.rate)
        audio = np.concatenate([audio, np.zeros(int(self.tail * self.rate), np.float32)])
        path = self.dir / f"play-{len(list(self.dir.glob('play-*.wav'))) + 1}.wav"
        sf.write(str(path), audio, self.rate, subtype="PCM_16")
        return path

    async def _connect(self, timeout: float = 10.0) -> None:
        """ctrl_tcp listens once baresip is ready: retry until it does, or the process dies."""
        assert self._proc is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                reader, self._writer = await asyncio.open_connection(HOST, self.ctrl_port)
                break
            except OSError:
                if self._proc.returncode is not None:
                    raise RuntimeError(f"baresip exited {self._proc.returncode}:\n{self.log_text()}") from None
                if loop.time() > deadline:
                    raise TimeoutError(f"baresip's ctrl_tcp never listened:\n{self.log_text()}") from None
                await asyncio.sleep(0.05)
        self._pump = asyncio.create_task(self._read_loop(reader))

    def log_text(self) -> str:
        """What baresip has printed so far, for failure messages."""
        return self.log_path.read_text(errors="replace") if self.log_path.is_file() else ""

    # -- ctrl_tcp: netstrings of JSON ----------------------------------------------------------------------
    async def _read_loop(self, reader: asyncio.StreamReader) -> None:
        """Responses settle their command's future (by token); events are appended to `events`."""
        try:
            while True:
                length = int((await reader.readuntil(b":"))[:-1])
                message = json.loads((await reader.readexactly(length + 1))[:-1])
                if message.get("event"):
                    async with self._seen:
                        self.events.append(message)
                        self._seen.notify_all()
                elif (future := self._replies.pop(str(message.get("token")), None)) and not future.done():
                    future.set_result(message)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            for future in self._replies.values():
                if not future.done():
                    future.set_exception(ConnectionError("baresip's ctrl_tcp closed"))

    async def command(self, command: str, params: str = "", timeout: float = 5.0) -> dict[str, Any]:
        """Run a menu command (a long name from `help`, without the slash); baresip's response, e.g.
        `{"response": true, "ok": true, "data": "...", "token": "3"}`."""
        assert self._writer is not None, "use `async with Baresip(...)`"
        self._sent += 1
        token = str(self._sent)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._replies[token] = future
        payload = json.dumps({"command": command, "params": params, "token": token}).encode()
        self._writer.write(b"%d:%s," % (len(payload), payload))
        await self._writer.drain()
        try:
            return await asyncio.wait_for(future, timeout)
        finally:
            self._replies.pop(token, None)

    async def wait_event(self, type: str, timeout: float = 10.0, *, after: int = 0) -> dict[str, Any]:
        """The first event of `type` (CALL_ESTABLISHED, CALL_CLOSED, CALL_DTMF_START, ...) in `events[after:]`,
        waiting up to `timeout` seconds for it."""

        def found() -> dict[str, Any] | None:
            return next((e for e in self.events[after:] if e.get("type") == type), None)

        async with self._seen:
            try:
                await asyncio.wait_for(self._seen.wait_for(lambda: found() is not None), timeout)
            except TimeoutError:
                seen = [e.get("type") for e in self.events[after:]]
                raise TimeoutError(f"no {type} in {timeout}s, only {seen}; log: {self.log_path}") from None
            event = found()
        assert event is not None
        return event

    # -- the phone ---------------------------------------------------------------------------------------
    async def dial(self, uri: str) -> dict[str, Any]:
        return await self.command("dial", uri)

    async def answer(self) -> dict[str, Any]:
        """Accept the incoming call (after CALL_INCOMING), for a phone without `auto_answer`."""
        return await self.command("accept")

    async def hangup(self) -> dict[str, Any]:
        return await self.command("hangup")

    async def send_dtmf(self, digits: str) -> None:
        """Send `digits` (0-9, *, #, A-D) in the current call as RFC 4733 telephone-events, not SIP INFO.
        The far baresip reports each as CALL_DTMF_START (param: the digit), then CALL_DTMF_END."""
        for digit in digits:
            await self.command("sndcode", digit)

    async def play(self, wav: Path | str | None = None) -> dict[str, Any]:
        """Play `wav` (default: `source` again) from its start, now, in the current call."""
        return await self.command("ausrc", f"aufile,{self._padded(Path(wav) if wav else self.source)}")

    def recordings(self) -> list[Path]:
        """What this phone heard, one 8 kHz WAV per call, oldest first (named by the second the call's audio
        started); readable mid-call, as far as written so far."""
        return sorted(self.dir.glob("*-dec.wav"))
