"""SIP for phone calls: a user agent that answers INVITEs from a PBX, a trunk or a SIP phone, and each
call's RTP stream (G.711, RFC 4733 keys). It knows nothing of the pipeline; the server's `sip_calls`
runs a session per call."""
