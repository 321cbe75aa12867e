"""Replicas on Ray Serve: `voicepipe serve --replicas N` runs N copies of the single-process server, each
owning its models and engine on one device, behind Ray Serve's HTTP proxy (the `cluster` extra).

Only the command's entry point is named here: importing Ray costs seconds, and `serve` without
`--replicas` never pays it.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from voicepipe.cluster.launch import run_cluster

__all__ = ["run_cluster"]


def __getattr__(name: str) -> Any:
    if name == "run_cluster":
        from voicepipe.cluster.launch import run_cluster

        return run_cluster
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
