"""Plain-data views of an engine for the page, the notebook, `/metrics` and the tests: read on the engine's
own thread (or between steps), and small enough to cross into another process."""

from prometheus_client import generate_latest

from scheduler.engine import Engine
from scheduler.request import RequestClass


def queue_counts(engine: Engine) -> dict[str, dict[str, int]]:
    """Requests waiting and running, by class."""
    queues = {c.name: {"waiting": 0, "running": 0} for c in RequestClass}
    for state, seqs in (("waiting", engine.planner.waiting), ("running", engine.planner.running)):
        for s in seqs:
            queues[s.cls.name][state] += 1
    return queues


def snapshot(engine: Engine) -> dict:
    """The knobs, queues, pool and recent steps (what the page and the notebook draw)."""
    pool, m, config = engine.pool, engine.metrics, engine.config
    return {
        "config": {"policy": config.policy, "max_batch_tokens": config.max_batch_tokens,
                   "max_batch_seqs": config.max_batch_seqs, "shard_tokens": config.shard_tokens,
                   "page_tokens": pool.page_tokens},
        "queues": queue_counts(engine),
        "tokens_per_s": m.tokens_per_second(),
        "pool": {"pages": pool.num_pages, "slabs": pool.num_slabs, "pages_per_slab": pool.pages_per_slab,
                 "used": pool.num_used, "free": pool.num_free, "cached": len(pool.lru),
                 "pinned_sessions": len(pool.pins), "usage": pool.num_used / pool.num_pages,
                 "fragmentation": pool.fragmentation(), "reserve": pool.reserve},
        "steps": list(m.recent_steps)[-50:],
        "step_cost": step_cost(engine),
    }


def step_cost(engine: Engine) -> dict | None:
    """The engine's cost model as last fitted to its own steps (None: not yet), which sizes steps by time."""
    return engine.planner.costs.fitted


def page(engine: Engine, steps: int = 20) -> dict:
    """The snapshot as a live page draws it every half second: the last `steps` steps, without their
    chunks (most of the snapshot's size), so each call's refresh crosses the channel small."""
    snap = snapshot(engine)
    snap["steps"] = [{k: v for k, v in s.items() if k != "chunks"} for s in snap["steps"][-steps:]]
    return snap


def page_map(engine: Engine) -> list[str]:
    """Each page's state, slab by slab: 'owned', 'cached' or 'free' (for drawing the pool)."""
    pool = engine.pool
    free = {p for f in pool.free_lists for p in f}
    return ["free" if p in free else "cached" if p in pool.lru else "owned" for p in range(pool.num_pages)]


def holdings(engine: Engine) -> dict:
    """What the engine holds: requests, jobs, pages by owner, and whether the pool's books balance (what a
    test checks after a call, an abort or a vanished client, through any client)."""
    pool = engine.pool
    try:
        engine.planner.check_pool()
        pool_error = None
    except AssertionError as e:
        pool_error = str(e) or "the pool's books do not balance"
    return {"requests": len(engine.requests), "jobs": len(engine.jobs), "idle": engine.planner.idle,
            "compiling": len(engine.planner.grammar_waiters()) + len(engine.preparing),
            "used_pages": pool.num_used, "cached_pages": len(pool.lru),
            "live_sessions": sorted(engine.planner.live_sessions),
            "pinned": {session: len(pages) for session, (pages, _) in pool.pins.items()},
            "pool_error": pool_error}


def metrics_text(engine: Engine) -> bytes:
    """The engine's Prometheus families, the queue and pool gauges set to now."""
    m, pool = engine.metrics, engine.pool
    for cls, states in queue_counts(engine).items():
        for state, n in states.items():
            m.queue_depth.labels(cls, state).set(n)
    m.kv_usage.set(pool.num_used / pool.num_pages)
    m.kv_fragmentation.set(pool.fragmentation())
    return generate_latest(m.registry)


VIEWS = {"snapshot": snapshot, "page": page, "page_map": page_map, "holdings": holdings, "metrics_text": metrics_text}
