"""The N/I chunk plan, in latent frames on the session's absolute timeline.

N chunks generate the main timeline; N_0 is shorter (first frame sooner) and N_k (k ≥ 1) is
conditioned on the last `b` latent frames of N_{k-1}. I_k smooths the seam between N_k and
N_{k+1}: its sequence runs from the last kept frame of N_k to the first body frame of
N_{k+1}; those two anchors are known and their predictions are thrown away; the 2w frames
between them replace N_k's last w frames and N_{k+1}'s first w frames.

Execution: N0 → N1 → I0 → N2 → I1 → …; emission: N0 body, I0, N1 body, I1, … — every latent
frame exactly once, in time order. With w = 0 there are no I chunks (plain concatenation).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config import ScheduleConfig


@dataclass(frozen=True)
class Chunk:
    kind: str  # "N" or "I"
    index: int
    start: int  # absolute latent position of the sequence's first frame
    length: int  # latent frames in the sequence, known ones included
    known: tuple[int, ...]  # positions within the sequence pinned to given latents
    emit: tuple[int, int]  # absolute [begin, end) of the frames this chunk contributes

    @property
    def end(self) -> int:
        return self.start + self.length


@dataclass(frozen=True)
class StreamStep:
    """One `generate_ready()` step of a stream, in video frames from the stream's start."""

    index: int
    audio_frames: int  # audio the step needs before it can run (lookahead included)
    first_frame: int  # it emits frames [first_frame, end_frame), all at once
    end_frame: int

    @property
    def frames(self) -> int:
        return self.end_frame - self.first_frame


class ChunkPlan:
    def __init__(self, cfg: ScheduleConfig) -> None:
        self.first = cfg.first_chunk_latents
        self.length = cfg.chunk_latents
        self.w = cfg.seam_latents
        self.b = cfg.boundary_latents

    def n_start(self, k: int) -> int:
        return 0 if k == 0 else self.first + (k - 1) * self.length

    def n_end(self, k: int) -> int:
        return self.n_start(k + 1)

    def n_chunk(self, k: int) -> Chunk:
        """N_k. Its body excludes the w frames each side that I chunks regenerate (the tail is
        emitted by I_k, or by `tail` when the stream ends after N_k)."""
        start, end = self.n_start(k), self.n_end(k)
        b = min(self.b, start)  # N_0 has nothing to lean on but the reference
        body_begin = start + (self.w if k > 0 else 0)
        return Chunk(
            "N", k, start - b, b + end - start, tuple(range(b)), (body_begin, end - self.w)
        )

    def i_chunk(self, k: int) -> Chunk:
        """I_k, between N_k and N_{k+1}: anchors at both ends, 2w new frames between."""
        seam = self.n_end(k)
        return Chunk(
            "I",
            k,
            seam - self.w - 1,
            2 * self.w + 2,
            (0, 2 * self.w + 1),
            (seam - self.w, seam + self.w),
        )

    def tail(self, k: int) -> tuple[int, int]:
        """Frames of N_k left unemitted when no N_{k+1} will follow."""
        return self.n_end(k) - self.w, self.n_end(k)

    def step(self, k: int, temporal_ratio: int, lookahead_frames: int) -> StreamStep:
        """Stream step k (N_k, then I_{k-1}) in video frames: the audio it waits for and the
        frames it emits at once. It emits from N_{k-1}'s last kept latent (I_{k-1}) to the
        start of N_k's own tail, which I_k will redo."""
        r = temporal_ratio
        begin = 0 if k == 0 else self.n_end(k - 1) - self.w
        end = self.n_end(k) - self.w
        return StreamStep(k, self.n_end(k) * r + lookahead_frames, begin * r, end * r)

    def seams(self, temporal_ratio: int, n_frames: int) -> list[int]:
        """The video frames where one generated sequence's frames follow another's, within
        the first `n_frames`: each N chunk's start, or with I chunks both ends of each I
        chunk's frames. What `facecast eval` compares with the frames around them."""
        starts: list[int] = []
        for k in range(1, n_frames + 1):
            seam = self.n_start(k)
            if seam * temporal_ratio >= n_frames:
                break
            starts += [seam - self.w, seam + self.w] if self.w else [seam]
        return [s * temporal_ratio for s in starts if 0 < s * temporal_ratio < n_frames]

    def execution_order(self, n_chunks: int) -> list[Chunk]:
        order = [self.n_chunk(0)]
        for k in range(1, n_chunks):
            order += [self.n_chunk(k), self.i_chunk(k - 1)] if self.w > 0 else [self.n_chunk(k)]
        return order
