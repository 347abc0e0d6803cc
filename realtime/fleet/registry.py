"""The session registry: which worker and node runs each session, and how each one ended.

One named, detached Ray actor per namespace (`facecast-registry`), so every front of the
cluster reads the same table and a front can be restarted without losing it. Workers write
it (a session opened, a session closed and why); fronts write it when a worker is lost (its
sessions end with the worker's reason) and read it to route interrupt and delete calls.
Closed sessions stay listed, with their final state, for the last `keep_closed` of them.
"""

from __future__ import annotations

import time
from collections import OrderedDict

REGISTRY = "facecast-registry"


class SessionRegistry:
    """The table itself; Ray makes it an actor (`registry_actor`). Calls run one at a time."""

    def __init__(self, keep_closed: int = 500) -> None:
        self._live: dict[str, dict] = {}
        self._closed: OrderedDict[str, dict] = OrderedDict()
        self._keep = keep_closed

    def opened(self, record: dict) -> None:
        """`record`: id, worker, incarnation, node_id, node_ip, created."""
        if record["id"] not in self._closed:
            self._live[record["id"]] = {**record, "state": "live"}

    def closed(self, session_id: str, reason: str, final: dict | None = None) -> None:
        record = self._live.pop(session_id, None)
        if record is None:
            return  # closed already (a lost worker's session), or never opened here
        record.update(final or {})
        record.update(state="closed", reason=reason, closed_at=round(time.time(), 3))
        self._closed[session_id] = record
        while len(self._closed) > self._keep:
            self._closed.popitem(last=False)

    def worker_lost(self, worker: str, incarnation: str, reason: str) -> list[str]:
        """End every live session of that incarnation of `worker`; returns their ids."""
        ended = [
            sid
            for sid, r in self._live.items()
            if r["worker"] == worker and r["incarnation"] == incarnation
        ]
        for sid in ended:
            self.closed(sid, reason)
        return ended

    def lookup(self, session_id: str) -> dict | None:
        return self._live.get(session_id) or self._closed.get(session_id)

    def list(self) -> list[dict]:
        """Live sessions first (oldest first), then the closed ones (newest last)."""
        return [*self._live.values(), *self._closed.values()]


def registry_actor(namespace: str):
    """A handle to the namespace's registry, created on first use. Detached: it outlives
    the front that made it; restarted by Ray if its process dies (its table starts over)."""
    import ray

    actor = ray.remote(SessionRegistry).options(
        name=REGISTRY,
        namespace=namespace,
        lifetime="detached",
        get_if_exists=True,
        num_cpus=0,
        max_restarts=-1,
    )
    return actor.remote()
