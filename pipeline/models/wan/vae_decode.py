"""The Wan 2.1 VAE decoder, run for streaming: channels-last, each causal look-back two frames.

diffusers' `WanDecoder3d` holds the weights (`WanVAE.net.decoder`, filled through the
published key table); `CausalDecoder` runs the same network its own way. The network is
the same function; what changes is how the work reaches the GPU:

- **Channels-last.** Activations are (B, T, H, W, C) in memory and the convolutions' weights
  are stored so too, which is the layout cuDNN's implicit-GEMM kernels read; the
  channels-first decode ran its 74 TFLOP a Pro chunk at a quarter of the bf16 matrix rate.
- **The causal look-back as state, not padding.** Every 3x3x3 convolution reads its input's
  two previous frames (zeros before the stream began). diffusers concatenates the cached
  frames, then pads time and space with a copy of the whole input, then convolves; here
  the two frames are put in front once and cuDNN pads space itself.
- **Norm, SiLU and that concatenation in one pass** where compiled (`compile()`): each
  residual convolution's input is written once, by the kernel that normalises it.
- Nearest upsampling in the activations' own dtype (exact in any dtype; diffusers goes
  through float32).

`LookBack` is one stream's state: per causal convolution its input's last two frames, and
how many passes went through. The stream's first pass is its first latent frame alone: the
temporal upsamplers pass it through without doubling it (the release's "Rep" rule), so it
gives one video frame and every later latent frame four. A pass over k latent frames gives
the pixels of k passes over one (the same sums, reassociated), so a chunk can be decoded in
any split: one wide pass, or a short first pass whose frames can leave early.

Legend: B batch, C channels, T frames at the current level (latent frames at the bottom,
video frames at the top), H, W rows and columns at that level.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from diffusers.models.autoencoders.autoencoder_kl_wan import (
    WanAttentionBlock,
    WanDecoder3d,
    WanResample,
    WanResidualBlock,
    WanRMS_norm,
)
from torch import Tensor, nn

CL3D = torch.channels_last_3d
LOOK_BACK = 2  # frames a 3-tap causal convolution in time reads before each output frame


@dataclass
class LookBack:
    """One stream's decoder state: per causal convolution (in the order the network runs
    them) its input's last `LOOK_BACK` frames, None before the first pass."""

    frames: list[Tensor | None] = field(default_factory=list)
    passes: int = 0


def norm_silu_after(prev_BC2HW: Tensor, x_BCTHW: Tensor, gamma_C111: Tensor) -> Tensor:
    """[prev ; SiLU(RMS-norm(x))] along time, as the release computes the norm (float32
    normalisation, then its dtype): the input of a causal 3x3x3 convolution.

    Compiled, the same sums are written with the fewest instructions: one reciprocal square
    root a pixel instead of a square root and a division an element, and SiLU through
    `sigmoid` (the GPU's fast exponential) instead of torch's decomposition (libdevice's
    accurate one and a division). On Hopper that is ~44 → ~31 instructions an element of
    kernels that move 4 bytes an element, which made them instruction-bound
    (`bench/kernel_instructions.py`)."""
    scale = x_BCTHW.shape[1] ** 0.5
    if torch.compiler.is_compiling():
        xf = x_BCTHW.float()
        # 1 / max(|x|, 1e-12), F.normalize's floor
        inv = torch.rsqrt((xf * xf).sum(dim=1, keepdim=True).clamp(min=1e-24))
        normed = (xf * inv).to(x_BCTHW.dtype) * scale * gamma_C111
        n = normed.float()
        return torch.cat([prev_BC2HW, (n * torch.sigmoid(n)).to(x_BCTHW.dtype)], dim=2)
    normed = F.normalize(x_BCTHW.float(), dim=1).to(x_BCTHW.dtype) * scale * gamma_C111
    return torch.cat([prev_BC2HW, F.silu(normed)], dim=2)


class CausalDecoder:
    """diffusers' `WanDecoder3d` weights, run pass by pass over a stream's latent frames.
    Build it once per VAE (it stores the convolution weights channels-last, in place: the
    diffusers forward still runs on them), call it with each stream's own `LookBack`."""

    def __init__(
        self,
        net: WanDecoder3d,
        subpixel_upsample: bool = True,
        stack_time_below: int = 0,
        tap_convs_below: int = 128,
    ) -> None:
        """`subpixel_upsample`: each 2x nearest upsampling and the 3x3 convolution after it
        as one convolution of the small image into the four output phases (the same sums,
        the weights pre-added: no 4x-sized intermediate). `stack_time_below`: causal 3x3x3
        convolutions of fewer input channels than this run as 2-D convolutions of the three
        frames stacked along channels (cuDNN's 2-D kernels against its 3-D ones).
        `tap_convs_below`: those of fewer input channels than this as three 2-D
        convolutions, one per temporal tap over the frames it reads, summed. At the top
        level (96 channels, 512x512) cuDNN runs the 3-D convolution on an sm80 kernel of
        256x32 tiles at ~250 TFLOP/s on the H200, the three 2-D ones at ~330
        (`bench/wan_conv_bench.py`)."""
        if getattr(net, "is_residual", False) or any(
            not hasattr(block, "upsamplers") for block in net.up_blocks
        ):
            raise ValueError("CausalDecoder runs the Wan 2.1 decoder (not 2.2's residual one)")
        self.net = net
        self.subpixel_upsample = subpixel_upsample
        self.stack_time_below = stack_time_below
        self.tap_convs_below = tap_convs_below
        for module in net.modules():  # the layout cuDNN's fast kernels read
            if isinstance(module, nn.Conv3d):
                module.weight.data = module.weight.data.contiguous(memory_format=CL3D)
            elif isinstance(module, nn.Conv2d):
                module.weight.data = module.weight.data.contiguous(
                    memory_format=torch.channels_last
                )
        self._phase_weights: dict[nn.Conv2d, tuple[Tensor, Tensor | None]] = {}
        self._stacked_weights: dict[nn.Conv3d, Tensor] = {}
        self._tap_weights: dict[nn.Conv3d, list[Tensor]] = {}
        self.norm_silu_after: Callable[[Tensor, Tensor, Tensor], Tensor] = norm_silu_after
        self._compiled_pass: Callable[..., tuple[Tensor, list[Tensor | None]]] | None = None

    def compile(self, mode: str | None = None, whole_pass: bool = False) -> None:
        """Fuse each norm, SiLU and look-back concatenation into one kernel (the
        convolutions stay cuDNN's). Each level and pass length is its own static graph:
        about 20 for a stream, past dynamo's default limit of 8 per function.

        `whole_pass`: one graph for a whole pass instead (per pass length, and the stream's
        first pass apart), so the residual adds, the look-backs kept, the phase shuffles and
        the time interleaves fuse with the norms around them rather than each being a
        kernel of its own between cuDNN's convolutions."""
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        if whole_pass:
            self._prepare_weights()  # filled here, not from inside a traced pass
            self._compiled_pass = torch.compile(self._pass, mode=mode, dynamic=False)
        else:
            self.norm_silu_after = torch.compile(norm_silu_after, mode=mode, dynamic=False)

    def __call__(self, x_BCThw: Tensor, state: LookBack) -> Tensor:
        """One pass: latent frames (after `post_quant_conv`) → pixels (B, 3, T', H, W),
        T' = 1 for the stream's first latent frame alone, else 4 per latent frame."""
        if self._compiled_pass is None:
            return self._run(x_BCThw, state)
        # the look-backs go in and out as a plain list, and whether this is the stream's
        # first pass as a bool: the graph is specialised on those, not on a pass counter
        y, frames = self._compiled_pass(x_BCThw, list(state.frames), state.passes == 0)
        state.frames = frames
        state.passes += 1
        return y

    def _pass(
        self, x_BCThw: Tensor, frames: list[Tensor | None], first: bool
    ) -> tuple[Tensor, list[Tensor | None]]:
        state = LookBack(frames=frames, passes=0 if first else 1)
        y = self._run(x_BCThw, state)
        return y, state.frames

    def _prepare_weights(self) -> None:
        for module in self.net.modules():
            if isinstance(module, WanResample) and module.mode in ("upsample2d", "upsample3d"):
                if self.subpixel_upsample:
                    self._phase_weight(module.resample[1])
            elif isinstance(module, nn.Conv3d) and module.kernel_size == (3, 3, 3):
                if module.in_channels < self.tap_convs_below:
                    self._tap_weight(module)
                elif module.in_channels < self.stack_time_below:
                    self._stacked_weight(module)

    def _run(self, x_BCThw: Tensor, state: LookBack) -> Tensor:
        net = self.net
        slots = iter(range(10_000))
        x = x_BCThw.contiguous(memory_format=CL3D)
        slot = next(slots)
        x = self._conv_and_keep(net.conv_in, self._after(state, slot, x), state, slot)
        x = self._residual(net.mid_block.resnets[0], x, state, slots)
        for attention, resnet in zip(
            net.mid_block.attentions, net.mid_block.resnets[1:], strict=True
        ):
            x = _attention(attention, x)
            x = self._residual(resnet, x, state, slots)
        for block in net.up_blocks:
            for resnet in block.resnets:
                x = self._residual(resnet, x, state, slots)
            if block.upsamplers is not None:
                x = self._upsample(block.upsamplers[0], x, state, slots)
        slot = next(slots)
        x = self.norm_silu_after(self._prev(state, slot, x), x, _gamma(net.norm_out))
        x = self._conv_and_keep(net.conv_out, x, state, slot)
        state.passes += 1
        return x.contiguous()

    # -- the pieces, each as the release computes it ----------------------------------------
    def _prev(self, state: LookBack, slot: int, x_BCTHW: Tensor) -> Tensor:
        """The look-back of causal convolution `slot`: zeros before the stream began."""
        if slot == len(state.frames):
            state.frames.append(None)
        prev = state.frames[slot]
        if prev is None:
            B, C, _, H, W = x_BCTHW.shape
            prev = x_BCTHW.new_zeros((B, C, LOOK_BACK, H, W)).contiguous(memory_format=CL3D)
        return prev

    def _conv_and_keep(
        self, conv: nn.Conv3d, xin_BCTHW: Tensor, state: LookBack, slot: int
    ) -> Tensor:
        """Convolve an input that starts with its look-back; keep its last frames as the next."""
        state.frames[slot] = xin_BCTHW[:, :, -LOOK_BACK:].clone()
        kt, kh, kw = conv.kernel_size
        if (kt, kh, kw) == (3, 3, 3) and conv.in_channels < self.tap_convs_below:
            return self._tap_convs(conv, xin_BCTHW)
        if (kt, kh, kw) == (3, 3, 3) and conv.in_channels < self.stack_time_below:
            return self._stacked_conv(conv, xin_BCTHW)
        return F.conv3d(xin_BCTHW, conv.weight, conv.bias, padding=(0, kh // 2, kw // 2))

    def _stacked_conv(self, conv: nn.Conv3d, xin_BCTHW: Tensor) -> Tensor:
        """A causal 3x3x3 convolution as a 2-D one over [frame t-2, t-1, t] along channels."""
        B, C, Tin, H, W = xin_BCTHW.shape
        T = Tin - LOOK_BACK
        stacked = xin_BCTHW.new_empty((B, 3 * C, T, H, W)).contiguous(memory_format=CL3D)
        for k in range(1 + LOOK_BACK):
            stacked[:, k * C : (k + 1) * C].copy_(xin_BCTHW[:, :, k : k + T])
        frames = stacked.permute(0, 2, 1, 3, 4).reshape(B * T, 3 * C, H, W)
        out = F.conv2d(frames, self._stacked_weight(conv), conv.bias, padding=1)
        return out.view(B, T, -1, H, W).permute(0, 2, 1, 3, 4)

    def _tap_convs(self, conv: nn.Conv3d, xin_BCTHW: Tensor) -> Tensor:
        """A causal 3x3x3 convolution as the sum over its temporal taps k of a 3x3 one over
        frames k .. k + T - 1 of its input (look-back included)."""
        B, C, Tin, H, W = xin_BCTHW.shape
        T = Tin - LOOK_BACK
        frames_BTCHW = xin_BCTHW.permute(0, 2, 1, 3, 4)  # channels-last: a view

        def reading(k: int) -> Tensor:  # a view for one stream; batched streams copy here
            return frames_BTCHW[:, k : k + T].reshape(B * T, C, H, W)

        w = self._tap_weight(conv)
        out = F.conv2d(reading(0), w[0], conv.bias, padding=1)
        for k in range(1, 1 + LOOK_BACK):
            out = out + F.conv2d(reading(k), w[k], None, padding=1)
        return out.view(B, T, -1, H, W).permute(0, 2, 1, 3, 4)

    def _tap_weight(self, conv: nn.Conv3d) -> list[Tensor]:
        if conv not in self._tap_weights:
            self._tap_weights[conv] = [
                conv.weight[:, :, k].contiguous(memory_format=torch.channels_last)
                for k in range(1 + LOOK_BACK)
            ]
        return self._tap_weights[conv]

    def _stacked_weight(self, conv: nn.Conv3d) -> Tensor:
        if conv not in self._stacked_weights:
            w = conv.weight.permute(0, 2, 1, 3, 4).reshape(conv.out_channels, -1, 3, 3)
            self._stacked_weights[conv] = w.contiguous(memory_format=torch.channels_last)
        return self._stacked_weights[conv]

    def _after(self, state: LookBack, slot: int, x_BCTHW: Tensor) -> Tensor:
        """[look-back ; x] along time: the input of a causal convolution with no norm in front."""
        return torch.cat([self._prev(state, slot, x_BCTHW), x_BCTHW], dim=2)

    def _residual(self, block: WanResidualBlock, x: Tensor, state: LookBack, slots) -> Tensor:
        shortcut = block.conv_shortcut
        h = x if isinstance(shortcut, nn.Identity) else F.conv3d(x, shortcut.weight, shortcut.bias)
        for norm, conv in ((block.norm1, block.conv1), (block.norm2, block.conv2)):
            slot = next(slots)
            xin = self.norm_silu_after(self._prev(state, slot, x), x, _gamma(norm))
            x = self._conv_and_keep(conv, xin, state, slot)
        return x + h

    def _upsample(self, up: WanResample, x: Tensor, state: LookBack, slots) -> Tensor:
        if up.mode == "upsample3d":
            slot = next(slots)
            if state.passes > 0:  # the stream's first pass goes through undoubled
                xin = self._after(state, slot, x)
                x = _interleave_time(self._conv_and_keep(up.time_conv, xin, state, slot))
            elif slot == len(state.frames):
                state.frames.append(None)
        elif up.mode != "upsample2d":
            raise ValueError(f"CausalDecoder: no decoder resampler {up.mode!r}")
        B, C, T, H, W = x.shape
        frames = x.permute(0, 2, 1, 3, 4).reshape(B * T, C, H, W)  # a view: channels-last 2-D
        conv = up.resample[1]
        if self.subpixel_upsample:
            weight, bias = self._phase_weight(conv)
            return _phases_to_frames(F.conv2d(frames, weight, bias, padding=1), B, T)
        # nearest-exact x2 copies values: exact in bf16 (the release upsamples in float32)
        frames = F.interpolate(frames, scale_factor=2.0, mode="nearest-exact")
        frames = F.conv2d(frames, conv.weight, conv.bias, padding=1)
        _, C2, H2, W2 = frames.shape
        return frames.view(B, T, C2, H2, W2).permute(0, 2, 1, 3, 4)

    def _phase_weight(self, conv: nn.Conv2d) -> tuple[Tensor, Tensor | None]:
        """The 3x3 convolution after a 2x nearest upsampling, as four 3x3 convolutions of the
        small image, one per output phase (row parity a, column parity b): a small-image
        tap at offset r gathers the large-image taps that read the same source pixel,
        `_PHASE_TAPS[a][r]` (the weights added in float32, then cast back)."""
        if conv not in self._phase_weights:
            taps = torch.tensor(_PHASE_TAPS, dtype=torch.float32, device=conv.weight.device)
            w = torch.einsum("aru,bsv,ocuv->abocrs", taps, taps, conv.weight.float())
            w = w.reshape(-1, *w.shape[3:]).to(conv.weight.dtype)
            bias = None if conv.bias is None else conv.bias.repeat(4)
            self._phase_weights[conv] = (w.contiguous(memory_format=torch.channels_last), bias)
        return self._phase_weights[conv]


# For output row parity a, which large-image taps u (of the 3x3 after upsampling) land on
# small-image offset r = -1, 0, +1: row 2i + a + u - 1 reads source row i + (a + u - 1) // 2.
_PHASE_TAPS = (
    ((1, 0, 0), (0, 1, 1), (0, 0, 0)),  # a = 0: r=-1 ← u=0; r=0 ← u=1, 2
    ((0, 0, 0), (1, 1, 0), (0, 0, 1)),  # a = 1: r=0 ← u=0, 1; r=+1 ← u=2
)


def _phases_to_frames(y_N4CHW: Tensor, B: int, T: int) -> Tensor:
    """(B*T, [a, b, C], H, W) phase outputs → (B, C, T, 2H, 2W) channels-last pixels, pixel
    (2i + a, 2j + b) from phase (a, b) at (i, j): one copy."""
    N, C4, H, W = y_N4CHW.shape
    C = C4 // 4
    out = y_N4CHW.new_empty((B, C, T, 2 * H, 2 * W)).contiguous(memory_format=CL3D)
    dst = out.permute(0, 2, 3, 4, 1).view(N, H, 2, W, 2, C)
    src = y_N4CHW.permute(0, 2, 3, 1).view(N, H, W, 2, 2, C)
    dst.copy_(src.permute(0, 1, 3, 2, 4, 5))
    return out


def _gamma(norm: WanRMS_norm) -> Tensor:
    if not isinstance(norm.bias, float) or norm.bias != 0.0:
        raise ValueError("the Wan 2.1 decoder's norms have no bias")
    return norm.gamma


def _interleave_time(y_B2CTHW: Tensor) -> Tensor:
    """The temporal upsampler's (B, 2C, T, H, W) → (B, C, 2T, H, W): output frame 2t is the
    first C channels of input frame t, 2t+1 the other C (one copy, channels-last)."""
    B, C2, T, H, W = y_B2CTHW.shape
    C = C2 // 2
    out = torch.empty((B, C, 2 * T, H, W), dtype=y_B2CTHW.dtype, device=y_B2CTHW.device)
    out = out.contiguous(memory_format=CL3D)
    out.view(B, C, T, 2, H, W).copy_(y_B2CTHW.view(B, 2, C, T, H, W).permute(0, 2, 3, 1, 4, 5))
    return out


def _attention(block: WanAttentionBlock, x_BCTHW: Tensor) -> Tensor:
    """The middle block's single-head attention over each frame's pixels."""
    B, C, T, H, W = x_BCTHW.shape
    frames = x_BCTHW.permute(0, 2, 1, 3, 4).reshape(B * T, C, H, W)
    scale = C**0.5
    normed = F.normalize(frames.float(), dim=1).to(frames.dtype) * scale * block.norm.gamma
    qkv = F.conv2d(normed, block.to_qkv.weight, block.to_qkv.bias)  # (BT, 3C, H, W)
    qkv = qkv.permute(0, 2, 3, 1).reshape(B * T, 1, H * W, 3 * C)
    q, k, v = qkv.chunk(3, dim=-1)
    out = F.scaled_dot_product_attention(q.contiguous(), k.contiguous(), v.contiguous())
    out = F.linear(out[:, 0], block.proj.weight.view(C, C), block.proj.bias)  # (BT, HW, C)
    out = out.view(B, T, H, W, C).permute(0, 4, 1, 2, 3)
    return out + x_BCTHW
