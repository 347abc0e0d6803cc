"""Custom GPU kernels: the SR stage's frame-window attention (seed 002).

See frame_attention.py for the API; frame_mask.py for the mask in SDPA and FlexAttention form.
"""

from pipeline.kernels.frame_attention import (
    ATTENTION_BACKENDS,
    DEFAULT_GAP_LIMIT,
    BoundedShare,
    KernelConfig,
    bounded_softmax_share,
    flex_frame_attention,
    frame_window_attention,
    windowed_attention,
)
from pipeline.kernels.frame_mask import (
    FrameWindowSpec,
    frame_window_block_mask,
    frame_window_flops,
    frame_window_mask,
    frame_window_mask_mod,
)

__all__ = [
    "ATTENTION_BACKENDS",
    "DEFAULT_GAP_LIMIT",
    "BoundedShare",
    "FrameWindowSpec",
    "KernelConfig",
    "bounded_softmax_share",
    "flex_frame_attention",
    "frame_window_attention",
    "frame_window_block_mask",
    "frame_window_flops",
    "frame_window_mask",
    "frame_window_mask_mod",
    "windowed_attention",
]
