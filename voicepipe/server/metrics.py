"""The server's own metrics, on the engine's registry so /metrics shows everything at once."""

import weakref

from prometheus_client import CollectorRegistry, Counter, Gauge


class CallMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.active = Gauge("voicepipe_calls_active", "Calls in progress", ["api"], registry=registry)
        self.refused = Counter("voicepipe_calls_refused", "Calls refused", ["reason"], registry=registry)
        self.api_requests = Counter("voicepipe_api_requests", "Text API requests", ["endpoint", "status"],
                                    registry=registry)
        self.engine_failures = Counter("voicepipe_engine_failures", "Times the engine process died and was "
                                       "restarted", registry=registry)


_made: "weakref.WeakKeyDictionary[CollectorRegistry, CallMetrics]" = weakref.WeakKeyDictionary()


def call_metrics(registry: CollectorRegistry) -> CallMetrics:
    """The registry's call metrics, made once: several servers may share one engine (as tests do)."""
    if registry not in _made:
        _made[registry] = CallMetrics(registry)
    return _made[registry]
