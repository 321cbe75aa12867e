"""The call protocol: the event names (`names`), what a client sends (`client_events`), what the server
sends (`server_events`) and the connection a session speaks over (`transport`)."""

from voicepipe.protocol.names import ClientEvent, ServerEvent

__all__ = ["ClientEvent", "ServerEvent"]
