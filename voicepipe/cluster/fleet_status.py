"""Whether the whole fleet is ready: asked of Ray Serve's controller, which knows every replica's state
(a replica that died is known at once, not after a missed heartbeat)."""

import asyncio
import time

from ray import serve

APP = "voicepipe"
DEPLOYMENT = "VoiceReplica"
CACHE_S = 1.0  # probes may come often; the controller is asked at most this often


class FleetStatus:
    def __init__(self, wanted: int) -> None:
        self.wanted = wanted
        self.asked = -CACHE_S
        self.running = 0
        self.healthy = False

    async def refresh(self) -> None:
        if time.monotonic() - self.asked < CACHE_S:
            return
        status = await asyncio.to_thread(serve.status)
        app = status.applications.get(APP)
        deployment = app.deployments.get(DEPLOYMENT) if app is not None else None
        self.running = deployment.replica_states.get("RUNNING", 0) if deployment is not None else 0
        self.healthy = deployment is not None and deployment.status == "HEALTHY"
        self.asked = time.monotonic()

    async def ready(self, this_replica_ready: bool, draining: bool) -> tuple[bool, dict]:
        """Ready when this replica is and Ray runs every wanted replica (each is warm before it runs)."""
        await self.refresh()
        ready = this_replica_ready and self.healthy and self.running >= self.wanted
        state = "ready" if ready else ("draining" if draining else "warming_up")
        return ready, {"status": state, "replicas": {"running": self.running, "wanted": self.wanted}}
