"""`voicepipe serve`: the web page, the APIs, the metrics and the calls, on one port.

Every serve option defaults to None here, meaning "not given": `voicepipe.server.settings` then takes the
environment, the config file or the default, in that order (the help shows the defaults it would take).
"""

import argparse
import asyncio

from voicepipe.server.settings import MODEL_FIELDS, ServeSettings, SettingsError, flag_type, load_settings

DEFAULTS = ServeSettings()


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    from voicepipe.cli.options import add_runtime_arguments

    parser.add_argument("--config", metavar="FILE.toml",
                        help="settings file, keys named as the settings (also VOICEPIPE_CONFIG); flags and "
                             "VOICEPIPE_<SETTING> environment variables override it")
    parser.add_argument("--host", type=flag_type("host"),
                        help=f"address to bind (default: {DEFAULTS.host}, this machine only)")
    parser.add_argument("--port", type=flag_type("port"),
                        help=f"port to listen on; 0 picks a free one (default: {DEFAULTS.port})")
    parser.add_argument("--max-calls", type=flag_type("max_calls"), metavar="N",
                        help=f"calls served at once; more are refused (default: {DEFAULTS.max_calls})")
    parser.add_argument("--ttfa-deadline", type=flag_type("ttfa_deadline"), metavar="S",
                        help="each turn's time-to-first-audio deadline from the caller's last voiced frame "
                             f"(default: {DEFAULTS.ttfa_deadline})")
    parser.add_argument("--system", "--instructions", dest="instructions", type=flag_type("instructions"),
                        metavar="TEXT", help="the calls' system prompt (default: a concise spoken assistant)")
    parser.add_argument("--max-tokens", type=flag_type("max_tokens"), metavar="N",
                        help=f"longest reply of a call, in tokens (default: {DEFAULTS.max_tokens})")
    parser.add_argument("--temperature", type=flag_type("temperature"), metavar="T",
                        help="sampling temperature of calls; 0 is greedy (default)")
    parser.add_argument("--echo-cancellation", type=flag_type("echo_cancellation"), metavar="on|off",
                        help="cancel the reply's echo from each call's microphone (default: on; a client with a "
                             "canceller of its own turns it off with its session)")
    parser.add_argument("--noise-reduction", type=flag_type("noise_reduction"), metavar="off|near_field|far_field",
                        help="each call's noise suppressor, as audio.input.noise_reduction names it (default: "
                             "near_field)")
    parser.add_argument("--record-front-end", type=flag_type("record_front_end"), metavar="DIR",
                        help="write each call's microphone and far end, as its audio front end was given them, "
                             "to DIR/<call id>.npz when it ends, to replay with `voicepipe bench replay`")
    parser.add_argument("--max-batch-tokens", type=flag_type("max_batch_tokens"), metavar="N",
                        help=f"the engine's token budget per step, at start (default: {DEFAULTS.max_batch_tokens})")
    parser.add_argument("--max-batch-seqs", type=flag_type("max_batch_seqs"), metavar="N",
                        help=f"the engine's sequences per step, at start (default: {DEFAULTS.max_batch_seqs})")
    text = parser.add_argument_group("text API")
    text.add_argument("--text-max-tokens", type=flag_type("text_max_tokens"), metavar="N",
                      help="max_tokens of a chat completion that gives none, and the most one may ask for "
                           f"(default: {DEFAULTS.text_max_tokens})")
    text.add_argument("--max-text-requests", type=flag_type("max_text_requests"), metavar="N",
                      help="chat completions waiting or running at once; more are answered 429 "
                           f"(default: {DEFAULTS.max_text_requests})")
    security = parser.add_argument_group("security")
    security.add_argument("--api-key", type=flag_type("api_key"), metavar="KEY",
                          help="key every client must present (also VOICEPIPE_API_KEY; default: none)")
    security.add_argument("--allow-origin", dest="allow_origins", action="append", type=flag_type("allow_origins"),
                          metavar="ORIGIN", help="another origin (https://host[:port]) whose pages may open the "
                                                 "websockets; repeatable")
    security.add_argument("--insecure", action=argparse.BooleanOptionalAction,
                          help="allow a non-loopback --host without an API key")
    security.add_argument("--ssl-certfile", type=flag_type("ssl_certfile"), metavar="PEM",
                          help="serve HTTPS with this certificate (browsers allow the microphone only on https "
                               "or localhost)")
    security.add_argument("--ssl-keyfile", type=flag_type("ssl_keyfile"), metavar="PEM",
                          help="the certificate's private key")
    tools = parser.add_argument_group("tools run by the server (MCP)")
    tools.add_argument("--mcp-server", dest="mcp_servers", action="append", type=flag_type("mcp_servers"),
                       metavar="LABEL=URL", help="an MCP server sessions may name by its label (a session tool "
                       '{"type": "mcp", "server_label": LABEL}): streamable HTTP at URL, or LABEL=stdio:COMMAND '
                       "started for each call that names it; repeatable")
    tools.add_argument("--mcp-allow-url", dest="mcp_allow_urls", action="append", type=flag_type("mcp_allow_urls"),
                       metavar="PREFIX", help="a URL prefix a session's own MCP server (server_url) may start with; "
                       "repeatable (default: none, so sessions use only the --mcp-server ones)")
    tools.add_argument("--mcp-timeout", type=flag_type("mcp_timeout"), metavar="S",
                       help=f"how long one MCP tool call may take (default: {DEFAULTS.mcp_timeout:g})")
    phone = parser.add_argument_group("phone calls over SIP")
    phone.add_argument("--sip", type=flag_type("sip"), metavar="HOST:PORT",
                       help="answer SIP calls (UDP) here, e.g. 0.0.0.0:5060, or a port alone on 127.0.0.1 "
                       "(default: off)")
    phone.add_argument("--sip-allow", dest="sip_allow", action="append", type=flag_type("sip_allow"),
                       metavar="NETWORK", help="take calls from this address or network (e.g. a PBX's) without a "
                       "password; repeatable (default: this machine only)")
    phone.add_argument("--sip-user", type=flag_type("sip_user"), metavar="NAME",
                       help="callers from elsewhere must answer a digest challenge for this user ...")
    phone.add_argument("--sip-password", type=flag_type("sip_password"), metavar="SECRET", help="... and password")
    phone.add_argument("--sip-advertise", type=flag_type("sip_advertise"), metavar="ADDRESS",
                       help="the address callers send audio to, when --sip's host is 0.0.0.0 or behind a NAT")
    phone.add_argument("--sip-rtp-ports", type=flag_type("sip_rtp_ports"), metavar="LOW-HIGH",
                       help="the UDP ports calls' audio may use (default: any free port)")
    phone.add_argument("--sip-register", type=flag_type("sip_register"), metavar="sip:USER:PASSWORD@HOST",
                       help="register with this PBX or SIP trunk, so calls to USER reach this server")
    phone.add_argument("--sip-webhook", type=flag_type("sip_webhook"), metavar="URL",
                       help="tell this application of each call (realtime.call.incoming); it accepts or rejects it "
                       "through /v1/realtime/calls/ID/accept|reject, as with OpenAI's SIP (default: take every call)")
    phone.add_argument("--sip-webhook-secret", type=flag_type("sip_webhook_secret"), metavar="whsec_...",
                       help="sign what the webhook is told (Standard Webhooks: the openai SDK's webhooks.unwrap "
                       "checks it)")
    parser.add_argument("--drain-seconds", dest="drain_s", type=flag_type("drain_s"), metavar="S",
                        help=f"after SIGTERM, how long running replies may take (default: {DEFAULTS.drain_s:g})")
    cluster = parser.add_argument_group("replicas on Ray Serve (the cluster extra)")
    cluster.add_argument("--replicas", type=flag_type("replicas"), metavar="N",
                         help="serve N replicas, each with its own models and engine on one device, behind Ray "
                              "Serve's proxy (default: 0, one process without Ray)")
    cluster.add_argument("--ray-address", type=flag_type("ray_address"), metavar="ADDR",
                         help="deploy on this Ray cluster (ray start --head prints it) instead of starting one "
                              "on this machine")
    add_runtime_arguments(parser)
    parser.set_defaults(**dict.fromkeys(MODEL_FIELDS))  # not given: the settings fill them in


def run_serve(args: argparse.Namespace) -> int:
    """Read the settings and take the port (both fail in a second), load the models with a line per phase,
    then serve until interrupted or terminated."""
    from voicepipe.cli.command import UsageError
    from voicepipe.server.listen import bind_socket

    try:
        settings = load_settings(args)
    except SettingsError as e:
        raise UsageError(str(e)) from None
    if settings.replicas:
        from voicepipe.cluster import run_cluster
        from voicepipe.cluster.placement import PlacementError

        try:
            return run_cluster(settings)
        except PlacementError as e:
            raise UsageError(str(e)) from None
    sock = bind_socket(settings.host, settings.port)
    try:
        from voicepipe.server.run import serve_spawned  # torch and the rest: once the port is ours

        asyncio.run(serve_spawned(settings.model_options(), settings, sock))
    finally:
        sock.close()
    return 0
