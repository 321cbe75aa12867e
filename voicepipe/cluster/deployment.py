"""The Ray Serve application: the voice replicas, routed by `CallRouter`, and the metrics board."""

from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.deployment import Application

from voicepipe.cluster.board import MetricsBoard
from voicepipe.cluster.fleet_status import DEPLOYMENT
from voicepipe.cluster.placement import Placement
from voicepipe.cluster.replica import VoiceReplica
from voicepipe.cluster.router import STATS_PERIOD_S, CallRouter
from voicepipe.server.settings import ServeSettings

TEXT_PER_CALL = 8  # room for text requests beside the calls: Ray refuses a replica's request past the sum


def build(settings: ServeSettings, placement: Placement) -> Application:
    replica = serve.deployment(
        VoiceReplica, name=DEPLOYMENT, num_replicas=settings.replicas,
        ray_actor_options=placement.actor_options,
        max_ongoing_requests=settings.max_calls * (1 + TEXT_PER_CALL),
        # A dead replica is found within seconds (its calls' proxy learns at once, the controller here).
        health_check_period_s=2, health_check_timeout_s=30, graceful_shutdown_timeout_s=settings.drain_s + 10,
        request_router_config=RequestRouterConfig(request_router_class=CallRouter,
                                                  request_routing_stats_period_s=STATS_PERIOD_S))
    return replica.bind(settings, MetricsBoard.bind())
