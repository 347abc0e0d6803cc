"""The audio side of a real model's stream, written once: chunks made in order, each as soon
as the audio it reads has arrived, each reading a window of the audio that ends with it.

FlashHead (`pipeline.flashhead.engine`) and LiveAvatar (`pipeline.liveavatar.engine`) make
their frames a chunk at a time (28 frames, or a 12-frame block) from the last few seconds of
audio. What they share lives here: the audio timeline and how much of it is kept (one window
back from the next chunk's end), when a chunk can run, the end of the audio (the chunks that
cover it, the last one trimmed), frames handed to the sinks, in order, each once. A model's
stream says where chunk k's audio ends (`audio_end`) and makes its frames (`make_chunk`).

A stream that starts chunk k+1 while chunk k's frames are still being finished (LiveAvatar
decodes block k beside block k+1's DiT) reads one chunk ahead (`read_ahead`): it asks for
the next chunk's audio too (`samples_wanted`), which a feed with a backlog hands over, and
uses it where it is there. A chunk so started is finished once the audio of the chunk after
it is here (so that it, too, finishes beside the next one's start) or at the audio's end:
with a backlog that is at once; a feed that has caught up waits one chunk's audio, once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch import Tensor

from pipeline.clock import MODEL_SAMPLES_PER_FRAME
from pipeline.config import FacecastConfig
from pipeline.schedule import Chunk, ChunkPlan
from pipeline.stream import FrameBatch, StageTimes
from pipeline.timeline import AudioTimeline


class WindowedStream:
    """`pipeline.stream.AvatarStream` for a model whose chunk k reads the `window` samples
    of audio before `audio_end(k)`. Subclasses implement `audio_end`, `make_chunk` and
    `release` (drop what the stream holds on the device)."""

    def __init__(
        self,
        cfg: FacecastConfig,
        window: int,
        sinks: list[Callable[[FrameBatch], None]],
    ) -> None:
        self.cfg = cfg
        self.window = window  # model-rate samples a chunk reads, ending at its audio_end
        self.sinks = sinks
        self.plan = ChunkPlan(cfg.schedule)
        self.times = StageTimes()
        self.timeline = AudioTimeline()
        self.next_n = 0
        self.frames_emitted = 0
        self.total_frames: int | None = None
        self.chunk_log: deque[Chunk] = deque(maxlen=64)
        self.closed = False
        self.read_ahead = 0  # chunks past the next whose audio the stream can use now

    # -- what a model's stream says ----------------------------------------------------------
    def audio_end(self, k: int) -> int:
        """The model-rate sample chunk k waits for (its window ends there)."""
        raise NotImplementedError

    def make_chunk(self, k: int, chunk: Chunk) -> Iterator[np.ndarray]:
        """Chunk k's frames, uint8 (N, H, W, 3) pieces in order, from the window ending at
        `audio_end(k)`: one piece, or several that leave as soon as each exists."""
        raise NotImplementedError

    def release(self) -> None:
        """Free what the stream holds (it makes no more chunks after)."""
        raise NotImplementedError

    def started_ahead(self, k: int) -> bool:
        """Whether chunk k was started during chunk k-1's step (a stream that reads ahead)."""
        return False

    # -- streaming API (pipeline.stream.AvatarStream) --------------------------------------
    def push_audio(self, samples: np.ndarray) -> None:
        if self.total_frames is not None:
            raise RuntimeError("push_audio after finish(): the stream has ended")
        self.timeline.append(samples)

    def samples_needed(self) -> int:
        if self.total_frames is not None:
            return 0
        return max(0, self._next_audio_end() - self.timeline.total)

    def samples_wanted(self) -> int:
        """Model-rate samples the stream can use now: the next step's, and, for a stream
        that reads ahead, the following step's too (`pipeline.stream.samples_wanted`)."""
        if self.total_frames is not None:
            return 0
        return max(0, self.audio_end(self.next_n + self.read_ahead) - self.timeline.total)

    def steps_to_frames(self) -> int:
        """Steps until audio handed now is frames (`pipeline.stream.steps_to_frames`): two
        while the next chunk was started ahead, since the chunk that audio belongs to is then
        started in the next step and finished in the one after."""
        return 2 if self.started_ahead(self.next_n) else 1

    def has_audio_for(self, k: int) -> bool:
        """Whether chunk k's audio has all arrived (and the audio has not ended, which
        would change what chunk k reads past the end)."""
        return self.total_frames is None and self.timeline.total >= self.audio_end(k)

    def generate_ready(self) -> list[FrameBatch]:
        return list(self.iter_ready())

    def iter_ready(self) -> Iterator[FrameBatch]:
        """`generate_ready`, piece by piece: each batch as soon as its frames exist (a
        consumer must take them all before calling the stream again)."""
        while self.total_frames is None and self.timeline.total >= self._next_audio_end():
            yield from self._advance()

    def finish(self) -> list[FrameBatch]:
        """End of audio: the chunks that cover it (silence after it), frames trimmed."""
        if self.total_frames is not None:
            return []
        self.total_frames = round(self.timeline.total / MODEL_SAMPLES_PER_FRAME)
        out: list[FrameBatch] = []
        while self.frames_emitted < self.total_frames:
            out += self._advance()
        self.release()
        return out

    def close(self) -> None:
        self.release()
        self.closed = True

    def _next_audio_end(self) -> int:
        """The sample the next step waits for: its chunk's audio end, or, for a chunk
        started ahead, the end of the chunk after it (see the module's docstring)."""
        k = self.next_n
        return self.audio_end(k + 1 if self.started_ahead(k) else k)

    def window_audio(self, k: int) -> tuple[np.ndarray, int]:
        """Chunk k's window of audio (zeros before the stream began) and the sample it
        starts at."""
        end = self.audio_end(k)
        return self.timeline.read(end - self.window, end), end - self.window

    def _advance(self) -> Iterator[FrameBatch]:
        """Chunk k's frames, piece by piece, to the sinks and the caller; then the next k."""
        k = self.next_n
        chunk = self.plan.n_chunk(k)
        self.chunk_log.append(chunk)
        start = chunk.start
        for frames in self.make_chunk(k, chunk):
            if self.total_frames is not None:
                frames = frames[: max(0, self.total_frames - start)]
            if len(frames) == 0:
                continue
            batch = FrameBatch(start, frames)
            start += len(frames)
            self.frames_emitted = start
            for sink in self.sinks:
                sink(batch)
            yield batch
        self.frames_emitted = max(self.frames_emitted, chunk.start)
        self.next_n += 1
        self.timeline.drop_before(self.audio_end(self.next_n) - self.window)


def to_uint8_frames(video_3FHW: Tensor) -> np.ndarray:
    """[-1, 1] pixels → uint8 (F, H, W, 3) on the host, truncated as the authors' writers do
    (`astype(uint8)`), for every stream here."""
    return HostFrames(video_3FHW).numpy()


class HostFrames:
    """`to_uint8_frames` in two halves: made, the frames are converted on the device and
    their copy to pinned host memory is queued; `numpy()` waits for that copy alone. Between
    the two the host can queue the GPU's next work (the next decode pass) instead of leaving
    the GPU idle while it waits, converts and launches."""

    def __init__(self, video_3FHW: Tensor) -> None:
        frames = (((video_3FHW.float() + 1) / 2).clamp(0, 1) * 255).permute(1, 2, 3, 0)
        frames = frames.to(torch.uint8)
        self.done: torch.cuda.Event | None = None
        if frames.is_cuda:
            self.host = torch.empty(frames.shape, dtype=torch.uint8, pin_memory=True)
            self.host.copy_(frames, non_blocking=True)
            self.done = torch.cuda.Event()
            self.done.record()
        else:
            self.host = frames.contiguous()

    def numpy(self) -> np.ndarray:
        if self.done is not None:
            self.done.synchronize()
        return self.host.numpy()
