"""The WHEP viewers' Prometheus metrics, on the service's registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class WhepMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.viewers = Gauge(
            "facecast_whep_active_viewers", "WHEP viewers of a session", ["session"], registry=r
        )
        self.viewers_total = Counter(
            "facecast_whep_viewers_total", "WHEP viewers accepted", registry=r
        )
        self.viewers_rejected = Counter(
            "facecast_whep_viewers_rejected_total",
            "WHEP offers refused because the session had --max-viewers",
            registry=r,
        )
        self.frames_encoded = Counter(
            "facecast_whep_video_frames_encoded_total",
            "Video frames encoded for WHEP viewers: once per session and codec, whatever "
            "the number of viewers",
            ["codec"],
            registry=r,
        )
        self.frames_sent = Counter(
            "facecast_whep_video_frames_sent_total",
            "Encoded video frames taken by WHEP viewers' senders (one per viewer and frame)",
            registry=r,
        )
        self.frames_dropped = Counter(
            "facecast_whep_video_frames_dropped_total",
            "Video frames a WHEP viewer did not get: the shared encoder fell behind "
            "(encoder), or the viewer's sender did and resumed at a keyframe (viewer)",
            ["reason"],
            registry=r,
        )
