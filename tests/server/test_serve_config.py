"""`voicepipe serve`'s configuration: flag > environment > TOML file > default, the checks that refuse an
open or broken server, `-v` anywhere, the port taken before the models load, and the conversion's bar."""

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scheduler.config import EngineConfig
from voicepipe.backends.arguments import model_options
from voicepipe.call.limits import Limits
from voicepipe.cli import build_parser, main
from voicepipe.pipeline.instructions import DEFAULT_INSTRUCTIONS
from voicepipe.server.settings import ServeSettings, SettingsError, is_loopback, load_settings


def settings(*flags: str, env: dict[str, str] | None = None) -> ServeSettings:
    return load_settings(build_parser().parse_args(["serve", *flags]), env or {})


def config_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "voicepipe.toml"
    path.write_text(text)
    return str(path)


def test_nothing_given_is_the_defaults():
    assert settings() == ServeSettings()


def test_defaults_are_those_of_the_calls_and_the_other_commands():
    """The settings spell out defaults that live elsewhere (importing them would import torch)."""
    from voicepipe.pipeline import CallConfig

    call = CallConfig()
    assert settings().call_config() == CallConfig(instructions=DEFAULT_INSTRUCTIONS, ttfa_s=call.ttfa_s,
                                                  max_tokens=call.max_tokens, temperature=call.temperature)
    assert settings().limits() == Limits()
    assert settings().model_options() == model_options(build_parser().parse_args(["talk"]))
    assert settings().model_options().engine == EngineConfig()


def test_the_knobs_the_job_lane_and_the_text_limits_are_settings(tmp_path):
    toml = config_file(tmp_path, "text_max_tokens = 64")
    chosen = settings("--max-batch-tokens", "128", "--max-text-requests", "3", "--job-threads", "1",
                      env={"VOICEPIPE_MAX_BATCH_SEQS": "8", "VOICEPIPE_CONFIG": toml})
    engine = chosen.model_options().engine
    assert (engine.max_batch_tokens, engine.max_batch_seqs, engine.job_threads) == (128, 8, 1)
    assert (chosen.limits().max_text_requests, chosen.limits().text_max_tokens) == (3, 64)
    with pytest.raises(SettingsError, match="MAX_BATCH_SEQS must be an integer in"):
        settings(env={"VOICEPIPE_MAX_BATCH_SEQS": "0"})


# Each setting with one value per layer: what the file, the environment and a flag say.
LAYERS = {
    "port": ("port = 9001", {"VOICEPIPE_PORT": "9002"}, ["--port", "9003"], (9001, 9002, 9003)),
    "instructions": ('instructions = "file"', {"VOICEPIPE_INSTRUCTIONS": "env"}, ["--system", "flag"],
                     ("file", "env", "flag")),
    "allow_origins": ('allow_origins = ["https://a.example"]', {"VOICEPIPE_ALLOW_ORIGINS": "https://b.example, "
                                                                "http://c.example:8080/"},
                      ["--allow-origin", "https://d.example", "--allow-origin", "https://e.example"],
                      (("https://a.example",), ("https://b.example", "http://c.example:8080"),
                       ("https://d.example", "https://e.example"))),
    "insecure": ('host = "0.0.0.0"\ninsecure = true', {"VOICEPIPE_INSECURE": "no", "VOICEPIPE_API_KEY": "k"},
                 ["--insecure"], (True, False, True)),
    "drain_s": ("drain_s = 5", {"VOICEPIPE_DRAIN_S": "7.5"}, ["--drain-seconds", "0"], (5.0, 7.5, 0.0)),
    "policy": ('policy = "fcfs"', {"VOICEPIPE_POLICY": "o4"}, ["--policy", "fcfs"], ("fcfs", "o4", "fcfs")),
    "llm_precision": ('llm_precision = "fp32"', {"VOICEPIPE_LLM_PRECISION": "int8"}, ["--llm-precision", "fp32"],
                      ("fp32", "int8", "fp32")),
    "device": ('device = "cpu"', {"VOICEPIPE_DEVICE": "auto"}, ["--device", "cpu"], ("cpu", "auto", "cpu")),
    "tts_model": ('tts_model = "/f.onnx"', {"VOICEPIPE_TTS_MODEL": "/e.onnx"}, ["--tts-voice", "/v.onnx"],
                  ("/f.onnx", "/e.onnx", "/v.onnx")),
    "torch_threads": ("torch_threads = 2", {"VOICEPIPE_TORCH_THREADS": "3"}, ["--torch-threads", "1"], (2, 3, 1)),
    "job_threads": ("job_threads = 1", {"VOICEPIPE_JOB_THREADS": "0"}, ["--job-threads", "2"], (1, 0, 2)),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_a_flag_beats_the_environment_which_beats_the_file(tmp_path, name):
    text, env, flags, (from_file, from_env, from_flag) = LAYERS[name]
    config = ["--config", config_file(tmp_path, text)]
    assert getattr(settings(*config), name) == from_file != getattr(ServeSettings(), name)
    assert getattr(settings(*config, env=env), name) == from_env
    assert getattr(settings(*config, *flags, env=env), name) == from_flag


def test_the_config_file_can_come_from_the_environment(tmp_path):
    assert settings(env={"VOICEPIPE_CONFIG": config_file(tmp_path, "max_calls = 2")}).max_calls == 2


def test_a_bad_value_is_refused_in_every_layer_naming_its_source(tmp_path, capsys):
    with pytest.raises(SettingsError, match=r"voicepipe.toml: port must be a port number"):
        settings("--config", config_file(tmp_path, "port = 70000"))
    with pytest.raises(SettingsError, match=r"voicepipe.toml: max_tokens must be int, got '9'"):
        settings("--config", config_file(tmp_path, 'max_tokens = "9"'))
    with pytest.raises(SettingsError, match=r"VOICEPIPE_PORT must be an integer, got 'http'"):
        settings(env={"VOICEPIPE_PORT": "http"})
    with pytest.raises(SettingsError, match=r"VOICEPIPE_POLICY must be one of o4, fcfs, got 'fifo'"):
        settings(env={"VOICEPIPE_POLICY": "fifo"})
    with pytest.raises(SettingsError, match=r"VOICEPIPE_JOB_THREADS must be 0 or more, got -1"):
        settings(env={"VOICEPIPE_JOB_THREADS": "-1"})
    with pytest.raises(SettingsError, match=r"VOICEPIPE_INSECURE must be one of"):
        settings(env={"VOICEPIPE_INSECURE": "maybe"})
    with pytest.raises(SettingsError, match=r"VOICEPIPE_ALLOW_ORIGINS 'example.com' is not an origin"):
        settings(env={"VOICEPIPE_ALLOW_ORIGINS": "example.com"})
    with pytest.raises(SystemExit) as exit_:
        settings("--max-calls", "0")
    assert exit_.value.code == 2 and "--max-calls: must be at least 1, got 0" in capsys.readouterr().err


def test_an_unknown_or_unreadable_config_file_is_refused(tmp_path):
    with pytest.raises(SettingsError, match=r"unknown setting 'prot' \(did you mean 'port'\?\)"):
        settings("--config", config_file(tmp_path, "prot = 9000"))
    with pytest.raises(SettingsError, match=r"unknown setting 'serve' \(settings go at the top level"):
        settings("--config", config_file(tmp_path, "[serve]\nport = 9000"))
    with pytest.raises(SettingsError, match=r"unknown setting 'voice'; known: host, port, "):
        settings("--config", config_file(tmp_path, 'voice = "x.onnx"'))
    with pytest.raises(SettingsError, match=r"is not valid TOML"):
        settings("--config", config_file(tmp_path, "port = "))
    with pytest.raises(SettingsError, match=r"cannot read config file .*missing.toml: No such file"):
        settings("--config", str(tmp_path / "missing.toml"))


def test_an_unknown_config_key_ends_the_command_with_one_line_and_exit_2(tmp_path, capsys):
    assert main(["serve", "--config", config_file(tmp_path, "prot = 9000")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("voicepipe: error: config file ") and err.count("\n") == 1, err


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.2.1", "::1", "localhost", "LOCALHOST"])
def test_loopback_names(host):
    assert is_loopback(host) and settings("--host", host).loopback


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "example.com"])
def test_a_reachable_host_needs_a_key_or_insecure(host, capsys):
    assert main(["serve", "--host", host]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"voicepipe: error: host {host} lets other machines connect") and err.count("\n") == 1
    assert not settings("--host", host, "--insecure").loopback
    assert settings("--host", host, env={"VOICEPIPE_API_KEY": "secret"}).api_key == "secret"
    with pytest.raises(SettingsError, match="API key"):
        settings("--host", host, "--no-insecure", env={"VOICEPIPE_INSECURE": "1"})


def test_https_needs_both_files_and_both_readable(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_text("certificate")
    key.write_text("key")
    with pytest.raises(SettingsError, match="needs both"):
        settings("--ssl-certfile", str(cert))
    with pytest.raises(SettingsError, match="needs both"):
        settings("--ssl-keyfile", str(key))
    with pytest.raises(SettingsError, match="ssl_keyfile .*missing.pem is not a readable file"):
        settings("--ssl-certfile", str(cert), "--ssl-keyfile", str(tmp_path / "missing.pem"))
    assert settings("--ssl-certfile", str(cert), "--ssl-keyfile", str(key)).ssl_keyfile == str(key)


def test_the_front_ends_recordings_go_to_a_folder_made_at_start_or_refused_there(tmp_path):
    folder = tmp_path / "calls" / "today"
    assert settings("--record-front-end", str(folder)).call_config().record_front_end == str(folder)
    assert folder.is_dir()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(SettingsError, match="VOICEPIPE_RECORD_FRONT_END cannot be made a folder"):
        settings(env={"VOICEPIPE_RECORD_FRONT_END": str(blocker / "calls")})


def test_an_empty_key_is_refused_rather_than_taken_for_no_key():
    with pytest.raises(SettingsError, match="VOICEPIPE_API_KEY is empty"):
        settings(env={"VOICEPIPE_API_KEY": ""})


@pytest.mark.parametrize("argv", [["-v", "serve"], ["serve", "-v"], ["serve", "--verbose"], ["-v", "say", "x", "-o",
                                  "o.wav"], ["say", "x", "-o", "o.wav", "-v"], ["bench", "engine", "-v"]])
def test_verbose_before_or_after_the_subcommand(argv):
    assert build_parser().parse_args(argv).verbose is True


def test_not_verbose_unless_asked():
    assert build_parser().parse_args(["serve"]).verbose is False
    assert build_parser().parse_args(["bench", "engine"]).verbose is False


def test_a_port_in_use_is_reported_before_any_model_loads(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "voicepipe", "serve", "--port", str(port)], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("voicepipe: error: ") and str(port) in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and "loading" not in done.stderr, done.stderr
    assert time.monotonic() - started < 30  # the models take longer than this to load


class FakeModel:
    hf_quantizer = object()

    @classmethod
    def from_pretrained(cls, *args, **kwargs) -> "FakeModel":
        return cls()

    def save_pretrained(self, path: Path) -> None:
        (Path(path) / "model.safetensors").write_text("weights")


def test_the_first_conversion_shows_a_progress_bar_on_stderr(tmp_path, monkeypatch, capfd):
    import transformers

    from voicepipe.backends import models

    monkeypatch.setenv("VOICEPIPE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(transformers, "AutoModelForCausalLM", FakeModel)
    monkeypatch.setattr(transformers, "AutoTokenizer", FakeModel)
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF")
    converted = models._float32_checkpoint(gguf)
    assert (converted / "model.safetensors").is_file()
    err = capfd.readouterr().err
    assert "voicepipe: converting tiny.gguf to float32 (once)" in err and "3/3" in err, err
    assert models._float32_checkpoint(gguf) == converted
    assert capfd.readouterr().err == ""  # cached: no bar again


def test_sip_settings_take_a_port_alone_on_loopback_and_refuse_what_would_answer_nobody(capsys):
    assert settings().sip_settings() is None
    sip = settings("--sip", "5070", "--sip-rtp-ports", "10000-10009").sip_settings()
    assert (sip.host, sip.port, sip.rtp_ports, sip.allow) == ("127.0.0.1", 5070, range(10000, 10010),
                                                              ("127.0.0.0/8", "::1/128"))
    pbx = settings("--sip", "0.0.0.0:5060", "--sip-allow", "192.168.1.10", "--sip-advertise", "192.168.1.20",
                   "--sip-register", "sip:bot:pw@pbx.example.com").sip_settings()
    assert pbx.allow == ("192.168.1.10",) and pbx.advertise == "192.168.1.20" and pbx.register.host == "pbx.example.com"
    for flags, says in ((("--sip", "0.0.0.0:5060"), "would refuse every caller"),
                        (("--sip-webhook", "http://127.0.0.1:9000/calls"), "--sip HOST:PORT as well"),
                        (("--sip", "5060", "--sip-user", "pbx"), "go together")):
        with pytest.raises(SettingsError, match=says):
            settings(*flags)
    for flags in (("--sip", "host:port"), ("--sip", "5060", "--sip-rtp-ports", "20-10"),
                  ("--sip", "5060", "--sip-allow", "not-a-network"), ("--sip", "5060", "--sip-register", "sip:pbx")):
        with pytest.raises(SystemExit):
            settings(*flags)
    capsys.readouterr()
