"""The call protocol's vocabulary: the event names (`names`), a builder for each server event of the native
protocol (`server_events`) and a client's connection as the wire sees it (`transport`)."""

from voicepipe.protocol.names import ClientEvent, ServerEvent

__all__ = ["ClientEvent", "ServerEvent"]
