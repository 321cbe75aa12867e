"""The engine's channel: the client a server holds, the drivers that step the engine on a thread or in its own
process, and the typed messages between them."""
