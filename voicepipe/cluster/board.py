"""The board: where replicas post their metrics page, so that whichever replica answers `/metrics` can
show the whole fleet. A replica cannot ask its siblings directly (requests to a deployment go to one
replica of Ray's choosing), so each posts its own page every few seconds and reads everyone's."""

import time

from ray import serve

POST_EVERY_S = 2.0
FORGET_AFTER_S = 5 * POST_EVERY_S  # a replica that stopped posting is gone: its series leave the page


@serve.deployment(name="MetricsBoard", num_replicas=1, ray_actor_options={"num_cpus": 0})
class MetricsBoard:
    def __init__(self) -> None:
        self.pages: dict[str, tuple[float, str]] = {}

    def post(self, replica: str, page: str) -> None:
        self.pages[replica] = (time.monotonic(), page)

    def leave(self, replica: str) -> None:
        self.pages.pop(replica, None)

    def read(self) -> dict[str, str]:
        """The latest page of each replica that posted recently."""
        now = time.monotonic()
        self.pages = {r: (t, page) for r, (t, page) in self.pages.items() if now - t < FORGET_AFTER_S}
        return {r: page for r, (_, page) in self.pages.items()}
