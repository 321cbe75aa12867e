"""The Coqui TTS stage, on a tiny randomly initialised VITS model built here (no model can be downloaded).

The model speaks noise, not words, but it goes through the same save, load and synthesis paths as a
trained one. It reads characters, not phonemes, so no phonemizer is involved.
"""

import json
import socket
import sys
from pathlib import Path

import numpy as np
import pytest

from voicepipe.backends.models import ModelError
from voicepipe.backends.tts_select import make_tts

RATE = 16000
TWO_SENTENCES = "Hello there. How are you today?"


def build_tiny_vits(folder: Path) -> Path:
    """Save a randomly initialised VITS (a few hundred thousand weights) with its config.json."""
    import torch
    from TTS.tts.configs.shared_configs import BaseAudioConfig, CharactersConfig
    from TTS.tts.configs.vits_config import VitsArgs, VitsConfig
    from TTS.tts.models.vits import Vits

    characters = CharactersConfig(
        characters_class="TTS.tts.models.vits.VitsCharacters", characters="abcdefghijklmnopqrstuvwxyz ",
        punctuations=".,!?'-", pad="_", eos="", bos="", blank=None, phonemes=None)
    args = VitsArgs(
        hidden_channels=16, hidden_channels_ffn_text_encoder=32, num_layers_text_encoder=1,
        num_layers_posterior_encoder=1, num_layers_flow=1, use_sdp=False, init_discriminator=False,
        out_channels=129, upsample_initial_channel_decoder=16, upsample_rates_decoder=[8, 8, 4],
        upsample_kernel_sizes_decoder=[16, 16, 8], resblock_kernel_sizes_decoder=[3],
        resblock_dilation_sizes_decoder=[[1, 3, 5]])
    # hop_length is the product of the decoder's upsample rates: one spectrogram frame per 256 samples.
    audio = BaseAudioConfig(sample_rate=RATE, fft_size=256, win_length=256, hop_length=256, num_mels=20)
    config = VitsConfig(model_args=args, audio=audio, characters=characters, use_phonemes=False,
                        text_cleaner="basic_cleaners", add_blank=False, test_sentences=[])
    with torch.random.fork_rng(devices=[]):  # seeded for repeatable weights, leaving the global RNG as it was
        torch.manual_seed(0)
        model = Vits(config)
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model.state_dict()}, folder / "model.pth")
    config.save_json(str(folder / "config.json"))
    return folder


@pytest.fixture(scope="module")
def vits_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("TTS.api", reason="coqui-tts is not installed (the coqui extra: .ci/setup-coqui.sh)")
    return build_tiny_vits(tmp_path_factory.mktemp("coqui") / "vits")


@pytest.fixture(scope="module")
def coqui(vits_dir: Path):
    return make_tts("coqui", str(vits_dir))


def test_rate_comes_from_the_config(coqui, vits_dir: Path) -> None:
    config = json.loads((vits_dir / "config.json").read_text())
    assert coqui.sample_rate == config["audio"]["sample_rate"] == RATE


def test_one_nonsilent_int16_chunk_per_sentence(coqui) -> None:
    chunks = list(coqui.synthesize(TWO_SENTENCES))
    assert len(chunks) >= 2
    for chunk in chunks:
        assert chunk.dtype == np.int16 and chunk.ndim == 1
        assert chunk.size > RATE // 100  # at least 10 ms of audio
        assert np.abs(chunk.astype(np.int32)).max() > 100
    assert list(coqui.synthesize("   ")) == []


def test_first_sentence_is_yielded_before_the_second_is_synthesized(coqui, monkeypatch) -> None:
    spoken: list[str] = []
    real = coqui._api.tts

    def counting(text: str, **kwargs):
        spoken.append(text)
        return real(text, **kwargs)

    monkeypatch.setattr(coqui._api, "tts", counting)
    stream = coqui.synthesize(TWO_SENTENCES)
    next(stream)
    assert spoken == ["Hello there."]
    rest = list(stream)
    assert spoken == ["Hello there.", "How are you today?"] and len(rest) == 1


def test_loads_and_speaks_with_the_network_cut(vits_dir: Path, monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise OSError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    tts = make_tts("coqui", vits_dir)
    assert len(list(tts.synthesize("Offline."))) == 1


def test_broken_checkpoint_is_a_one_line_model_error(vits_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((vits_dir / "config.json").read_text())
    (broken / "model.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(ModelError, match="cannot load Coqui TTS model") as caught:
        make_tts("coqui", broken)
    assert "\n" not in str(caught.value)


# The checks below need no Coqui install: the directory is checked before Coqui is imported.


def test_missing_directory_is_a_model_error(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="is not a directory"):
        make_tts("coqui", str(tmp_path / "nowhere"))


def test_directory_without_model_files_is_a_model_error(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="no config.json"):
        make_tts("coqui", tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelError, match="unreadable"):
        make_tts("coqui", tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model": "vits", "audio": {"sample_rate": RATE}}))
    with pytest.raises(ModelError, match="no checkpoint"):
        make_tts("coqui", tmp_path)


def test_remote_references_are_refused(tmp_path: Path) -> None:
    config = {"model": "vits", "audio": {"sample_rate": RATE},
              "model_args": {"speakers_file": "https://example.invalid/speakers.json"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.pth").write_bytes(b"")
    with pytest.raises(ModelError, match="remote file"):
        make_tts("coqui", tmp_path)


def test_coqui_not_installed_says_how_to_install(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model": "vits", "audio": {"sample_rate": RATE}}))
    (tmp_path / "model.pth").write_bytes(b"")
    monkeypatch.setitem(sys.modules, "TTS.api", None)  # makes `from TTS.api import ...` fail
    with pytest.raises(ModelError, match="install the coqui extra"):
        make_tts("coqui", tmp_path)


def test_selection_by_name(tmp_path: Path) -> None:
    from voicepipe.backends.tts_piper import PiperTTS

    assert isinstance(make_tts(), PiperTTS)
    with pytest.raises(ModelError, match="Coqui model directory"):
        make_tts("coqui")
    with pytest.raises(ValueError, match="unknown TTS"):
        make_tts("espeak")
