"""The configuration of `voicepipe serve`.

Each setting comes from its flag, else the environment (`VOICEPIPE_<NAME>`), else the TOML file named by
`--config` (or `VOICEPIPE_CONFIG`), else its default; the TOML keys are the field names below. Every value
is checked where it is read, so an error names its source, and all of it happens before any model library
loads: a typo costs a second, not a minute of loading. This module imports nothing heavy for that reason.
"""

import argparse
import difflib
import ipaddress
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import UnionType
from typing import TYPE_CHECKING, Any, Union, get_args, get_origin, get_type_hints
from urllib.parse import urlsplit

from scheduler.config import DEFAULT_POLICY
from scheduler.config import KNOBS as KNOB_RANGES
from scheduler.policies import call_policies
from voicepipe.backends.arguments import model_options
from voicepipe.backends.loading import DEVICES, PRECISIONS, ModelOptions
from voicepipe.backends.tts_select import TTS_CHOICES
from voicepipe.call.limits import Limits
from voicepipe.mcp_servers.spec import McpPolicy
from voicepipe.pipeline.instructions import DEFAULT_INSTRUCTIONS
from voicepipe.server.listen import is_loopback
from voicepipe.server.security import Security

if TYPE_CHECKING:  # the pipeline imports torch
    from voicepipe.pipeline import CallConfig
    from voicepipe.server.call_control import PhoneCalls
    from voicepipe.sip.agent import SipSettings

ENV_PREFIX = "VOICEPIPE_"
CONFIG_ENV = "VOICEPIPE_CONFIG"
TRUE_WORDS, FALSE_WORDS = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


class SettingsError(ValueError):
    """A setting that cannot be used; the message names where it came from."""


@dataclass(frozen=True)
class ServeSettings:
    """Everything `voicepipe serve` is told. The call defaults equal `CallConfig`'s and `max_calls`
    equals `Limits`' (a test keeps them so): they are spelled out because importing those pulls in torch."""

    host: str = "127.0.0.1"
    port: int = 8000
    max_calls: int = 4
    text_max_tokens: int = 512  # a text request's max_tokens when it gives none, and its ceiling
    max_text_requests: int = 32  # text requests waiting or running at once; more get 429
    max_batch_tokens: int = 256  # the engine's two knobs at start (the page may turn them later)
    max_batch_seqs: int = 32
    ttfa_deadline: float = 1.5  # seconds from the caller's last voiced frame to a turn's first audio
    api_key: str | None = None
    allow_origins: tuple[str, ...] = ()  # other origins whose pages may open the websockets
    insecure: bool = False  # serve a non-loopback address without an API key
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    instructions: str = DEFAULT_INSTRUCTIONS
    max_tokens: int = 96
    temperature: float = 0.0
    echo_cancellation: bool = True  # each call's default; a client with its own canceller turns it off
    noise_reduction: str = "near_field"  # off, near_field or far_field: each call's default
    record_front_end: str | None = None  # a folder each call's microphone and far end are written to
    drain_s: float = 30.0  # after SIGTERM, how long running replies may take to finish
    # MCP servers calls may use: LABEL=URL or LABEL=stdio:COMMAND (named by label alone), the URL prefixes a
    # session may name itself, and how long one tool call may take.
    mcp_servers: tuple[str, ...] = ()
    mcp_allow_urls: tuple[str, ...] = ()
    mcp_timeout: float = 10.0
    # Phone calls over SIP (UDP): where to answer them (HOST:PORT; None: not at all), the networks whose calls
    # are taken without a password (default: this machine), the password asked of the others, the RTP ports.
    sip: str | None = None
    sip_allow: tuple[str, ...] = ()
    sip_user: str | None = None
    sip_password: str | None = None
    sip_advertise: str | None = None  # the address callers are told to send audio to, behind a NAT
    sip_rtp_ports: str | None = None  # LOW-HIGH; None: any free port
    sip_register: str | None = None  # sip:USER:PASSWORD@HOST[:PORT]: a PBX or trunk to register with
    sip_webhook: str | None = None  # the operator's application, told of each call (realtime.call.incoming)
    sip_webhook_secret: str | None = None  # signs what it is told (Standard Webhooks, as OpenAI's are)
    replicas: int = 0  # 0: one process; N: N replicas on Ray Serve (voicepipe.cluster)
    ray_address: str | None = None  # an existing Ray cluster to deploy on; None: start one on this machine
    # The models, as the options of `add_runtime_arguments` name them; tts_model is the voice.
    policy: str = DEFAULT_POLICY
    llm_model: str | None = None
    llm_precision: str | None = None  # None: the device's default (scheduler.model.device.default_precision)
    device: str = "auto"
    asr_model: str | None = None
    tts: str = "piper"
    tts_model: str | None = None
    torch_threads: int | None = None  # None: the cores the server and the job lane leave, on a CPU
    job_threads: int | None = None  # device jobs: 0 between model steps, N on a lane of N threads; None: per device

    def limits(self) -> Limits:
        return Limits(max_calls=self.max_calls, text_max_tokens=self.text_max_tokens,
                      max_text_requests=self.max_text_requests)

    def call_config(self) -> "CallConfig":
        from voicepipe.pipeline import CallConfig

        return CallConfig(instructions=self.instructions, ttfa_s=self.ttfa_deadline, max_tokens=self.max_tokens,
                          temperature=self.temperature, echo_cancellation=self.echo_cancellation,
                          noise_reduction=None if self.noise_reduction == "off" else self.noise_reduction,
                          record_front_end=self.record_front_end)

    def security(self) -> Security:
        """Who may use the server: the key, the other origins allowed, and (on a loopback bind) the check
        of the Host header."""
        return Security(self.api_key, frozenset(self.allow_origins), loopback_only=self.loopback)

    def sip_settings(self) -> "SipSettings | None":
        """The SIP user agent's settings, where SIP is on."""
        from voicepipe.sip.agent import SipSettings
        from voicepipe.sip.register import Registration

        if self.sip is None:
            return None
        host, port = _host_port(self.sip)
        extra = {"allow": self.sip_allow} if self.sip_allow else {}
        low, _, high = (self.sip_rtp_ports or "").partition("-")
        register = Registration.parse(self.sip_register) if self.sip_register else None
        return SipSettings(host, port, self.sip_advertise, range(int(low), int(high) + 1) if high else None,
                           user=self.sip_user, password=self.sip_password, register=register, **extra)

    def phone_calls(self) -> "PhoneCalls":
        from voicepipe.server.call_control import PhoneCalls

        return PhoneCalls(self.sip_webhook, self.sip_webhook_secret)

    def mcp(self) -> McpPolicy:
        return McpPolicy.from_flags(list(self.mcp_servers), list(self.mcp_allow_urls), self.mcp_timeout)

    @property
    def loopback(self) -> bool:
        """Whether only this machine can connect."""
        return is_loopback(self.host)

    def model_options(self) -> ModelOptions:
        """The models and the engine's settings (the policy and the knobs) these settings name: the model
        fields are named as the commands' options are."""
        options = model_options(self)
        return replace(options, engine=replace(options.engine, max_batch_tokens=self.max_batch_tokens,
                                               max_batch_seqs=self.max_batch_seqs))


def _field_type(hint: Any) -> type:
    """What a setting's text or TOML value becomes: `int | None` an int, `tuple[str, ...]` a tuple."""
    if get_origin(hint) in (Union, UnionType):
        hint = next(arg for arg in get_args(hint) if arg is not type(None))
    return get_origin(hint) or hint


MODEL_FIELDS = ("policy", "llm_model", "llm_precision", "device", "asr_model", "tts", "tts_model", "torch_threads",
                "job_threads")
FIELD_TYPES = {name: _field_type(hint) for name, hint in get_type_hints(ServeSettings).items()}


def _at_least_one(value: int) -> None:
    if value < 1:
        raise SettingsError(f"must be at least 1, got {value}")


def _port(value: int) -> None:
    if not 0 <= value <= 65535:
        raise SettingsError(f"must be a port number (0-65535), got {value}")


def _positive(value: float) -> None:
    if value <= 0:
        raise SettingsError(f"must be more than 0, got {value}")


def _not_negative(value: float) -> None:
    if value < 0:
        raise SettingsError(f"must be 0 or more, got {value}")


def _not_empty(value: str) -> None:
    if not value:
        raise SettingsError("is empty; leave it unset for none")


def _writable_folder(value: str) -> None:
    """A folder the server writes to: made now, where it can be, so a bad one is told at start rather than
    found at the end of every call."""
    _not_empty(value)
    try:
        Path(value).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SettingsError(f"cannot be made a folder: {e}") from None
    if not os.access(value, os.W_OK):
        raise SettingsError("is a folder this server cannot write to")


def _origins(value: tuple[str, ...]) -> None:
    for origin in value:
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.path or parts.query:
            raise SettingsError(f"{origin!r} is not an origin like https://example.com or http://host:8080")


def _mcp_servers(value: tuple[str, ...]) -> None:
    try:
        McpPolicy.from_flags(list(value), [])
    except ValueError as e:
        raise SettingsError(str(e).removeprefix("--mcp-server ")) from None


def _host_port(text: str) -> tuple[str, int]:
    """HOST:PORT, or a PORT alone on this machine's loopback address."""
    host, _, port = text.rpartition(":")
    if not port.isdigit() or not 0 <= int(port) <= 65535 or (":" in text and not host):
        raise SettingsError(f"must be HOST:PORT or PORT (e.g. 127.0.0.1:5060, or 5060), got {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def _networks(value: tuple[str, ...]) -> None:
    for network in value:
        try:
            ipaddress.ip_network(network, strict=False)
        except ValueError:
            raise SettingsError(f"{network!r} is not an address or a network like 192.168.1.0/24") from None


def _registration(text: str) -> None:
    from voicepipe.sip.register import Registration

    try:
        Registration.parse(text)
    except ValueError as e:
        raise SettingsError(str(e)) from None


def _url(text: str) -> None:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise SettingsError(f"must be an http(s) URL, got {text!r}")


def _address(text: str) -> None:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        raise SettingsError(f"must be an IP address, got {text!r}") from None


def _port_range(text: str) -> None:
    low, _, high = text.partition("-")
    if not (low.isdigit() and high.isdigit() and 1024 <= int(low) <= int(high) <= 65535):
        raise SettingsError(f"must be LOW-HIGH, two ports from 1024 to 65535 (e.g. 10000-20000), got {text!r}")


def _one_of(choices: tuple[str, ...]) -> Callable[[str], None]:
    def check(value: str) -> None:
        if value not in choices:
            raise SettingsError(f"must be one of {', '.join(choices)}, got {value!r}")

    return check


def _knob(name: str) -> Callable[[int], None]:
    lo, hi = KNOB_RANGES[name]

    def check(value: int) -> None:
        if not lo <= value <= hi:
            raise SettingsError(f"must be an integer in [{lo}, {hi}], got {value}")

    return check


CHECKS: dict[str, Callable[[Any], None]] = {
    "host": _not_empty, "port": _port, "max_calls": _at_least_one, "ttfa_deadline": _positive,
    "text_max_tokens": _at_least_one, "max_text_requests": _at_least_one, "torch_threads": _at_least_one,
    "job_threads": _not_negative,
    "max_batch_tokens": _knob("max_batch_tokens"), "max_batch_seqs": _knob("max_batch_seqs"),
    "api_key": _not_empty, "allow_origins": _origins, "ssl_certfile": _not_empty, "ssl_keyfile": _not_empty,
    "max_tokens": _at_least_one, "temperature": _not_negative, "drain_s": _not_negative,
    "replicas": _not_negative, "ray_address": _not_empty, "mcp_servers": _mcp_servers,
    "mcp_allow_urls": _origins, "mcp_timeout": _positive, "sip": _host_port, "sip_allow": _networks,
    "sip_user": _not_empty, "sip_password": _not_empty, "sip_advertise": _address, "sip_rtp_ports": _port_range,
    "sip_register": _registration, "sip_webhook": _url, "sip_webhook_secret": _not_empty,
    "noise_reduction": _one_of(("off", "near_field", "far_field")), "record_front_end": _writable_folder,
    "policy": _one_of(call_policies()), "llm_model": _not_empty, "llm_precision": _one_of(PRECISIONS),
    "device": _one_of(DEVICES), "asr_model": _not_empty, "tts": _one_of(TTS_CHOICES), "tts_model": _not_empty,
}


def _checked(name: str, value: Any) -> Any:
    if name in CHECKS:
        CHECKS[name](value)
    return value


def _from_text(name: str, text: str) -> Any:
    """A setting's value from its text, as a flag or an environment variable gives it."""
    kind = FIELD_TYPES[name]
    if kind is bool:
        if text.strip().lower() not in TRUE_WORDS + FALSE_WORDS:
            raise SettingsError(f"must be one of {', '.join(TRUE_WORDS + FALSE_WORDS)}, got {text!r}")
        return text.strip().lower() in TRUE_WORDS
    if kind is tuple:
        return _checked(name, tuple(item.strip().rstrip("/") for item in text.split(",") if item.strip()))
    try:
        return _checked(name, kind(text))
    except ValueError as e:
        if isinstance(e, SettingsError):
            raise
        raise SettingsError(f"must be {'an integer' if kind is int else 'a number'}, got {text!r}") from None


def _from_toml(name: str, value: Any) -> Any:
    kind = FIELD_TYPES[name]
    if kind is tuple:
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise SettingsError(f"must be a list of strings, got {value!r}")
        return _checked(name, tuple(item.rstrip("/") for item in value))
    accepted = (int, float) if kind is float else kind
    if not isinstance(value, accepted) or (isinstance(value, bool) and kind is not bool):
        raise SettingsError(f"must be {kind.__name__}, got {value!r}")
    return _checked(name, kind(value))


def flag_type(name: str) -> Callable[[str], Any]:
    """The argparse `type` of a setting's flag: the same conversion and checks as the other sources."""

    def convert(text: str) -> Any:
        try:
            if FIELD_TYPES[name] is tuple:  # a repeatable flag: one item each time
                return _checked(name, (text.rstrip("/"),))[0]
            return _from_text(name, text)
        except SettingsError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    convert.__name__ = name  # argparse names the type in its messages
    return convert


def read_config(path: str | Path) -> dict[str, Any]:
    """The settings of a TOML file; an unknown key is an error, not silently ignored."""
    try:
        with open(path, "rb") as f:
            table = tomllib.load(f)
    except OSError as e:
        raise SettingsError(f"cannot read config file {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise SettingsError(f"config file {path} is not valid TOML: {e}") from None
    values = {}
    for key, value in table.items():
        if key not in FIELD_TYPES:
            close = difflib.get_close_matches(key, FIELD_TYPES, n=1, cutoff=0.75)
            if isinstance(value, dict):
                hint = " (settings go at the top level, not in a table)"
            else:
                hint = f" (did you mean {close[0]!r}?)" if close else f"; known: {', '.join(FIELD_TYPES)}"
            raise SettingsError(f"config file {path}: unknown setting {key!r}{hint}")
        try:
            values[key] = _from_toml(key, value)
        except SettingsError as e:
            raise SettingsError(f"config file {path}: {key} {e}") from None
    return values


def load_settings(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> ServeSettings:
    """The settings from the parsed flags (None where not given), the environment, the config file and the
    defaults, in that order of precedence; raises SettingsError for a bad value or combination."""
    config = getattr(args, "config", None) or environ.get(CONFIG_ENV)
    from_file = read_config(config) if config else {}
    values = {}
    for name in FIELD_TYPES:
        env_name = ENV_PREFIX + name.upper()
        if getattr(args, name, None) is not None:
            value = getattr(args, name)
            values[name] = tuple(value) if FIELD_TYPES[name] is tuple else value
        elif env_name in environ:
            try:
                values[name] = _from_text(name, environ[env_name])
            except SettingsError as e:
                raise SettingsError(f"{env_name} {e}") from None
        elif name in from_file:
            values[name] = from_file[name]
    settings = ServeSettings(**values)
    check(settings)
    return settings


def check(settings: ServeSettings) -> None:
    """Refuse combinations that would start an open or broken server."""
    if not settings.loopback and settings.api_key is None and not settings.insecure:
        raise SettingsError(
            f"host {settings.host} lets other machines connect: set an API key (--api-key or VOICEPIPE_API_KEY), "
            "or give --insecure to serve without one")
    if settings.ray_address is not None and not settings.replicas:
        raise SettingsError("--ray-address deploys replicas on a Ray cluster: give --replicas N as well")
    if settings.replicas and settings.port == 0:
        raise SettingsError("--replicas needs a fixed --port: Ray Serve's proxy cannot pick a free one")
    if settings.replicas and (settings.ssl_certfile is not None):
        raise SettingsError("HTTPS is not served with --replicas: terminate TLS in front of Ray Serve's proxy")
    for name in ("sip_webhook", "sip_register"):
        if getattr(settings, name) is not None and settings.sip is None:
            raise SettingsError(f"--{name.replace('_', '-')} is for SIP calls: give --sip HOST:PORT as well")
    if (settings.sip_user is None) != (settings.sip_password is None):
        raise SettingsError("--sip-user and --sip-password go together: callers are asked for both")
    if settings.sip is not None and not is_loopback(_host_port(settings.sip)[0]) and not settings.sip_allow \
            and settings.sip_password is None:
        raise SettingsError(f"SIP on {settings.sip} would refuse every caller but this machine: name the networks "
                            "whose calls are taken (--sip-allow) or set --sip-user and --sip-password")
    if (settings.ssl_certfile is None) != (settings.ssl_keyfile is None):
        raise SettingsError("HTTPS needs both --ssl-certfile and --ssl-keyfile")
    for name in ("ssl_certfile", "ssl_keyfile"):
        path = getattr(settings, name)
        if path is not None and not os.access(path, os.R_OK):
            raise SettingsError(f"{name} {path} is not a readable file")
