"""One replica: the single-process server's models, engine and app, inside a Ray Serve deployment.

The constructor loads the models and warms them up, so Ray counts a replica as running (and its proxy
sends it requests) only once it can serve a call at full speed. Ray restarts a replica whose process dies.
"""

import asyncio
import contextlib
import logging
import os
import socket

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.types import ASGIApp

from voicepipe.cluster.board import POST_EVERY_S
from voicepipe.cluster.fleet_metrics import merge
from voicepipe.cluster.fleet_status import FleetStatus
from voicepipe.cluster.front import ReplicaFront
from voicepipe.server.settings import ServeSettings

log = logging.getLogger(__name__)


@serve.ingress()
class VoiceReplica:
    async def __init__(self, settings: ServeSettings, board: DeploymentHandle) -> None:
        from voicepipe.call.runtime import Runtime
        from voicepipe.server.voice_server import VoiceServer

        self.name = serve.get_replica_context().replica_id.unique_id
        self.board = board
        self.drain_s = settings.drain_s
        self.fleet = FleetStatus(settings.replicas)
        self.runtime = await Runtime.spawn(settings.model_options())  # its own engine process
        self.runtime.mcp = settings.mcp()
        self.server = VoiceServer(self.runtime, settings.limits(), settings.call_config(), settings.security())
        self.identity = CollectorRegistry()
        Gauge("voicepipe_replica_info", "This replica's process and machine (always 1)", ["pid", "host"],
              registry=self.identity).labels(str(os.getpid()), socket.gethostname()).set(1)
        self.poster = asyncio.create_task(self._post_metrics())

    def __serve_build_asgi_app__(self) -> ASGIApp:
        return ReplicaFront(self.server.app, self.name, self.ready, self.metrics)

    async def ready(self) -> tuple[bool, dict]:
        return await self.fleet.ready(self.server.ready, self.server.draining)

    async def page(self) -> str:
        """This replica's own metrics page."""
        return (await self.runtime.metrics_text() + generate_latest(self.identity)).decode()

    async def metrics(self) -> bytes:
        """Every replica's page (this one's fresh, the others' at most `POST_EVERY_S` old) and the totals."""
        await self.board.post.remote(self.name, await self.page())
        return merge(await self.board.read.remote())

    async def _post_metrics(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # the board restarting: post again next time
                await self.board.post.remote(self.name, await self.page())
            await asyncio.sleep(POST_EVERY_S)

    def record_routing_stats(self) -> dict[str, int]:
        """Read by the router in Ray's proxy (see `voicepipe.cluster.router`)."""
        return {"calls": len(self.server.calls)}

    async def __del__(self) -> None:
        """Ray stops the replica gracefully: finish replies in progress, close the calls, stop the engine."""
        self.poster.cancel()
        await self.server.drain(self.drain_s)
        await self.server.close()
        await self.runtime.close()
        with contextlib.suppress(Exception):
            await self.board.leave.remote(self.name)
