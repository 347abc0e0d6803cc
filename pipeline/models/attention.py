"""The one attention function every model calls, with a swappable backend.

Backends (config `runtime.attention`):
- `sdpa`: torch's scaled_dot_product_attention; the reference. A frame-window mask becomes
  a dense boolean mask (built once per shape and kept).
- `flex`: FlexAttention (compiled on CUDA) with a block mask whose blocks align with frames.
- `facecast`: the project's Triton kernel (`pipeline.kernels.frame_attention`): block-sparse
  by construction, with the bounded ("unchained") softmax.
- `int8`: unmasked attention with QK in INT8 (`pipeline.kernels.int8_attention`,
  SageAttention's kernels); LiveAvatar's self-attention over its cache. Where the kernels
  cannot take the queries (no GPU, no library, another head dim) it is the exact SDPA path,
  said once in the log.
- `cudnn`: unmasked attention in bf16 on the fastest of cuDNN's engines for each layout
  (`pipeline.kernels.cudnn_attention`, timed once); LiveAvatar's self-attention. Where it
  cannot take the queries, or cuDNN declines the shape, the exact SDPA path, said once.
- `fp8`: unmasked attention with QK and PV in FP8 (`pipeline.kernels.fp8_attention`, cuDNN's
  fused FP8 kernels on Hopper); LiveAvatar's self-attention (`liveavatar.attention`). Where
  they cannot take the queries, or cuDNN declines the shape, the exact SDPA path, said once.
  Over an FP8 KV cache (`cached_fp8_attention`) the keys and values go in as stored, and
  queries quantised where they were made (`e4m3_attention`) go in as they are. FlashHead's
  self-attention (`flashhead.attention: fp8`) quantises q, k and v in its compiled block and
  calls the same.

Unmasked attention (the A2V DiT) always goes to SDPA; `sdpa_backends`, when set from outside
(`pipeline.compile.pick_sdpa_backends`), pins the fastest SDPA kernel measured for each shape.

Shapes: q, k, v are (B, N, L, H) — batch, heads, tokens, head dim.
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

log = logging.getLogger("facecast.attention")


@dataclass(frozen=True)
class FrameWindow:
    """Sparsity of the SR stage: `ref_frames` reference frames, then video frames, each
    `tokens_per_frame` contiguous tokens. A video frame's queries see the reference frames and
    video frames within ±window; reference queries see only the reference frames."""

    tokens_per_frame: int
    window: int
    ref_frames: int = 1


def frame_window_dense_mask(num_tokens: int, spec: FrameWindow, device=None) -> Tensor:
    """Boolean (L, L) mask, True where a query may attend a key.

    Built at frame level and expanded, so the only L*L tensor is the bool result (an
    int64 (L, L) intermediate would be 8x that: 4 GB at rt720's 23040 SR tokens).
    """
    f = spec.tokens_per_frame
    assert num_tokens % f == 0, "token count must be whole frames"
    frame = torch.arange(num_tokens // f, device=device)  # frame ids; reference frames first
    q_frame, k_frame = frame[:, None], frame[None, :]
    r = spec.ref_frames
    q_is_ref, k_is_ref = q_frame < r, k_frame < r
    near = (q_frame - k_frame).abs() <= spec.window
    visible = torch.where(q_is_ref, k_is_ref, k_is_ref | (near & ~k_is_ref))
    return visible.repeat_interleave(f, dim=0).repeat_interleave(f, dim=1)


@functools.cache
def say_fallback(backend: str, reason: str) -> None:
    """One log line per backend and reason for the whole process (every layer would say the
    same)."""
    log.warning("attention %r falls back to torch's exact SDPA: %s", backend, reason)


# kernels from libraries, for unmasked attention: backend → (module, its refusal, its attention)
LIBRARY_BACKENDS = {
    "int8": ("pipeline.kernels.int8_attention", "int8_refusal", "int8_attention"),
    "cudnn": ("pipeline.kernels.cudnn_attention", "cudnn_refusal", "tuned_attention"),
    "fp8": ("pipeline.kernels.fp8_attention", "fp8_refusal", "fp8_attention"),
}


Out = TypeVar("Out")  # what a library kernel gives back: a tensor, or O and its descale


def _kernel_or_none(backend: str, refusal: str | None, run: Callable[[], Out | str]) -> Out | None:
    """`run()` where the kernel takes the queries (`refusal` None) and does not decline the
    shape (a string back); else None, the reason said once in the log."""
    if refusal is None:
        out = run()
        if not isinstance(out, str):
            return out
        refusal = out
    say_fallback(backend, refusal)
    return None


def library_attention(backend: str, q: Tensor, k: Tensor, v: Tensor) -> Tensor | None:
    """The library kernel's attention where it takes these queries; None where it cannot
    (its refusal, or a shape it declines: a string from the kernel), said once in the log."""
    path, refusal_of, attention = LIBRARY_BACKENDS[backend]
    kernels = importlib.import_module(path)  # at its first use: optional libraries behind it
    refusal = getattr(kernels, refusal_of)(q)
    return _kernel_or_none(backend, refusal, lambda: getattr(kernels, attention)(q, k, v))


def cached_fp8_attention(
    q: Tensor, k8: Tensor, v8: Tensor, descale_k: Tensor, descale_v: Tensor
) -> Tensor | None:
    """cuDNN's FP8 attention over keys and values already in e4m3 (an FP8 KV cache); None
    where it cannot run (said once), for the caller to widen them for another kernel."""
    from pipeline.kernels import fp8_attention as kernels

    return _kernel_or_none(
        "fp8",
        kernels.fp8_refusal(q),
        lambda: kernels.fp8_attention_quantised(q, k8, v8, descale_k, descale_v),
    )


@torch.compiler.disable
def e4m3_attention(
    q: Tensor,
    q8: Tensor,
    descale_q: Tensor,
    k8: Tensor,
    v8: Tensor,
    descale_k: Tensor,
    descale_v: Tensor,
) -> tuple[Tensor, Tensor] | None:
    """cuDNN's FP8 attention over queries, keys and values all in e4m3 already, quantised
    where they were made (LiveAvatar's queries and FP8 cache, FlashHead's q, k and v inside
    its compiled block; `q` the queries' full-precision original, which says whether the
    kernel can run here): O in e4m3 and its descale, for the caller to widen; None where it
    cannot run (said once). Never traced: a compiled block calls out to it, as to `Attention`."""
    from pipeline.kernels import fp8_attention as kernels

    return _kernel_or_none(
        "fp8",
        kernels.fp8_refusal(q),
        lambda: kernels.fp8_attention_e4m3(q8, descale_q, k8, v8, descale_k, descale_v),
    )


@torch.compiler.disable
def e4m3_attention_per_sample(
    q: Tensor,
    q8: Tensor,
    descale_q: Tensor,
    k8: Tensor,
    v8: Tensor,
    descale_k: Tensor,
    descale_v: Tensor,
) -> tuple[Tensor, Tensor] | None:
    """`e4m3_attention` for a batch whose samples each have their own scales ((B, 1, 1, 1)
    descales: `per_sample_e4m3`), one kernel call a sample: O in e4m3 (B, N, L, K) and its
    descales (B, 1, 1, 1); None where the kernel cannot run (said once). Each sample's
    output is then what it would be alone."""
    outs = []
    for b in range(q.shape[0]):
        one = slice(b, b + 1)
        out = e4m3_attention(
            q[one], q8[one], descale_q[one], k8[one], v8[one], descale_k[one], descale_v[one]
        )
        if out is None:
            return None
        outs.append(out)
    if len(outs) == 1:
        return outs[0]
    # joined as bytes: concatenation's float8 kernels are not on every build
    o8 = torch.cat([o.view(torch.uint8) for o, _ in outs]).view(torch.float8_e4m3fn)
    return o8, torch.cat([d for _, d in outs])


class Attention(torch.nn.Module):
    """Holds the backend choice and per-shape masks, so the hot path allocates nothing."""

    def __init__(self, backend: str = "sdpa") -> None:
        super().__init__()
        self.backend = backend
        self._masks: dict = {}
        # (B, N, L, H) → SDPBackend, filled by pick_sdpa_backends; empty means torch chooses
        self.sdpa_backends: dict[tuple[int, ...], SDPBackend] = {}

    @torch.compiler.disable
    def forward(self, q: Tensor, k: Tensor, v: Tensor, window: FrameWindow | None = None) -> Tensor:
        # compiled blocks call out to here: the attention kernels are picked and tuned on their
        # own (SDPA backend per shape, compiled FlexAttention, the Triton kernel)
        if window is None:
            if self.backend in LIBRARY_BACKENDS:
                out = library_attention(self.backend, q, k, v)
                if out is not None:
                    return out  # else the exact path below, never a guess
            choice = self.sdpa_backends.get(tuple(q.shape))
            if choice is None:
                return F.scaled_dot_product_attention(q, k, v)
            with sdpa_kernel([choice]):
                return F.scaled_dot_product_attention(q, k, v)
        if self.backend in ("facecast", "flex"):
            from pipeline.kernels.frame_attention import windowed_attention

            return windowed_attention(
                q,
                k,
                v,
                backend=self.backend,
                tokens_per_frame=window.tokens_per_frame,
                window=window.window,
                ref_frames=window.ref_frames,
            )
        key = (q.shape[-2], window, q.device)
        if key not in self._masks:
            self._masks[key] = frame_window_dense_mask(q.shape[-2], window, q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self._masks[key])
