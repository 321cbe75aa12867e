"""The calls' own metrics (time to first audio, deadlines, underruns, stage times), registered by the
pipeline on the engine's registry so that /metrics shows them beside the engine's."""


from prometheus_client import CollectorRegistry, Counter, Histogram

from scheduler.metrics import FAST
from voicepipe.metric_families import once_per_registry


class TurnMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.ttfa = Histogram("voicepipe_time_to_first_audio_seconds",
                              "The caller's last voiced frame to first reply audio", buckets=FAST, registry=registry)
        self.deadlines = Counter("voicepipe_turn_deadlines", "Turns by deadline outcome", ["outcome"],
                                 registry=registry)
        self.underruns = Counter("voicepipe_audio_underruns", "Gaps in reply audio after its first chunk",
                                 registry=registry)
        self.turn_stage = Histogram("voicepipe_turn_stage_seconds", "End of speech to each stage of a turn",
                                    ["stage"], buckets=FAST, registry=registry)
        self.unheard = Counter("voicepipe_reply_audio_unheard_seconds",
                               "Reply audio synthesized that the caller never heard, by why: the caller's words "
                               "over it (barge_in), the reply cut off (cut: a cancel, a client's truncate), "
                               "cancelled before it played (the cancel's reason), a speculative reply dropped "
                               "(speculation)", ["why"], registry=registry)
        self.waterfall = Histogram("voicepipe_turn_waterfall_seconds",
                                   "Time each stage added to a turn's first audio (they add up to it)",
                                   ["stage"], buckets=FAST, registry=registry)
        self.outcomes: dict[str, int] = {}  # deadline outcome -> turns, for the page's live view

    def turn_ended(self, outcome: str, ttfa_s: float | None, stages: dict[str, float],
                   waterfall: dict[str, float]) -> None:
        self.deadlines.labels(outcome).inc()
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        if ttfa_s is not None:
            self.ttfa.observe(ttfa_s)
        for stage, seconds in stages.items():
            self.turn_stage.labels(stage).observe(seconds)
        for stage, seconds in waterfall.items():
            self.waterfall.labels(stage).observe(seconds)


turn_metrics = once_per_registry(TurnMetrics)  # every call of a server shares the registry's
