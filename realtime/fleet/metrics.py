"""The front's `/metrics`: its own fleet gauges plus every worker's metrics, each sample
labelled with its `worker`.

A worker's metrics are the server's (`realtime.metrics.RealtimeMetrics`: sessions, fresh
share, generation real-time factor, GPU memory, …), read through its actor with a timeout;
a worker that does not answer is left out of that scrape (`facecast_fleet_worker_up` says
which). Families of the same name from several workers are merged into one, as the text
format requires.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families


class FleetMetrics:
    """The front's own metrics (its registry) and the scrape that merges the workers'."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.workers = Gauge("facecast_fleet_workers", "Workers by state", ["state"], registry=r)
        self.slots = Gauge(
            "facecast_fleet_session_slots", "Session slots of ready workers", ["kind"], registry=r
        )
        self.up = Gauge(
            "facecast_fleet_worker_up",
            "1 if the worker answered this scrape",
            ["worker", "node_ip"],
            registry=r,
        )
        self.rejected = Counter(
            "facecast_fleet_offers_rejected_total",
            "Offers refused because every worker was full (or none was ready)",
            registry=r,
        )
        self.placed = Counter(
            "facecast_fleet_offers_placed_total", "Offers placed", ["worker"], registry=r
        )
        self.lost = Counter(
            "facecast_fleet_workers_lost_total",
            "Workers that died or stopped answering",
            registry=r,
        )

    async def render(self, pool) -> bytes:
        """Fleet gauges now, then the workers' metrics, merged with a `worker` label."""
        states: dict[str, int] = {}
        for view in pool.workers.values():
            states[view.state] = states.get(view.state, 0) + 1
        self.workers.clear()
        for state, count in states.items():
            self.workers.labels(state).set(count)
        cap = pool.capacity()
        self.slots.labels("total").set(cap["slots"])
        self.slots.labels("free").set(cap["free"])
        live = [v for v in pool.workers.values() if v.state in ("ok", "draining")]
        texts = await asyncio.gather(
            *(pool.on_worker(v, "metrics") for v in live), return_exceptions=True
        )
        self.up.clear()
        scraped = []
        for view, text in zip(live, texts, strict=True):
            up = self.up.labels(view.name, view.status.get("node_ip") or "")
            if isinstance(text, bytes):
                up.set(1)
                scraped.append((view.name, text.decode()))
            else:
                up.set(0)
        return generate_latest(self.registry) + merge_labelled(scraped)


METRICS = web.AppKey("facecast-fleet-metrics", FleetMetrics)


def merge_labelled(scraped: list[tuple[str, str]]) -> bytes:
    """Prometheus texts of several workers as one, each sample with `worker="NAME"`."""
    families: dict[str, Metric] = {}
    for worker, text in scraped:
        for family in text_string_to_metric_families(text):
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(
                    family.name, family.documentation, family.type, family.unit
                )
            for s in family.samples:
                merged.add_sample(s.name, {**s.labels, "worker": worker}, s.value, s.timestamp)
    registry = CollectorRegistry()
    registry.register(_Fixed(list(families.values())))
    return generate_latest(registry)


class _Fixed:
    """A collector that yields families already built."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self):
        return iter(self._families)
