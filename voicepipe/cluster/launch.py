"""`voicepipe serve --replicas N`: start Ray on this machine or join a cluster, deploy the replicas behind
Ray Serve's proxy on the serve host and port, and on SIGTERM or Ctrl-C take them down again."""

import dataclasses
import logging
import os
import signal
import threading

from voicepipe.cluster.placement import PlacementError
from voicepipe.cluster.proxy_hook import IMPORT_PATH
from voicepipe.server.run import say
from voicepipe.server.settings import ServeSettings

HOOK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"


def run_cluster(settings: ServeSettings) -> int:
    """Serve until SIGTERM or SIGINT. A Ray started here is stopped on the way out, with every process it
    started; on a cluster given by --ray-address only this application is deleted. PlacementError when
    Ray Serve is missing or the cluster cannot hold the replicas."""
    try:
        import ray
        from ray import serve
    except ImportError:
        raise PlacementError("--replicas needs Ray Serve: pip install 'voicepipe[cluster]'") from None
    from voicepipe.cluster.deployment import build
    from voicepipe.cluster.fleet_status import APP
    from voicepipe.cluster.placement import place

    own = settings.ray_address is None
    os.environ.setdefault(HOOK_ENV, IMPORT_PATH)  # read by the proxies of the Ray started here
    say("starting Ray on this machine ..." if own else f"joining the Ray cluster at {settings.ray_address} ...")
    ray.init(address=settings.ray_address, include_dashboard=False, logging_level=logging.WARNING,
             configure_logging=False)
    stop = threading.Event()
    try:
        placement = place(settings.replicas, settings.device, ray.cluster_resources())
        settings = dataclasses.replace(settings, device=placement.device)
        serve.start(http_options={"host": settings.host, "port": settings.port})
        say(f"starting {placement.describe(settings.replicas)}; each loads the models and warms up ...")
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        serve.run(build(settings, placement), name=APP, route_prefix="/",
                  logging_config={"log_level": "WARNING", "enable_access_log": False})
        host = f"[{settings.host}]" if ":" in settings.host else settings.host
        print(f"voicepipe: listening on http://{host}:{settings.port} ({settings.replicas} replicas)", flush=True)
        stop.wait()
        say("shutting down: finishing replies in progress ...")
    finally:
        if own:
            serve.shutdown()
        else:
            serve.delete(APP)
        ray.shutdown()
    return 0
