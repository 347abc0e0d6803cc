"""KvsMirror: copies one session's output frames and audio to one KVS stream.

    session (event loop) --put_video/put_audio, never blocks--> bounded queue
      --> worker thread: MirrorTimeline + MkvFragmentWriter (PyAV encoding, clusters)
      --call_soon_threadsafe--> FragmentLedger (retry buffer) --> KvsUplink (PutMedia)

The WebRTC path only ever pays for a `put_nowait`: when the queue is full the item is
dropped (and counted), and the worker fills the hole with the last frame or silence. Any
failure of the mirror is logged, counted, and leaves the session running.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import time

import numpy as np
from prometheus_client import CollectorRegistry

from pipeline.clock import FPS
from realtime.kvs.errors import KvsError
from realtime.kvs.ledger import FragmentLedger
from realtime.kvs.metrics import KvsStats, metrics_for
from realtime.kvs.mkv import EncoderSettings, MkvFragment, MkvFragmentWriter
from realtime.kvs.options import KvsOptions
from realtime.kvs.timeline import MirrorTimeline
from realtime.kvs.uplink import KvsUplink

log = logging.getLogger(__name__)

AUDIO_CHUNKS_PER_S = 50  # WebRTC audio comes in 20 ms frames
_CLOSE = object()


def _lower_priority(nice: int) -> None:
    """Make this thread (and the encoder threads it starts, which inherit it) yield the CPU
    to the engine and the WebRTC encoders when cores are scarce. Linux: nice is per thread."""
    if nice <= 0 or not hasattr(os, "setpriority"):
        return
    try:
        current = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), max(current, nice))
    except OSError:
        log.debug("could not lower the KVS encoder's priority", exc_info=True)


class KvsMirror:
    """Mirror of one session. `start()`, then `put_*` from the loop, then `close()`."""

    def __init__(
        self,
        options: KvsOptions,
        stream_name: str,
        width: int,
        height: int,
        fps: int = FPS,
        registry: CollectorRegistry | None = None,
    ) -> None:
        options.validate(fps)
        self.options = options
        self.stream_name = stream_name
        self.stats = KvsStats()
        self._metrics = metrics_for(registry)
        self._settings = EncoderSettings(
            width=width - width % 2,  # 4:2:0 needs even sizes; PyAV scales the frames
            height=height - height % 2,
            fps=fps,
            fragment_frames=options.fragment_frames(fps),
            audio_channels=options.audio_channels,
            video_bitrate=options.video_bitrate,
            audio_bitrate=options.audio_bitrate,
            x264_preset=options.x264_preset,
        )
        capacity = max(8, round(options.input_buffer_s * (fps + AUDIO_CHUNKS_PER_S)))
        self._inbox: queue.Queue = queue.Queue(maxsize=capacity)
        self._ledger = FragmentLedger(
            stream_name, options.retry_buffer_s, self.stats, self._metrics
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._worker: threading.Thread | None = None
        self._worker_done: asyncio.Future[None] | None = None
        self._uplink_task: asyncio.Task[None] | None = None
        self._accepting = False
        self._drop_logged_at = 0.0
        self._closing: asyncio.Future[KvsStats] | None = None
        self.state = "new"  # new, running, failed, closed
        self.error: KvsError | None = None

    # --- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        """Start the encoder thread and the uplink; returns at once (AWS calls run later)."""
        if self.state != "new":
            raise RuntimeError(f"KvsMirror.start() called in state {self.state!r}")
        self._loop = asyncio.get_running_loop()
        self._worker_done = self._loop.create_future()
        self._worker = threading.Thread(
            target=self._work, name=f"kvs-{self.stream_name}", daemon=True
        )
        self._worker.start()
        self._uplink_task = asyncio.create_task(self._run_uplink(), name=f"kvs-{self.stream_name}")
        self._accepting = True
        self.state = "running"

    async def close(self, timeout: float | None = None) -> KvsStats:
        """Flush what was put, wait up to `timeout` for KVS to persist it, stop everything.

        Idempotent: later calls wait for the first one. The session closes its sinks with a
        15 s limit, so the default `close_timeout_s` stays below that.
        """
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close(timeout))
        return await asyncio.shield(self._closing)

    async def _close(self, timeout: float | None) -> KvsStats:
        if self.state == "new":
            self.state = "closed"
            return self.stats
        timeout = self.options.close_timeout_s if timeout is None else timeout
        self._accepting = False
        self._post(_CLOSE, force=True)
        try:
            await asyncio.wait_for(self._drain(), timeout)
        except asyncio.TimeoutError:
            left = len(self._ledger)
            if left:
                log.warning(
                    "KVS stream %s: closing with %d fragment(s) not persisted after %.1f s",
                    self.stream_name,
                    left,
                    timeout,
                )
                self._ledger.drop_all("closed_unpersisted")
        finally:
            await self._stop_tasks()
            self.state = "closed" if self.state != "failed" else "failed"
        log.info("KVS stream %s closed: %s", self.stream_name, self.summary())
        return self.stats

    def summary(self) -> str:
        s = self.stats
        return (
            f"{s.fragments_encoded} fragments encoded, {s.fragments_sent} sent, "
            f"{s.fragments_persisted} persisted, {s.fragments_retried} retried, "
            f"{s.fragments_failed} failed"
        )

    # --- input (event loop side, never blocks) ---------------------------------------
    def put_video(self, frame: np.ndarray, frame_index: int) -> None:
        """Queue one RGB uint8 (H, W, 3) output frame; frame n covers [n/fps, (n+1)/fps)."""
        if self._accepting:
            self._post(("video", frame, frame_index, time.monotonic()))

    def put_audio(self, pcm: np.ndarray, sample_index: int) -> None:
        """Queue int16 48 kHz PCM shaped (n,) or (n, channels) starting at `sample_index`."""
        if self._accepting:
            self._post(("audio", pcm, sample_index, time.monotonic()))

    def _post(self, item: object, force: bool = False) -> None:
        try:
            self._inbox.put_nowait(item)
        except queue.Full:
            if force:  # the close marker must get through: make room for it
                self._discard_one()
                self._post(item, force=True)
                return
            self.stats.input_dropped += 1
            self._metrics.input_dropped.labels("buffer_full").inc()
            now = time.monotonic()
            if now - self._drop_logged_at > 10.0:
                self._drop_logged_at = now
                log.warning(
                    "KVS stream %s: encoder behind, input buffer full; dropping media "
                    "(%d items so far). WebRTC is not affected.",
                    self.stream_name,
                    self.stats.input_dropped,
                )

    def _discard_one(self) -> None:
        try:
            self._inbox.get_nowait()
        except queue.Empty:
            pass

    # --- worker thread ---------------------------------------------------------------
    def _work(self) -> None:
        writer = None
        try:
            _lower_priority(self.options.encoder_nice)  # before x264 spawns its threads
            writer = MkvFragmentWriter(self._settings)
            timeline = MirrorTimeline(
                writer, self.stats, self.options.idle_fill_after_s, self.stream_name
            )
            self._work_loop(writer, timeline)
        except Exception as exc:  # the mirror dies, the session must not
            log.exception("KVS stream %s: encoder failed", self.stream_name)
            self._to_loop(self._on_worker_failed, exc)
        finally:
            if writer is not None:
                writer.close()
            self._to_loop(self._ledger.finish_input)
            self._to_loop(self._set_worker_done)

    def _work_loop(self, writer: MkvFragmentWriter, timeline: MirrorTimeline) -> None:
        header_sent = False
        while True:
            deadline = timeline.next_fill_at()
            wait = 0.5 if deadline is None else min(0.5, max(0.02, deadline - time.monotonic()))
            try:
                item = self._inbox.get(timeout=wait)
            except queue.Empty:
                # Only when the inbox is empty: queued input is not late, just unread.
                self._hand_over(timeline.fill(time.monotonic()))
                continue
            if item is _CLOSE:
                self._hand_over(timeline.finish())
                return
            kind, payload, index, put_at = item
            if kind == "video":
                fragments = timeline.video(payload, index, put_at)
            else:
                fragments = timeline.audio(payload, index, put_at)
            if not header_sent and timeline.origin_wall is not None:  # started
                start_s = time.time() - (time.monotonic() - timeline.origin_wall)
                self._to_loop(self._ledger.set_origin, writer.header.data, start_s)
                header_sent = True
            self._hand_over(fragments)

    def _hand_over(self, fragments: list[MkvFragment]) -> None:
        for fragment in fragments:
            self._to_loop(self._ledger.add, fragment)

    def _to_loop(self, callback, *args) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:
            pass  # the loop is closed: the process is shutting down

    def _set_worker_done(self) -> None:
        if self._worker_done is not None and not self._worker_done.done():
            self._worker_done.set_result(None)

    def _on_worker_failed(self, exc: Exception) -> None:
        self._fail(KvsError(f"encoder failed: {exc!r}"), kind="encoder")

    # --- uplink (event loop) ---------------------------------------------------------
    async def _run_uplink(self) -> None:
        uplink = KvsUplink(self.options, self.stream_name, self._ledger, self.stats, self._metrics)
        try:
            await uplink.run()
        except KvsError as exc:  # already logged and counted by the uplink
            self._fail(exc, kind=None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("KVS stream %s: mirror failed", self.stream_name)
            self._fail(KvsError(repr(exc)), kind="internal")

    def _fail(self, exc: KvsError, kind: str | None) -> None:
        """Stop mirroring for good; the session keeps running."""
        if kind is not None:
            self.stats.errors[kind] += 1
            self._metrics.errors.labels(kind).inc()
        self.error = exc
        self.state = "failed"
        self._accepting = False
        self._post(_CLOSE, force=True)
        dropped = self._ledger.drop_all("mirror_failed")
        if dropped:
            log.warning("KVS stream %s: %d fragment(s) never sent", self.stream_name, dropped)

    async def _drain(self) -> None:
        assert self._worker_done is not None and self._uplink_task is not None
        await self._worker_done
        if self.state != "failed":
            await self._ledger.wait_settled()

    async def _stop_tasks(self) -> None:
        if self._uplink_task is not None:
            self._uplink_task.cancel()
            try:
                await self._uplink_task
            except asyncio.CancelledError:
                pass
        if self._worker is not None:
            # The worker exits after the close marker; the join is brief but blocking.
            await asyncio.to_thread(self._worker.join, 5.0)
