"""The session registry: which worker and node runs each session, and how each one ended.

One named, detached Ray actor per namespace (`facecast-registry`), so every front of the
cluster reads the same table and a front can be restarted without losing it. Workers write
it (a session opened, a session closed and why); fronts write it when a worker is lost (its
sessions end with the worker's reason) and read it to route interrupt and delete calls.
Closed sessions stay listed, with their final state, for the last `keep_closed` of them.
It also keeps the page's uploaded photos, checked and prepared by the front that took them
(`fleet/photos.py`), the newest `MAX_PHOTOS` (each one video-sized frame), so an offer
through any front can name one.

The workers are the source of truth for what they host: each sends its whole picture every
few seconds (`sync`). So a registry whose process died, which Ray restarts empty
(`max_restarts=-1`), has every live session back after one round of syncs, and the recent
ends each worker remembers; a report that was lost while it was down is made good, in
either direction. Only the ends of sessions on workers that are gone too are forgotten.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from typing import Any

from realtime.photos import PhotoStore

REGISTRY = "facecast-registry"


class SessionRegistry:
    """The table itself; Ray makes it an actor (`registry_actor`). Calls run one at a time."""

    def __init__(self, keep_closed: int = 500) -> None:
        self._live: dict[str, dict] = {}
        self._closed: OrderedDict[str, dict] = OrderedDict()
        self._keep = keep_closed
        self._synced: set[tuple[str, str]] = set()  # (worker, incarnation) heard since start
        self._started = round(time.time(), 3)
        self._photos = PhotoStore()

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
        self._trim()

    def _trim(self) -> None:
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

    def sync(self, worker: str, incarnation: str, live: list[dict], ended: list[dict]) -> None:
        """All that one incarnation of `worker` hosts (`live`: records as for `opened`) and
        its recent ends (those records with `closed_reason` and final stats). Its sessions
        unknown here are added; its sessions listed live here that it no longer hosts
        end, with their own reason where it has it. The first sync of an incarnation also
        brings back its recent ends (the history of a registry that started over)."""
        hosted = {r["id"] for r in live}
        for record in live:
            self.opened(record)
        reasons = {r["id"]: r for r in ended}
        gone = [
            sid
            for sid, r in self._live.items()
            if r["worker"] == worker and r["incarnation"] == incarnation and sid not in hosted
        ]
        for sid in gone:
            final = reasons.get(sid, {})
            self.closed(sid, final.get("closed_reason") or f"ended on worker {worker}", final)
        if (worker, incarnation) in self._synced:
            return
        self._synced.add((worker, incarnation))
        for record in ended:
            if record["id"] not in self._live and record["id"] not in self._closed:
                reason = record.get("closed_reason") or f"ended on worker {worker}"
                self._closed[record["id"]] = {**record, "state": "closed", "reason": reason}
        self._trim()

    def add_photo(self, prepared: Any) -> str:
        """Keep a photo a front checked (`PreparedPhoto`); its id for the offer."""
        return self._photos.add(prepared)

    def photo(self, photo_id: str) -> Any | None:
        return self._photos.find(photo_id)

    def about(self) -> dict:
        """This process of the registry: a restart shows as a new pid and start time."""
        return {
            "pid": os.getpid(),
            "started": self._started,
            "live": len(self._live),
            "closed": len(self._closed),
        }

    def lookup(self, session_id: str) -> dict | None:
        return self._live.get(session_id) or self._closed.get(session_id)

    def list(self) -> list[dict]:
        """Live sessions first (oldest first), then the closed ones (newest last)."""
        return [*self._live.values(), *self._closed.values()]


def registry_actor(namespace: str):
    """A handle to the namespace's registry, created on first use. Detached: it outlives
    the front that made it; restarted by Ray if its process dies (its table starts empty
    and the workers' syncs fill it)."""
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
