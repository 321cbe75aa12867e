"""Where each replica runs: one GPU per replica when the cluster has GPUs, else an equal share of its CPUs.

A replica owns one engine, and the engine owns its device; two replicas never share a GPU. On CPUs Ray
sets each replica's OMP_NUM_THREADS from its share, so the replicas' model threads do not fight.
"""

from dataclasses import dataclass


class PlacementError(ValueError):
    """The cluster cannot hold the replicas asked for."""


@dataclass(frozen=True)
class Placement:
    device: str  # the replicas' --device
    actor_options: dict[str, float]  # Ray's resources for each replica

    def describe(self, replicas: int) -> str:
        if self.device == "cuda":
            return f"{replicas} replicas, one GPU each"
        return f"{replicas} replicas, {self.actor_options['num_cpus']:g} CPUs each"


def place(replicas: int, device: str, resources: dict[str, float]) -> Placement:
    """The placement of `replicas` replicas asked to run on `device` (auto, cpu, cuda) in a cluster with
    `resources` (ray.cluster_resources())."""
    gpus = int(resources.get("GPU", 0))
    if device != "cpu" and gpus:
        if gpus < replicas:
            raise PlacementError(f"{replicas} replicas need {replicas} GPUs, one each; the cluster has {gpus}")
        return Placement("cuda", {"num_gpus": 1, "num_cpus": 1})
    if device == "cuda":
        raise PlacementError("--device cuda, but the Ray cluster has no GPUs")
    share = resources.get("CPU", 0) / replicas
    if share <= 0:
        raise PlacementError("the Ray cluster has no CPUs")
    return Placement("cpu", {"num_cpus": round(share, 2)})
