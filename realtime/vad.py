"""Voice activity detection with silero-vad, per session, on exact 512-sample windows.

The model shipped inside the silero-vad wheel is loaded per detector (it carries its own
recurrent state, so sessions never share one). Speech starts when a window's probability
reaches `threshold`; it stops after `min_silence_ms` below `neg_threshold` (hysteresis, so
one quiet syllable does not split a sentence). Reported edges are sample positions at
16 kHz; a start edge is moved back by `start_pad_ms` for the model's onset latency.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.clock import MODEL_RATE

# Importing silero_vad sets torch's process-wide thread count to 1, which would leave the
# engine (same process) on one core: keep the count we had.
_threads = torch.get_num_threads()
from silero_vad import load_silero_vad  # noqa: E402

torch.set_num_threads(_threads)

log = logging.getLogger(__name__)
WINDOW = 512  # silero-vad's only supported window at 16 kHz (32 ms)


@dataclass
class VadConfig:
    threshold: float = 0.5
    # Silero's probability decays over ~60-90 ms after the last phoneme; ending where it
    # first falls below 0.5 (no extra pad) keeps the stop edge within ~50 ms of the truth.
    neg_threshold: float = 0.5
    min_silence_ms: int = 300  # longer than a comma pause: one sentence stays one segment
    min_speech_ms: int = 64
    start_pad_ms: int = 32  # the model needs ~one window of speech before it is sure


@dataclass(frozen=True)
class VadEvent:
    kind: str  # "speech_started" | "speech_stopped"
    sample: int  # 16 kHz position of the edge

    @property
    def ms(self) -> float:
        return self.sample * 1000.0 / MODEL_RATE


class VoiceActivityDetector:
    """Feed any-length float32 16 kHz audio; get speech edges as they become certain."""

    def __init__(self, config: VadConfig | None = None) -> None:
        self.config = config or VadConfig()
        self._model = load_silero_vad()
        self._pending = np.zeros(0, np.float32)
        self._pos = 0  # 16 kHz position of the next window's first sample
        self.speaking = False
        self._candidate: int | None = None  # first window of a possible state change
        self._count = 0  # consecutive windows supporting the candidate

    def feed(self, pcm16: np.ndarray) -> list[VadEvent]:
        x = np.nan_to_num(np.asarray(pcm16, np.float32).reshape(-1), nan=0.0)
        self._pending = np.concatenate([self._pending, np.clip(x, -1.0, 1.0)])
        events: list[VadEvent] = []
        while self._pending.size >= WINDOW:
            window, self._pending = self._pending[:WINDOW], self._pending[WINDOW:]
            event = self._step(self._prob(window))
            self._pos += WINDOW
            if event:
                events.append(event)
        return events

    def force_silence(self) -> VadEvent | None:
        """End a running speech segment now (used by interrupt); returns its stop event."""
        self._candidate, self._count = None, 0
        if not self.speaking:
            return None
        self.speaking = False
        return VadEvent("speech_stopped", self._pos)

    def rebase(self, pos16: int) -> None:
        """Continue at another timeline position (queued audio was cut) with fresh state."""
        self._model.reset_states()
        self._pending = np.zeros(0, np.float32)
        self._pos = pos16
        self._candidate, self._count = None, 0

    def _prob(self, window: np.ndarray) -> float:
        with torch.inference_mode():
            return float(self._model(torch.from_numpy(window), MODEL_RATE))

    def _step(self, prob: float) -> VadEvent | None:
        cfg = self.config
        wanted = prob < cfg.neg_threshold if self.speaking else prob >= cfg.threshold
        if not wanted:
            self._candidate, self._count = None, 0
            return None
        if self._candidate is None:
            self._candidate = self._pos
        self._count += 1
        need_ms = cfg.min_silence_ms if self.speaking else cfg.min_speech_ms
        if self._count * WINDOW * 1000 < need_ms * MODEL_RATE:
            return None
        edge, self._candidate, self._count = self._candidate, None, 0
        self.speaking = not self.speaking
        if self.speaking:
            return VadEvent("speech_started", max(0, edge - cfg.start_pad_ms * MODEL_RATE // 1000))
        return VadEvent("speech_stopped", edge)


class VadThread:
    """A detector on its own thread, so silero's model never runs on the event loop.

    `feed` only queues audio; events come back through `on_event`, called on `loop`.
    `reset_at` (interrupt) drops audio not yet looked at, ends a running speech segment and
    continues at a new timeline position, all at once under the detector's lock.
    """

    def __init__(
        self,
        detector: VoiceActivityDetector,
        loop: asyncio.AbstractEventLoop,
        on_event: Callable[[VadEvent], None],
        name: str = "vad",
    ) -> None:
        self.detector = detector
        self._loop = loop
        self._on_event = on_event
        self._queue: queue.SimpleQueue[tuple[int, np.ndarray] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._epoch = 0  # bumped by reset_at: audio queued before it is dropped
        # Not a daemon: at exit Python kills daemon threads where they next take the GIL,
        # and one inside silero's TorchScript call then aborts the process ("terminate
        # called without an active exception"). This one ends between windows instead.
        self._thread = threading.Thread(target=self._run, name=name)
        self._thread.start()

    @property
    def speaking(self) -> bool:
        return self.detector.speaking

    def feed(self, pcm16: np.ndarray) -> None:
        self._queue.put((self._epoch, pcm16))

    def reset_at(self, pos16: int) -> VadEvent | None:
        with self._lock:
            self._epoch += 1
            stop = self.detector.force_silence()
            self.detector.rebase(pos16)
        return stop

    def close(self) -> None:
        """Stop; audio still queued is dropped and no event reaches the owner any more
        (this also breaks the owner -> thread -> callback -> owner reference cycle)."""
        self._on_event = _ignore
        with self._lock:
            self._epoch += 1
        self._queue.put(None)

    def _run(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=0.25)
            except queue.Empty:
                if threading.main_thread().is_alive():
                    continue
                return  # the interpreter is exiting and nobody closed us: end here
            if item is None:
                return
            epoch, pcm16 = item
            with self._lock:
                if epoch != self._epoch:
                    continue
                try:
                    events = self.detector.feed(pcm16)
                except Exception:  # a broken window must not end detection for the session
                    log.exception("vad: feed failed")
                    continue
            for event in events:
                try:
                    self._loop.call_soon_threadsafe(self._on_event, event)
                except RuntimeError:  # the loop closed
                    return


def _ignore(event: VadEvent) -> None:
    pass
