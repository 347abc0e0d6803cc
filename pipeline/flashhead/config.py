"""FlashHead's config section (`flashhead:` in a preset), and the rules it sets on the
shared schedule."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.clock import FPS
from pipeline.sections import DTYPES, check

if TYPE_CHECKING:
    from pipeline.config import FacecastConfig

SELF_ATTENTION = ("auto", "sdpa", "fp8")  # the self-attention kernels FlashHead's DiT takes


@dataclass
class FlashHeadConfig:
    """SoulX-FlashHead from its published checkpoint (`runtime.stack: flashhead`,
    `pipeline/flashhead/`). Numbers are the authors' inference settings."""

    variant: str = "pro"  # "pro": Wan 2.1 VAE; "lite": LTX-Video VAE
    weights: str | None = None  # the release folder (Model_Pro/, VAE_Wan/, …); --weights
    wav2vec: str | None = None  # a facebook/wav2vec2-base-960h folder; --wav2vec
    chunk_frames: int = 33  # video frames a chunk generates, motion frames included
    motion_latents: int = 2  # latent frames handed from each chunk to the next
    steps: int = 4  # sampling steps, no guidance
    shift: float = 5.0  # timestep shift of the sampler
    color_correction: float = 1.0  # 0: off; 1: each frame's Lab statistics → the reference's
    audio_window_seconds: int = 8  # wav2vec2 re-reads this much audio every chunk
    face_ratio: float = 2.0  # the reference square is this many face widths wide
    # false: the reference is already a face-centred square (scaled and centre-cropped only)
    frame_reference: bool = True
    dtype: str = "auto"  # auto: bfloat16 on a GPU (as the authors run it), float32 on a CPU
    # Pro decodes a chunk's latent frames this many at a time after the first new one, whose
    # frames leave on their own as soon as they exist; 0: the chunk in one wide pass. Unset:
    # 2 on a GPU, where the pieces cost nothing (H200: 258 ms a chunk in 5 passes, 260 in
    # 2), 0 on a CPU, where every pass has a fixed cost of about 0.1 s at any size.
    decode_pass_latents: int | None = None
    # at most this many streams' steps run as one batch (those waiting when the GPU frees)
    batch_streams: int = 4
    # the self-attention's kernel: sdpa (torch's exact SDPA: cuDNN's bf16 kernel on the H200,
    # ~0.8 ms a call at Pro's 9,216 tokens, ~95 ms of a 0.52-s step), fp8 (cuDNN's fused FP8
    # attention on Hopper, through the optional nvidia-cudnn-frontend wheel: q, k and v
    # quantised in the block's compiled graph, one scale each for each call in a batch, so
    # that batched calls keep the frames each gets alone; where the kernel cannot run, the
    # exact path, said once in the log) or auto (fp8 where the linears run in FP8 and the
    # kernel can run here, else sdpa). auto, since the compiled `fp8-fast` build with FP8
    # attention and FP8 output projections passed `facecast gate` (pooled 30.22 dB against
    # bf16, floor 30; FP8 attention alone 31.13) and stepped 5 % faster (H100: 57.8 fps
    # against 55.1; bench/RESULTS.md, twentieth session)
    attention: str = "auto"
    # --precision fp8 on each block's two attention output projections as well (inside the
    # block's compiled graph, their inputs' quantisation fuses into the reshape before them;
    # bf16 they were 15.3 ms of a Pro step on the H200); gated with the FP8 attention above
    fp8_outputs: bool = True

    @property
    def temporal_stride(self) -> int:
        """Video frames per latent frame after the first: Pro's Wan 2.1 VAE 4, Lite's
        LTX-Video VAE 8."""
        return 4 if self.variant == "pro" else 8

    @property
    def motion_frames(self) -> int:
        """Video frames a chunk repeats from the previous one: the first motion latent is
        one frame, each later one a temporal stride of frames."""
        return (self.motion_latents - 1) * self.temporal_stride + 1

    @property
    def new_frames(self) -> int:
        """Video frames a chunk adds: its frames less the motion frames."""
        return self.chunk_frames - self.motion_frames

    def validate(self) -> None:
        check(self.variant in ("pro", "lite"), "flashhead.variant", "must be pro or lite")
        check(
            self.decode_pass_latents is None or self.decode_pass_latents >= 0,
            "flashhead.decode_pass_latents",
            "must be >= 0",
        )
        check(self.batch_streams >= 1, "flashhead.batch_streams", "must be >= 1")
        check(
            self.attention in SELF_ATTENTION,
            "flashhead.attention",
            f"must be one of {', '.join(SELF_ATTENTION)}",
        )
        check(self.chunk_frames >= 9, "flashhead.chunk_frames", "must be >= 9")
        check(self.motion_latents >= 1, "flashhead.motion_latents", "must be >= 1")
        check(1 <= self.steps <= 50, "flashhead.steps", "must be in [1, 50]")
        check(self.shift > 0, "flashhead.shift", "must be > 0")
        check(
            0.0 <= self.color_correction <= 1.0, "flashhead.color_correction", "must be in [0, 1]"
        )
        check(
            self.audio_window_seconds * FPS >= self.chunk_frames,
            "flashhead.audio_window_seconds",
            "must cover a chunk",
        )
        check(1.0 <= self.face_ratio <= 4.0, "flashhead.face_ratio", "must be in [1, 4]")
        check(
            self.dtype in ("auto", *DTYPES), "flashhead.dtype", f"must be auto or one of {DTYPES}"
        )


def check_config(cfg: FacecastConfig) -> None:
    """FlashHead's rules across sections: chunks on VAE latent starts, no seams."""
    fh, sch = cfg.flashhead, cfg.schedule
    new = fh.new_frames
    stride = fh.temporal_stride
    check(
        (fh.chunk_frames - 1) % stride == 0,
        "flashhead.chunk_frames",
        f"must be 1 + a multiple of the VAE's temporal stride {stride}",
    )
    check(
        sch.chunk_latents == new and sch.first_chunk_latents == new,
        "schedule",
        f"a FlashHead chunk adds {new} frames: chunk_latents and first_chunk_latents "
        f"must be {new}, seam and boundary 0",
    )
    check(sch.seam_latents == 0 and sch.boundary_latents == 0, "schedule", "no seams")
