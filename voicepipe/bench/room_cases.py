"""The rooms `bench room` puts a call in: echo of the reply through a synthetic room, noise, or both.
Apart from the bench, so the command line can list them without loading what the bench runs on."""

from dataclasses import dataclass

from voicepipe.bench.room import Room


@dataclass(frozen=True)
class RoomCase:
    name: str
    room: Room | None = None  # None: no echo
    noise: str | None = None
    snr_db: float = 20.0
    phone: bool = False  # the caller on a phone line: G.711 both ways (`bench.phone_line`)


CASES = [
    RoomCase("quiet"),
    RoomCase("echo +6 dB, 120 ms, RT60 0.45 s", Room(120, 0.45, 6.0, 1)),
    RoomCase("echo +0 dB, 40 ms, RT60 0.3 s", Room(40, 0.3, 0.0, 2)),
    RoomCase("echo +6 dB, 250 ms, RT60 0.5 s", Room(250, 0.5, 6.0, 3)),
    RoomCase("pink noise, 10 dB SNR", noise="pink", snr_db=10.0),
    RoomCase("babble, 10 dB SNR", noise="babble", snr_db=10.0),
    RoomCase("echo -6 dB, 200 ms + pink 15 dB", Room(200, 0.45, -6.0, 4), "pink", 15.0),
    RoomCase("phone speakerphone, echo +0 dB, 200 ms", Room(200, 0.4, 0.0, 5), phone=True),
    RoomCase("phone, no echo", phone=True),
]
