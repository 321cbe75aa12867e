"""Which replica takes a request, decided in Ray Serve's proxy.

Ray's default router compares two random replicas' counts of ongoing requests, which lumps a call that
lasts minutes with a chat completion that lasts a second. This one knows the difference:

- a call (a websocket on `/ws` or `/v1/realtime`) goes to the replica with the fewest live calls; it then
  stays there for its whole life, as any websocket does behind Ray's proxy;
- a text request goes to the least-loaded replica (its live calls plus the text requests this proxy has
  in flight on it), or, when it names a session (Ray's `x-session-id` header), to the replica that served
  that session before, whose prefix cache holds the conversation so far, unless that replica is busier
  than the least loaded by more than `AFFINITY_SLACK`;
- anything else (the page, probes) is spread the same way as text.

The counts are this proxy's own, exact on one machine (one proxy). Each replica also reports its live calls
(`routing_stats`, refreshed every `STATS_PERIOD_S`), which covers calls placed by the proxies of other
nodes; the larger of the two counts is used. Ties within a rank are left to Ray, which takes the replica
with the shorter queue.
"""

import pickle
import random
import time
from collections import OrderedDict, defaultdict
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, ReplicaResult, RequestRouter, RunningReplica

CALL_PATHS = ("/ws", "/v1/realtime")
AFFINITY_SLACK = 2  # how much busier a session's replica may be before the session moves
SESSIONS_KEPT = 10_000  # session -> replica entries, least recently used dropped first
STATS_PERIOD_S = 1.0
CHOSEN_TTL_S = 30.0  # a choice never routed (its request cancelled first) is forgotten after this


def request_kind(request: PendingRequest | None) -> str:
    """'call', 'text' or 'other', from the ASGI scope the proxy sends."""
    if request is None or not request.args or not isinstance(request.args[0], bytes):
        return "other"
    try:
        scope = pickle.loads(request.args[0]).asgi_scope
    except Exception:  # not a request from the HTTP proxy
        return "other"
    path = scope.get("path", "")
    if scope.get("type") == "websocket" and path in CALL_PATHS:
        return "call"
    return "text" if path.startswith("/v1/") else "other"


class CallRouter(RequestRouter):
    def initialize_state(self, **kwargs: Any) -> None:
        self.calls: dict[ReplicaID, set[str]] = defaultdict(set)  # live calls placed by this proxy
        self.texts: dict[ReplicaID, set[str]] = defaultdict(set)  # text requests in flight
        self.chosen: dict[str, tuple[ReplicaID, float]] = {}  # chosen, not yet routed: seen by concurrent choices
        self.sessions: OrderedDict[str, ReplicaID] = OrderedDict()
        self.kinds: dict[str, str] = {}

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        self._forget_stale_choices()
        kind = request_kind(pending_request)
        count = self.live_calls if kind == "call" else self.load
        scores = {r.replica_id: count(r) for r in candidate_replicas}
        ranks = _ranked(candidate_replicas, scores)
        if kind == "text" and pending_request is not None:
            ranks = self._keep_session(pending_request.metadata.session_id, candidate_replicas, scores, ranks)
        if pending_request is not None:
            request_id = pending_request.metadata.internal_request_id
            self.kinds[request_id] = kind
            self.chosen[request_id] = (ranks[0][0].replica_id, time.monotonic())
        return ranks

    def _forget_stale_choices(self) -> None:
        old = time.monotonic() - CHOSEN_TTL_S
        for request_id in [rid for rid, (_, at) in self.chosen.items() if at < old]:
            del self.chosen[request_id]
            self.kinds.pop(request_id, None)

    def _keep_session(self, session: str, candidates: list[RunningReplica], scores: dict[ReplicaID, int],
                      ranks: list[list[RunningReplica]]) -> list[list[RunningReplica]]:
        held = self.sessions.get(session) if session else None
        home = next((r for r in candidates if r.replica_id == held), None)
        if home is None or scores[home.replica_id] > min(scores.values()) + AFFINITY_SLACK:
            return ranks
        return [[home]] + [[r for r in rank if r is not home] for rank in ranks if rank != [home]]

    def live_calls(self, replica: RunningReplica) -> int:
        reported = (replica.routing_stats or {}).get("calls", 0)
        return max(len(self.calls[replica.replica_id]) + self._chosen(replica, "call"), reported)

    def load(self, replica: RunningReplica) -> int:
        return self.live_calls(replica) + len(self.texts[replica.replica_id]) + self._chosen(replica, "text")

    def _chosen(self, replica: RunningReplica, kind: str) -> int:
        return sum(1 for rid, (r, _) in self.chosen.items() if r == replica.replica_id and self.kinds.get(rid) == kind)

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: ReplicaResult) -> None:
        request_id = pending_request.metadata.internal_request_id
        self.chosen.pop(request_id, None)
        kind = self.kinds.get(request_id, "other")
        if kind == "call":
            self.calls[replica_id].add(request_id)
        elif kind == "text":
            self.texts[replica_id].add(request_id)
            session = pending_request.metadata.session_id
            if session:
                self.sessions[session] = replica_id
                self.sessions.move_to_end(session)
                while len(self.sessions) > SESSIONS_KEPT:
                    self.sessions.popitem(last=False)
        else:
            self.kinds.pop(request_id, None)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        self.kinds.pop(internal_request_id, None)
        self.chosen.pop(internal_request_id, None)
        self.calls[replica_id].discard(internal_request_id)
        self.texts[replica_id].discard(internal_request_id)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        """Forget what was placed on replicas that are gone (a dead replica's calls have ended)."""
        super().update_replicas(replicas)
        alive = {r.replica_id for r in replicas}
        for table in (self.calls, self.texts):
            for replica_id in [r for r in table if r not in alive]:
                del table[replica_id]
        for session in [s for s, r in self.sessions.items() if r not in alive]:
            del self.sessions[session]


def _ranked(replicas: list[RunningReplica], scores: dict[ReplicaID, int]) -> list[list[RunningReplica]]:
    """Replicas grouped by score, lowest first; shuffled within a group so equals share the work."""
    groups: dict[int, list[RunningReplica]] = defaultdict(list)
    for replica in random.sample(replicas, len(replicas)):
        groups[scores[replica.replica_id]].append(replica)
    return [groups[score] for score in sorted(groups)]
