"""The SR stage's frame-window + reference-frame attention mask, in every form a backend wants.

Token layout (the contract with the SR DiT): a sequence of L = (R + T) * F tokens, frame-major.
The first R frames are reference frames, then T video frames, each frame F contiguous tokens.

- a query in video frame i (0-based among the T video frames) sees every key of the video
  frames j with |i - j| <= W, plus every key of the R reference frames;
- a query in a reference frame sees only the reference frames' keys.

Because the mask is a union of whole frames, any tile that divides F is either fully visible
or fully hidden: this is what lets the Triton kernel drop the mask (see frame_attention.py).

Here: the spec dataclass, the dense bool mask (for SDPA, the reference), the FlexAttention
mask_mod / BlockMask, and the count of useful FLOPs for reporting TFLOP/s.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "FrameWindowSpec",
    "frame_window_mask",
    "frame_window_mask_mod",
    "frame_window_block_mask",
    "frame_window_flops",
    "visible_frame_span",
    "visible_pairs",
]


@dataclass(frozen=True)
class FrameWindowSpec:
    """Shape of the mask: tokens per frame F, window W (frames each side), R reference frames."""

    tokens_per_frame: int
    window: int
    ref_frames: int = 1

    def __post_init__(self) -> None:
        if self.tokens_per_frame <= 0:
            raise ValueError(f"tokens_per_frame must be positive, got {self.tokens_per_frame}")
        if self.window < 0:
            raise ValueError(f"window must be >= 0 frames, got {self.window}")
        if self.ref_frames < 0:
            raise ValueError(f"ref_frames must be >= 0, got {self.ref_frames}")

    def num_video_frames(self, seq_len: int) -> int:
        """T for a sequence of seq_len tokens; raises if seq_len is not (R + T) * F."""
        f, r = self.tokens_per_frame, self.ref_frames
        if seq_len % f != 0 or seq_len // f < r:
            raise ValueError(
                f"sequence length {seq_len} is not (ref_frames + T) * tokens_per_frame "
                f"with ref_frames={r}, tokens_per_frame={f}; the SR DiT must lay tokens out "
                "frame-major, reference frames first"
            )
        return seq_len // f - r


def visible_frame_span(frame: int, spec: FrameWindowSpec, num_video: int) -> tuple[int, int]:
    """Half-open range [lo, hi) of global frame indices in the window of `frame`, references excluded.

    Global frame indices count the reference frames first. A reference frame has an empty window.
    """
    r, w = spec.ref_frames, spec.window
    if frame < r:
        return r, r
    i = frame - r
    return r + max(0, i - w), r + min(num_video - 1, i + w) + 1


def frame_window_mask(
    seq_len: int,
    *,
    tokens_per_frame: int,
    window: int,
    ref_frames: int = 1,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Dense (L, L) bool mask, True where a query may attend a key (SDPA's convention).

    L*L bytes: 1.2 GB at rt720's 34560 tokens. Meant for the SDPA reference, not production.
    """
    spec = FrameWindowSpec(tokens_per_frame, window, ref_frames)
    spec.num_video_frames(seq_len)
    frame_L = torch.arange(seq_len, device=device) // tokens_per_frame
    return _visible(frame_L[:, None], frame_L[None, :], spec)


def _visible(q_frame: torch.Tensor, k_frame: torch.Tensor, spec: FrameWindowSpec) -> torch.Tensor:
    """Frame-level visibility, broadcasting; written with tensor ops only so FlexAttention can trace it."""
    r = spec.ref_frames
    key_is_ref = k_frame < r
    both_video = (q_frame >= r) & (k_frame >= r)
    near = (q_frame - k_frame).abs() <= spec.window
    return key_is_ref | (both_video & near)


def frame_window_mask_mod(*, tokens_per_frame: int, window: int, ref_frames: int = 1):
    """FlexAttention mask_mod(b, h, q_idx, kv_idx) -> bool for the frame-window mask."""
    spec = FrameWindowSpec(tokens_per_frame, window, ref_frames)
    f = tokens_per_frame

    def mask_mod(b, h, q_idx, kv_idx):
        return _visible(q_idx // f, kv_idx // f, spec)

    return mask_mod


def frame_window_block_mask(
    seq_len: int,
    *,
    tokens_per_frame: int,
    window: int,
    ref_frames: int = 1,
    device: torch.device | str | None = None,
    block_size: int = 128,
):
    """FlexAttention BlockMask for the frame-window mask (broadcast over batch and heads).

    With block_size dividing tokens_per_frame every block is full or empty, so FlexAttention
    skips the mask_mod on all of them; otherwise it still is correct, with partial blocks.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    spec = FrameWindowSpec(tokens_per_frame, window, ref_frames)
    spec.num_video_frames(seq_len)
    mask_mod = frame_window_mask_mod(
        tokens_per_frame=tokens_per_frame, window=window, ref_frames=ref_frames
    )
    return create_block_mask(
        mask_mod,
        B=None,
        H=None,
        Q_LEN=seq_len,
        KV_LEN=seq_len,
        device=device,
        BLOCK_SIZE=block_size,
    )


def visible_pairs(seq_len: int, spec: FrameWindowSpec) -> int:
    """Number of (query, key) pairs the mask lets through, for one (batch, head)."""
    num_video = spec.num_video_frames(seq_len)
    f, r = spec.tokens_per_frame, spec.ref_frames
    frames = r * r  # reference rows see the reference frames only
    for frame in range(r, r + num_video):
        lo, hi = visible_frame_span(frame, spec, num_video)
        frames += r + (hi - lo)
    return frames * f * f


def frame_window_flops(
    batch: int, heads: int, seq_len: int, head_dim: int, spec: FrameWindowSpec | None
) -> int:
    """Useful forward FLOPs: 4 * D per visible (query, key) pair (QK^T and PV), all heads.

    spec=None counts the dense (unmasked) attention at the same length.
    """
    pairs = seq_len * seq_len if spec is None else visible_pairs(seq_len, spec)
    return 4 * head_dim * pairs * heads * batch
