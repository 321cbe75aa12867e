"""One Prometheus page for the whole fleet: every replica's series labelled with its replica, and the
fleet's totals under `replica="all"`.

Counters, histograms and count-like gauges add up across replicas; ratios (KV cache usage, fragmentation)
and info series do not, so they appear per replica only. A query for the fleet reads `{replica="all"}`,
one for a replica `{replica="<id>"}`; summing over every value of `replica` would count each sample twice.
"""

from collections import defaultdict
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

FLEET = "all"


class Fleet:
    """A collector over replicas' scraped pages (replica id -> exposition text)."""

    def __init__(self, pages: dict[str, str]) -> None:
        self.pages = pages

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        totals: dict[str, dict[tuple, float]] = defaultdict(lambda: defaultdict(float))
        for replica, text in sorted(self.pages.items()):
            for family in text_string_to_metric_families(text):
                metric = merged.setdefault(family.name, Metric(family.name, family.documentation, family.type))
                for sample in family.samples:
                    metric.samples.append(sample._replace(labels={**sample.labels, "replica": replica}))
                    if adds_up(family.name, family.type) and not sample.name.endswith("_created"):
                        totals[family.name][(sample.name, tuple(sample.labels.items()))] += sample.value
        for name, metric in merged.items():
            for (sample_name, labels), value in totals[name].items():
                metric.add_sample(sample_name, {**dict(labels), "replica": FLEET}, value)
            yield metric


def adds_up(name: str, kind: str) -> bool:
    return kind in ("counter", "histogram", "summary") or (kind == "gauge" and not name.endswith(("_ratio", "_info")))


def merge(pages: dict[str, str]) -> bytes:
    """The exposition text of every replica's page as one page, with the fleet's totals."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fleet(pages))
    return generate_latest(registry)
