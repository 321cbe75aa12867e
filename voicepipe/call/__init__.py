"""One call and what serves it: the session (the call loop and its dispatch), the runtime every call shares, the
server's limits and the default instructions."""
