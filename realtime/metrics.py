"""Prometheus metrics of the real-time service, one registry per app (no globals).

Generation health is visible as chunk generation time against chunk duration (the
real-time factor, < 1 keeps up); playout health as fresh frames (sent as generated, on
time), repeated frames (generation was late and the last frame was shown again) and dropped
frames (a frame came after its deadline); latency as time to first frame and
speech-to-lips (an audio sample's arrival to the frame made from it leaving).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE_LATEST", "RealtimeMetrics"]


class RealtimeMetrics:
    """All metrics of one server instance, registered in its own `CollectorRegistry`."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self._sent = 0
        self._fresh = 0
        self._missed = 0  # frame deadlines skipped by a late sender
        self.active_sessions = Gauge(
            "facecast_active_sessions", "Peers with a live session", registry=r
        )
        self.sessions_total = Counter("facecast_sessions_total", "Sessions started", registry=r)
        self.sessions_rejected = Counter(
            "facecast_sessions_rejected_total",
            "Offers refused because the server was full",
            registry=r,
        )
        self.ttff = Histogram(
            "facecast_time_to_first_frame_seconds",
            "From the first received audio to the first video frame sent",
            buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1, 1.2, 1.5, 2, 3, 5, 8, 13, 20),
            registry=r,
        )
        self.chunk_generation = Histogram(
            "facecast_chunk_generation_seconds",
            "Wall time of one generate_ready() call that produced frames",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8),
            registry=r,
        )
        self.chunk_duration = Histogram(
            "facecast_chunk_duration_seconds",
            "Video duration produced by that call",
            buckets=(0.04, 0.16, 0.32, 0.64, 1, 1.5, 2, 4),
            registry=r,
        )
        self.realtime_factor = Histogram(
            "facecast_generation_realtime_factor",
            "Chunk generation time divided by chunk duration (< 1 keeps up with real time)",
            buckets=(0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 4, 10),
            registry=r,
        )
        self.queue_depth = Gauge(
            "facecast_video_queue_depth_frames",
            "Generated frames waiting to be sent, summed over sessions",
            registry=r,
        )
        self.frames_sent = Counter(
            "facecast_video_frames_sent_total", "Video frames handed to the encoder", registry=r
        )
        self.frames_fresh = Counter(
            "facecast_video_frames_fresh_total",
            "Frames sent at their deadline as generated (not a repeat of the last one)",
            registry=r,
        )
        self.frames_generated = Counter(
            "facecast_video_frames_generated_total", "Frames the engine made", registry=r
        )
        self.fresh_share = Gauge(
            "facecast_video_fresh_share",
            "Fresh frames over frame deadlines (sent or missed), all sessions since start "
            "(1.0 = every deadline got a new frame)",
            registry=r,
        )
        self.deadlines_missed = Counter(
            "facecast_video_deadlines_missed_total",
            "Frame deadlines the sender reached too late and skipped (a stalled encoder or "
            "media loop): the viewer kept the previous frame",
            registry=r,
        )
        self.speech_to_lips = Histogram(
            "facecast_speech_to_lips_seconds",
            "From an audio sample's arrival to the video frame made from it leaving",
            buckets=(0.25, 0.5, 0.75, 1, 1.25, 1.5, 2, 2.5, 3, 4, 6),
            registry=r,
        )
        self.playout_delay = Histogram(
            "facecast_playout_delay_seconds",
            "Planned delay from audio arrival to its frame, per session start and re-plan",
            buckets=(0.25, 0.5, 0.75, 1, 1.25, 1.5, 2, 2.5, 3, 4, 6),
            registry=r,
        )
        self.startup_seconds = Gauge(
            "facecast_startup_seconds",
            "Engine start-up: load, kernel picks, compilation and warm-up (0 until ready)",
            registry=r,
        )
        self.gpu_memory = Gauge(
            "facecast_gpu_memory_peak_bytes",
            "Peak GPU memory the engine's process allocated (CUDA only)",
            registry=r,
        )
        self.gpu_memory_now = Gauge(
            "facecast_gpu_memory_allocated_bytes",
            "GPU memory the engine's tensors hold now (CUDA only): flat over a long call",
            registry=r,
        )
        self.engine_batches = Gauge(
            "facecast_engine_batches",
            "Batches of sessions' steps the engine ran since start-up (an engine that batches)",
            registry=r,
        )
        self.engine_batched_steps = Gauge(
            "facecast_engine_batched_steps",
            "Sessions' steps in those batches: over facecast_engine_batches, the batch size in use",
            registry=r,
        )
        self.ready = Gauge(
            "facecast_ready", "1 once the engine is warm and sessions are taken", registry=r
        )
        self.frames_repeated = Counter(
            "facecast_video_frames_repeated_total",
            "Deadlines met by repeating the last frame because generation was late",
            registry=r,
        )
        self.frames_dropped = Counter(
            "facecast_video_frames_dropped_total",
            "Generated frames never sent: late for their deadline, or their deadline was skipped",
            registry=r,
        )
        self.frames_skipped = Counter(
            "facecast_generation_skipped_frames_total",
            "Frames never generated because generation was too late for their deadline",
            registry=r,
        )
        self.vad_transitions = Counter(
            "facecast_vad_transitions_total", "VAD state changes", ["transition"], registry=r
        )
        self.utterances = Counter(
            "facecast_utterances_total",
            "Utterances of the utterance channel, by how their playback ended",
            ["outcome"],  # played (whole) or interrupted (cleared)
            registry=r,
        )
        self.session_errors = Counter(
            "facecast_session_errors_total", "Sessions ended by an error", registry=r
        )

    def frame_sent(self, fresh: bool) -> None:
        """Count one frame sent to a peer, fresh or a repeat."""
        self.frames_sent.inc()
        self._sent += 1
        if fresh:
            self.frames_fresh.inc()
            self._fresh += 1
        else:
            self.frames_repeated.inc()
        self._update_fresh_share()

    def deadlines_skipped(self, n: int) -> None:
        """Count `n` frame deadlines a late sender skipped: frames the viewer never got."""
        self.deadlines_missed.inc(n)
        self._missed += n
        self._update_fresh_share()

    def _update_fresh_share(self) -> None:
        self.fresh_share.set(self._fresh / max(1, self._sent + self._missed))

    def render(self) -> bytes:
        """The registry in Prometheus text exposition format."""
        return generate_latest(self.registry)
