"""Prometheus metrics of the KVS mirror, shared by every mirror of one registry.

Counters carry no stream label (one stream per session would make label sets grow without
bound); per-stream numbers live in each mirror's `KvsStats`.
"""

from __future__ import annotations

import weakref
from collections import Counter as Tally
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class KvsMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(f"facecast_kvs_{name}", doc, labels, registry=registry)

        self.fragments_sent = counter("fragments_sent_total", "Fragment sends, resends included")
        self.fragments_persisted = counter("fragments_persisted_total", "Fragments KVS persisted")
        self.fragments_retried = counter("fragments_retried_total", "Fragments sent again")
        self.possible_duplicates = counter(
            "fragments_possible_duplicates_total",
            "Fragments resent after KVS had RECEIVED them (their PERSISTED ack was lost): "
            "the stream may hold them twice, with the same producer timestamp",
        )
        self.fragments_failed = counter(
            "fragments_failed_total", "Fragments given up on", ("reason",)
        )
        self.errors = counter("errors_total", "Mirror errors by kind", ("kind",))
        self.connections = counter("connections_total", "PutMedia connections opened")
        self.input_dropped = counter(
            "input_dropped_total", "Frames or audio chunks the mirror dropped", ("reason",)
        )
        self.ack_latency = Histogram(
            "facecast_kvs_ack_latency_seconds",
            "From sending a fragment to its final acknowledgement",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32),
            registry=registry,
        )
        self.retry_buffer_seconds = Gauge(
            "facecast_kvs_retry_buffer_seconds",
            "Media held for resending, summed over streams",
            registry=registry,
        )


_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, KvsMetrics] = weakref.WeakKeyDictionary()


def metrics_for(registry: CollectorRegistry | None) -> KvsMetrics:
    """The metrics of `registry`, created once; None gives a private registry."""
    registry = registry if registry is not None else CollectorRegistry()
    metrics = _BY_REGISTRY.get(registry)
    if metrics is None:
        metrics = _BY_REGISTRY[registry] = KvsMetrics(registry)
    return metrics


@dataclass
class KvsStats:
    """What one mirror did; readable at any time, returned by `KvsMirror.close()`."""

    fragments_encoded: int = 0
    fragments_sent: int = 0
    fragments_persisted: int = 0
    fragments_retried: int = 0
    possible_duplicates: int = 0  # resent after a RECEIVED ack (see FragmentLedger)
    fragments_failed: int = 0
    fragments_overflowed: int = 0
    connections: int = 0
    idle_acks: int = 0
    input_dropped: int = 0
    late_dropped: int = 0
    filled_frames: int = 0
    reanchors: int = 0
    errors: Tally[str] = field(default_factory=Tally)
    ack_latencies_s: list[float] = field(default_factory=list)

    def note_latency(self, seconds: float) -> None:
        self.ack_latencies_s.append(seconds)
        del self.ack_latencies_s[:-1000]  # keep the recent ones: bounded memory
