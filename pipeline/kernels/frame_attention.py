"""Block-sparse frame-window attention with a bounded softmax (seed 002), and backend dispatch.

Public API (stable; the SR DiT calls these):

    frame_window_attention(q_BHLD, k_BHLD, v_BHLD, *, tokens_per_frame, window, ref_frames=1,
                           scale=None, softmax="bounded") -> o_BHLD
    windowed_attention(q, k, v, *, backend="sdpa"|"flex"|"facecast", tokens_per_frame, window,
                       ref_frames=1, scale=None) -> o       # the config's `attention:` switch
    bounded_softmax_share(q, k, *, tokens_per_frame, window, ref_frames=1, ...) -> BoundedShare
    frame_window_mask / frame_window_block_mask / frame_window_mask_mod  (frame_mask.py)

Legend: B batch, H heads, L = (R + T) * F tokens (frame-major, R reference frames first),
D head_dim (64 or 128 on the GPU; any power of two >= 16 in the interpreter), F tokens per frame.

The kernel ("facecast" backend):
- *No mask.* Each program owns BLOCK_M query rows inside one frame (BLOCK_M divides F); its key
  loop runs over the reference frames' span, then the window's span, in BLOCK_N steps (BLOCK_N
  divides F). Every block it touches is fully visible, so there is no predicate, no padding, and
  window + reference share one softmax in one pass.
- *Bounded softmax.* A pre-pass stores, per (b, h, frame), the mean key and the radius
  max ||k - mean||. Per row block the kernel derives the mean mu of the keys the rows can see and
  a radius rad >= max ||k - mu|| over them; then every logit is <= scale*(q.mu + ||q|| rad), a
  fixed max for the whole loop (subtracting a per-row constant does not change the softmax), so
  the running max and the rescale of the accumulator leave the inner loop. The row max is at
  least the row mean scale*q.mu, so the bound overshoots by at most scale*||q||*rad. Where that
  exceeds `gap_limit` (log2 units; 2^-64 is far above fp32's underflow) for any row of the block,
  the block runs the classic online softmax in the same kernel.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F_nn

from pipeline.kernels._triton_frame_attention import (
    _frame_attention_fwd,
    _frame_key_stats,
    interpreting,
)
from pipeline.kernels.frame_mask import (
    FrameWindowSpec,
    frame_window_block_mask,
    frame_window_mask,
    visible_frame_span,
)

__all__ = [
    "ATTENTION_BACKENDS",
    "DEFAULT_GAP_LIMIT",
    "BoundedShare",
    "KernelConfig",
    "bounded_softmax_share",
    "frame_window_attention",
    "windowed_attention",
]

ATTENTION_BACKENDS = ("sdpa", "flex", "facecast")
SOFTMAX_MODES = ("bounded", "online")
# Largest overshoot of the bound over the row max (log2 units) the bounded path accepts: the
# true max's exponential is then >= 2^-64, leaving ~60 binades above fp32/bf16 underflow for
# the keys that matter.
DEFAULT_GAP_LIMIT = 64.0
_LOG2E = 1.4426950408889634
_TILES = (128, 64, 32, 16)  # the finest bf16 tile along the sequence is 16


@dataclass(frozen=True)
class KernelConfig:
    """Launch parameters of the attention kernel. Tiles shrink to divide F when they do not."""

    block_m: int = 128
    block_n: int = 64
    num_warps: int = 8
    num_stages: int = 2
    use_tma: bool = True  # Hopper's bulk tensor copies; ignored before sm_90 and in the interpreter
    warp_specialize: bool = False
    pipeline_qk: bool = False  # next block's QK^T issued before this block's softmax


# Chosen on the H200 by bench/attention_bench.py (see bench/RESULTS.md), per head_dim.
# The bounded and online loops each get their own shared-memory ring (Triton does not share
# buffers across the branches), so D=128 with 128-key tiles does not fit in 227 KB.
_DEFAULT_CONFIGS = {
    128: KernelConfig(block_m=128, block_n=64, num_warps=8, num_stages=3, pipeline_qk=True),
    # Pipelining the QK^T costs at D=64 (357 vs 485 TFLOP/s measured): the products are short.
    64: KernelConfig(block_m=128, block_n=64, num_warps=8, num_stages=3),
}


def _tile_dividing(tokens_per_frame: int, preferred: int) -> int:
    for tile in _TILES:
        if tile <= preferred and tokens_per_frame % tile == 0:
            return tile
    raise ValueError(
        f"tokens_per_frame={tokens_per_frame} is not a multiple of 16, the smallest tile the "
        "kernel has: pad the latent token grid so each frame's token count is (e.g. 80x45 "
        "-> 80x48=3840), or use attention: sdpa"
    )


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: FrameWindowSpec) -> int:
    if q.dim() != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(
            f"q, k, v must share one (B, H, L, D) shape, got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(
            f"q, k, v must all be bfloat16 or float16, got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    head_dim = q.shape[-1]
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two >= 16 (64 or 128), got {head_dim}")
    num_video = spec.num_video_frames(q.shape[2])
    _tile_dividing(spec.tokens_per_frame, _TILES[0])  # raises unless F is a multiple of 16
    return num_video


def _resolve_config(
    q: torch.Tensor, tokens_per_frame: int, config: KernelConfig | None, interpret: bool
) -> tuple[KernelConfig, int, int, bool]:
    base = config or _DEFAULT_CONFIGS.get(q.shape[-1], KernelConfig(num_warps=4, num_stages=2))
    block_m = _tile_dividing(tokens_per_frame, base.block_m)
    block_n = _tile_dividing(tokens_per_frame, base.block_n)
    # The interpreter emulates tensor descriptors, so CPU tests cover the TMA code path too.
    has_tma = interpret or torch.cuda.get_device_capability(q.device)[0] >= 9
    return base, block_m, block_n, base.use_tma and has_tma


def key_frame_stats(
    k2: torch.Tensor, heads: int, num_frames: int, tokens_per_frame: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pre-pass of the bounded softmax over k as (B*H*L, D): per (b, h, frame) mean key (fp32,
    (B*H*NF, D)) and radius max ||k - mean|| ((B*H*NF,)). Reads K twice; ~4% of the kernel."""
    D = k2.shape[-1]
    mean_key = torch.empty(heads * num_frames, D, device=k2.device, dtype=torch.float32)
    radius = torch.empty(heads * num_frames, device=k2.device, dtype=torch.float32)
    opts = {"num_warps": 8} if k2.is_cuda else {}
    _frame_key_stats[(num_frames, heads)](
        k2, mean_key, radius, k2.shape[0] // heads, tokens_per_frame,
        BLOCK=_tile_dividing(tokens_per_frame, 128), HEAD_DIM=D, **opts,
    )  # fmt: skip
    return mean_key, radius


def _launch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spec: FrameWindowSpec,
    scale: float | None,
    gap_limit: float,
    config: KernelConfig | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the stats pre-pass and the attention kernel; returns (o_BHLD, bounded_flags_BH_MB)."""
    num_video = _check_inputs(q, k, v, spec)
    B, H, L, D = q.shape
    F, R = spec.tokens_per_frame, spec.ref_frames
    if B * H * L >= 2**31:
        raise ValueError(f"B*H*L = {B * H * L} rows is too many for int32 tile coordinates")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    if not scale > 0:
        raise ValueError(f"scale must be positive, got {scale}")
    interpret = interpreting()
    if interpret == q.is_cuda:
        raise RuntimeError(
            "the facecast kernel runs CUDA tensors with compiled Triton, and CPU tensors only "
            "under Triton's interpreter (TRITON_INTERPRET=1 set before triton is imported; for "
            f"tests): got {q.device} tensors with the interpreter "
            f"{'on' if interpret else 'off'}. On the CPU use attention: sdpa"
        )
    cfg, block_m, block_n, use_tma = _resolve_config(q, F, config, interpret)

    # The kernels index rows of a (B*H*L, D) row-major view.
    q2, k2, v2 = (t.contiguous().view(B * H * L, D) for t in (q, k, v))
    out = torch.empty_like(q2)
    nf = R + num_video
    num_mb = L // block_m
    flags = torch.empty(B * H * num_mb, device=q.device, dtype=torch.int8)

    if gap_limit >= 0:
        mean_key, radius = key_frame_stats(k2, B * H, nf, F)
    else:  # forced online: the bound is computed but never used, skip the pre-pass
        mean_key = torch.zeros(B * H * nf, D, device=q.device, dtype=torch.float32)
        radius = torch.zeros(B * H * nf, device=q.device, dtype=torch.float32)

    if use_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        q_in = TensorDescriptor.from_tensor(q2, [block_m, D])
        k_in = TensorDescriptor.from_tensor(k2, [block_n, D])
        v_in = TensorDescriptor.from_tensor(v2, [block_n, D])
        o_in = TensorDescriptor.from_tensor(out, [block_m, D])
    else:
        q_in, k_in, v_in, o_in = q2, k2, v2, out
    launch_opts = {} if interpret else {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    _frame_attention_fwd[(num_mb, B * H)](
        q_in, k_in, v_in, o_in, mean_key, radius, flags,
        scale * _LOG2E, float(gap_limit),
        L, F, num_video, spec.window, R, num_mb,
        HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n, USE_TMA=use_tma, UPCAST=interpret,
        WARP_SPEC=cfg.warp_specialize and not interpret, PIPE_QK=cfg.pipeline_qk,
        **launch_opts,
    )  # fmt: skip
    return out.view(B, H, L, D), flags.view(B, H, num_mb)


def frame_window_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    tokens_per_frame: int,
    window: int,
    ref_frames: int = 1,
    scale: float | None = None,
    softmax: str = "bounded",
    gap_limit: float = DEFAULT_GAP_LIMIT,
    config: KernelConfig | None = None,
) -> torch.Tensor:
    """Forward attention under the frame-window + reference mask, in one Triton kernel.

    q, k, v: (B, H, L, D) bf16/fp16 on CUDA (CPU tensors run Triton's interpreter: tests only),
    L = (ref_frames + T) * tokens_per_frame, frame-major. tokens_per_frame must be a multiple of
    16 (ValueError otherwise). softmax="bounded" uses the precomputed bound where it is safe and
    the online softmax elsewhere; "online" forces the classic path everywhere. Inference only:
    no autograd. Returns (B, H, L, D) in q's dtype.
    """
    if softmax not in SOFTMAX_MODES:
        raise ValueError(f"softmax must be one of {SOFTMAX_MODES}, got {softmax!r}")
    spec = FrameWindowSpec(tokens_per_frame, window, ref_frames)
    limit = gap_limit if softmax == "bounded" else -1.0
    out, _ = _launch(q, k, v, spec, scale, limit, config)
    return out


@dataclass(frozen=True)
class BoundedShare:
    """How much of an attention call the bounded softmax covers (the rest runs online)."""

    heads: float  # share of (b, h) whose every row block qualifies
    row_blocks: float  # share of (b, h, row block) that qualify
    per_head_BH: torch.Tensor  # bool (B, H)
    max_gap_BH: torch.Tensor  # fp32 (B, H): the largest overshoot bound, log2 units


def bounded_softmax_share(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    tokens_per_frame: int,
    window: int,
    ref_frames: int = 1,
    scale: float | None = None,
    gap_limit: float = DEFAULT_GAP_LIMIT,
    block_m: int | None = None,
) -> BoundedShare:
    """Which heads / row blocks take the bounded path, computed in plain torch (any device).

    Mirrors the kernel's test (tests check they agree). block_m defaults to the tile the kernel
    would use for this head_dim and tokens_per_frame.
    """
    spec = FrameWindowSpec(tokens_per_frame, window, ref_frames)
    num_video = spec.num_video_frames(q.shape[2])
    B, H, L, D = q.shape
    F, R = tokens_per_frame, ref_frames
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    if block_m is None:
        block_m = _tile_dividing(F, _DEFAULT_CONFIGS.get(D, KernelConfig()).block_m)
    nf = R + num_video
    k_frames = k.float().view(B, H, nf, F, D)
    mean_key = k_frames.mean(3)  # (B, H, NF, D)
    radius = (k_frames - mean_key[:, :, :, None]).norm(dim=-1).amax(-1)  # (B, H, NF)
    q_norm = q.float().norm(dim=-1).view(B, H, nf, F // block_m, block_m).amax(-1)
    gaps = torch.empty(B, H, nf, device=q.device)
    for frame in range(nf):
        lo, hi = visible_frame_span(frame, spec, num_video)
        vis = list(range(R)) + list(range(lo, hi))
        mu = mean_key[:, :, vis].mean(2, keepdim=True)
        rad = (radius[:, :, vis] + (mean_key[:, :, vis] - mu).norm(dim=-1)).amax(-1)
        gaps[:, :, frame] = rad
    gap_BHNM = scale * _LOG2E * q_norm * gaps[..., None]  # (B, H, NF, F/BM)
    ok = gap_BHNM <= gap_limit
    per_head = ok.flatten(2).all(-1)
    return BoundedShare(
        heads=per_head.float().mean().item(),
        row_blocks=ok.float().mean().item(),
        per_head_BH=per_head,
        max_gap_BH=gap_BHNM.flatten(2).amax(-1),
    )


# ---- backend dispatch: the config's `attention: sdpa | flex | facecast` ----------------------


@functools.lru_cache(maxsize=4)
def _cached_dense_mask(seq_len: int, spec: FrameWindowSpec, device: str) -> torch.Tensor:
    return frame_window_mask(
        seq_len,
        tokens_per_frame=spec.tokens_per_frame,
        window=spec.window,
        ref_frames=spec.ref_frames,
        device=device,
    )


@functools.lru_cache(maxsize=8)
def _cached_block_mask(seq_len: int, spec: FrameWindowSpec, device: str):
    return frame_window_block_mask(
        seq_len,
        tokens_per_frame=spec.tokens_per_frame,
        window=spec.window,
        ref_frames=spec.ref_frames,
        device=device,
        block_size=_tile_dividing(spec.tokens_per_frame, 128),
    )


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def flex_frame_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask, scale: float | None = None
) -> torch.Tensor:
    """FlexAttention with a frame-window BlockMask; compiled on CUDA, eager on the CPU."""
    if q.is_cuda:
        return _compiled_flex()(q, k, v, block_mask=block_mask, scale=scale)
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(q, k, v, block_mask=block_mask, scale=scale)


def windowed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    backend: str,
    tokens_per_frame: int,
    window: int,
    ref_frames: int = 1,
    scale: float | None = None,
) -> torch.Tensor:
    """The SR DiT's attention under the frame-window mask, by backend (q, k, v: (B, H, L, D)).

    sdpa: the reference (dense bool mask, cached; L*L bytes). flex: FlexAttention with a cached
    BlockMask. facecast: frame_window_attention with the bounded softmax.
    """
    spec = FrameWindowSpec(tokens_per_frame, window, ref_frames)
    seq_len = q.shape[2]
    if backend == "facecast":
        return frame_window_attention(
            q, k, v, tokens_per_frame=tokens_per_frame, window=window, ref_frames=ref_frames,
            scale=scale,
        )  # fmt: skip
    if backend == "flex":
        block_mask = _cached_block_mask(seq_len, spec, str(q.device))
        return flex_frame_attention(q, k, v, block_mask, scale=scale)
    if backend == "sdpa":
        mask = _cached_dense_mask(seq_len, spec, str(q.device))
        return F_nn.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    raise ValueError(f"attention backend must be one of {ATTENTION_BACKENDS}, got {backend!r}")
