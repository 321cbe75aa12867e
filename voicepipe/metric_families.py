"""Metric families made once per Prometheus registry: a family registered twice is an error, and every call
of a server (or several servers over one engine, as in the tests) shares the registry's families."""

import weakref
from collections.abc import Callable
from typing import TypeVar

from prometheus_client import CollectorRegistry

Families = TypeVar("Families")


def once_per_registry(make: Callable[[CollectorRegistry], Families]) -> Callable[[CollectorRegistry], Families]:
    """`make(registry)`, called once for each registry; later calls get what it made."""
    made: weakref.WeakKeyDictionary[CollectorRegistry, Families] = weakref.WeakKeyDictionary()

    def families(registry: CollectorRegistry) -> Families:
        if registry not in made:
            made[registry] = make(registry)
        return made[registry]

    return families
