"""The server's own metrics, on the engine's registry so /metrics shows everything at once."""


from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from voicepipe.metric_families import once_per_registry

LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
JITTER_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32)


class CallMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.active = Gauge("voicepipe_calls_active", "Calls in progress", ["api"], registry=registry)
        self.refused = Counter("voicepipe_calls_refused", "Calls refused", ["reason"], registry=registry)
        self.api_requests = Counter("voicepipe_api_requests", "Text API requests", ["endpoint", "status"],
                                    registry=registry)
        self.engine_failures = Counter("voicepipe_engine_failures", "Times the engine process died and was "
                                       "restarted", registry=registry)
        self.loop_lag = Histogram("voicepipe_event_loop_lag_seconds", "How late the server's event loop ran a "
                                  "callback past its due time (sampled every 100 ms)", buckets=LAG_BUCKETS,
                                  registry=registry)
        self.phone_packets = Counter("voicepipe_phone_packets", "Packets of phone calls (media streams, RTP), by what "
                                     "became of them (received, lost on the way, too late to play)",
                                     ["provider", "outcome"], registry=registry)
        self.phone_jitter = Histogram("voicepipe_phone_jitter_seconds", "Each phone call's arrival jitter at its "
                                      "end (RFC 3550's estimate)", ["provider"], buckets=JITTER_BUCKETS,
                                      registry=registry)


call_metrics = once_per_registry(CallMetrics)  # every call of a server shares the registry's
