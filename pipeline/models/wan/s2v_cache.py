"""The state a LiveAvatar stream carries between blocks, and how each forward reads it.

`S2VCache` is allocated once per stream (memory does not depend on the stream's length).
A layer's self-attention hands its keys and values to a `KeyValues` strategy, which
decides what the queries attend to:
- `SinkPrefill`: the sink (reference + motion tokens) attends to itself; its keys before
  RoPE and its values are kept;
- `CachedStep`: a block at one sampling step writes its keys and values into its ring slot
  of that step's buffer and attends to the sink (rotated for this block) and the filled
  slots: the streaming path. The sink's rotation changes only where the reference slides,
  and only from block to block, so each step's buffer keeps its rotated sink keys and a
  forward rewrites only the reference's part, copied from a step that already rotated it for
  this block when there is one (on the H200 re-rotating all 2,640 sink keys in every forward
  of every layer was ~55 ms of a 0.87 s block);
- `BlockCausalMask`: the whole sequence at once through a mask (tests).

The step buffers may hold keys and values in FP8 (e4m3, `kv_cache: fp8`): half the bytes
of bf16 (26 GB instead of 52 at LiveAvatar's shape on one H200), each layer's keys and
values scaled by one number each, set when the sink is prefilled from its own largest value
with the headroom the FP8 linears keep (`pipeline.precision.STATIC_HEADROOM`; larger
values saturate). A forward's
keys and values are rounded to e4m3 once, when written, never again when read: cuDNN's FP8
attention reads them as they are (`Attended.descales`), any other kernel gets them widened.

Legend: B batch, L tokens, N heads, K head dim, S sampling steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from pipeline.models.layers import apply_rope
from pipeline.models.wan.s2v_sink import Rope
from pipeline.precision import E4M3_MAX, STATIC_HEADROOM, scaled_e4m3, widened_e4m3

# On a GPU one fused kernel a write (eager, the fp32 copy, the divide, the clamp and the cast
# are four passes over the block's keys: ~40 ms a LiveAvatar block by their bytes). A few
# fixed shapes: a block's keys and values, the reference's sink keys, the sink's values.
quantise_compiled = torch.compile(scaled_e4m3, dynamic=False)


@dataclass(frozen=True)
class Attended:
    """What a block's queries attend to: keys and values (B, N, L', K), a mask or None, and
    for an FP8 cache the keys' and values' descales ((1, 1, 1, 1) fp32: stored x descale =
    the value), else None."""

    k: Tensor
    v: Tensor
    mask: Tensor | None = None
    descales: tuple[Tensor, Tensor] | None = None

    def widened(self, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """Keys and values in `dtype`, as a kernel that cannot read FP8 takes them."""
        if self.descales is None:
            return self.k, self.v
        dk, dv = self.descales
        return widened_e4m3(self.k, dk, dtype), widened_e4m3(self.v, dv, dtype)


class KeyValues(Protocol):
    """Where a layer's self-attention finds its keys and values: it receives the current
    tokens' normed keys before RoPE (B, L, N, K), and their keys rotated and values (B, N,
    L, K), keeps what it must, and returns keys and values (B, N, L', K) to attend to, and a
    mask or None."""

    def __call__(self, layer: int, k_raw: Tensor, k_rot: Tensor, v: Tensor) -> Attended: ...


@dataclass
class S2VCache:
    """Everything a stream carries between blocks, allocated once (memory does not grow
    with the stream's length).

    Per sampling step and layer, one buffer of keys and one of values, (B, N, Ls + W, K):
    the sink's Ls tokens first (values copied in once; keys rotated anew each forward),
    then a ring of `window_frames / frames_per_block` block slots. A block writes its slot
    while it is denoised; the valid part is always the prefix [0, Ls + filled slots).
    """

    k: Tensor  # (S, layers, B, N, Ls + W, K)
    v: Tensor
    sink_k: Tensor  # (layers, B, Ls, N, K): normed keys before RoPE
    text_k: Tensor  # (layers, B, N, text_len, K): the prompt's keys, normed
    text_v: Tensor
    sink_rope_pos: Tensor  # (Ls, 3) fp64: the reference at its prefill position
    grid: tuple[int, int]  # token grid (h, w)
    ref_tokens: int
    block_tokens: int
    slots: int
    # an FP8 cache's per-layer descales, (layers,) fp32, set at prefill; None: k, v as they are
    k_descale: Tensor | None = None
    v_descale: Tensor | None = None
    block: int = 0  # absolute index of the block being generated
    prefilled: bool = False
    # per step buffer: the reference's shift its sink keys are rotated for (None: not yet)
    sink_shifts: list[int | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sink_shifts = [None] * self.k.shape[0]

    @property
    def sink_tokens(self) -> int:
        return self.sink_k.shape[2]

    @property
    def fp8(self) -> bool:
        return self.k_descale is not None

    def store(self, buffer: Tensor, x: Tensor, layer: int, values: bool) -> None:
        """Write keys (or values) `x` into a view of a step buffer: as they are, or for an
        FP8 cache scaled by the layer's descale, saturated, and rounded to e4m3."""
        descale = self.v_descale if values else self.k_descale
        if descale is None:
            buffer.copy_(x)
            return
        quantise = quantise_compiled if x.is_cuda else scaled_e4m3
        buffer.copy_(quantise(x, descale[layer]))

    def set_descales(self, layer: int, k: Tensor, v: Tensor) -> None:
        """An FP8 cache's scales for a layer, from the sink's own keys and values (on the
        GPU, no wait for the host)."""
        if self.k_descale is None or self.v_descale is None:
            return
        for descale, x in ((self.k_descale, k), (self.v_descale, v)):
            largest = x.detach().abs().amax().float()
            descale[layer] = (largest * STATIC_HEADROOM / E4M3_MAX).clamp(min=1e-12)

    def attended(self, step: int, layer: int, valid: int) -> Attended:
        """The prefix [0, valid) of a step's buffers, and an FP8 cache's descales."""
        k, v = self.k[step, layer, :, :, :valid], self.v[step, layer, :, :, :valid]
        if self.k_descale is None or self.v_descale is None:
            return Attended(k, v)
        one = (1, 1, 1, 1)
        return Attended(
            k, v, descales=(self.k_descale[layer].reshape(one), self.v_descale[layer].reshape(one))
        )

    def text_kv(self, layer: int) -> tuple[Tensor, Tensor]:
        return self.text_k[layer], self.text_v[layer]

    def slot(self) -> int:
        return self.block % self.slots

    def valid(self) -> int:
        """Keys the current block sees: the sink and every filled slot, its own included."""
        return self.sink_tokens + min(self.block + 1, self.slots) * self.block_tokens

    def advance(self) -> None:
        """The block is final (its K/V written by each step): the next block's turn."""
        self.block += 1

    def nbytes(self) -> int:
        tensors = (self.k, self.v, self.sink_k, self.text_k, self.text_v)
        return sum(t.numel() * t.element_size() for t in tensors)

    def nbytes_kv(self) -> int:
        """The step buffers alone: what an FP8 cache halves."""
        return sum(t.numel() * t.element_size() for t in (self.k, self.v))


class SinkPrefill:
    """The sink attends to itself; its normed keys (before RoPE) and values are kept."""

    def __init__(self, cache: S2VCache) -> None:
        self.cache = cache
        cache.sink_shifts = [None] * len(cache.sink_shifts)  # rotated by the first block

    def __call__(self, layer: int, k_raw: Tensor, k_rot: Tensor, v: Tensor) -> Attended:
        c, n = self.cache, k_raw.shape[1]
        c.sink_k[layer] = k_raw
        c.set_descales(layer, k_rot, v)
        c.store(c.v[:, layer, :, :, :n], v[None], layer, values=True)  # every step's buffer
        return Attended(k_rot, v)


class CachedStep:
    """One step of a block: write the block's K/V into its slot of this step's ring, and
    attend to the sink (rotated for this block) and the filled slots.

    `shift` is how far the reference has slid for this block (`S2VTransformer.sink_shift`)
    and `sink_rope()` the sink's angles at that shift, asked for only when some keys must be
    rotated. The motion tokens never slide, so once a step's buffer holds the rotated sink,
    a new shift rewrites only the reference's `ref_tokens` keys. `finish()`, after the
    forward's last layer, records the shift the step's buffer now holds."""

    def __init__(
        self, cache: S2VCache, step: int, shift: int, sink_rope: Callable[[], Rope]
    ) -> None:
        self.cache, self.step, self.shift = cache, step, shift
        self.start = cache.sink_tokens + cache.slot() * cache.block_tokens
        self.valid = cache.valid()
        held = cache.sink_shifts[step]
        # sink keys to (re)write: none, the reference's, or all of them (a fresh buffer)
        self.rewrite = (
            0 if held == shift else cache.sink_tokens if held is None else cache.ref_tokens
        )
        # a step whose buffer already holds the whole sink at this shift: copy, not rotate
        self.source = next((s for s, h in enumerate(cache.sink_shifts) if h == shift), None)
        self.rope = sink_rope() if self.rewrite and self.source is None else None

    def __call__(self, layer: int, k_raw: Tensor, k_rot: Tensor, v: Tensor) -> Attended:
        c, s, end = self.cache, self.step, self.start + k_rot.shape[2]
        k, v_buf = c.k[s, layer], c.v[s, layer]
        if n := self.rewrite:
            if self.rope is None:  # stored as that step stored them: a plain copy
                k[:, :, :n] = c.k[self.source, layer, :, :, :n]
            else:
                cos, sin = self.rope
                k_sink = apply_rope(c.sink_k[layer][:, :n], cos[:n], sin[:n], tokens_first=True)
                c.store(k[:, :, :n], k_sink.transpose(1, 2), layer, values=False)
        c.store(k[:, :, self.start : end], k_rot, layer, values=False)
        c.store(v_buf[:, :, self.start : end], v, layer, values=True)
        return c.attended(s, layer, self.valid)

    def finish(self) -> None:
        """Every layer ran: this step's buffer holds the sink rotated for `shift`."""
        self.cache.sink_shifts[self.step] = self.shift


class BlockCausalMask:
    """The whole sequence at once (tests): keys are every block's tokens, then one copy of
    the sink per block (each rotated for its block); a block's queries see its own sink
    copy and the blocks of its window."""

    def __init__(self, cache: S2VCache, sink_ropes: list[Rope], window_blocks: int) -> None:
        self.cache, self.sink_ropes = cache, sink_ropes
        nb, lb, ls = len(sink_ropes), cache.block_tokens, cache.sink_tokens
        blk = torch.arange(nb).repeat_interleave(lb)  # each token's block
        sink = torch.arange(nb).repeat_interleave(ls)  # each sink copy's block
        seen = (blk[None] <= blk[:, None]) & (blk[None] > blk[:, None] - window_blocks)
        self.mask = torch.cat([seen, sink[None] == blk[:, None]], dim=1)

    def __call__(self, layer: int, k_raw: Tensor, k_rot: Tensor, v: Tensor) -> Attended:
        c = self.cache
        v_sink = c.v[0, layer, :, :, : c.sink_tokens]
        sinks_k = [
            apply_rope(c.sink_k[layer], *r, tokens_first=True).transpose(1, 2)
            for r in self.sink_ropes
        ]
        if c.fp8:
            raise ValueError("the whole-sequence reference path reads a cache in full precision")
        k_all = torch.cat([k_rot, *sinks_k], dim=2)
        v_all = torch.cat([v, *[v_sink] * len(sinks_k)], dim=2)
        return Attended(k_all, v_all, self.mask.to(k_all.device))
