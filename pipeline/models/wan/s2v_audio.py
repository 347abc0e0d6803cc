"""The audio path of LiveAvatar's S2V transformer (`pipeline.models.wan.s2v`).

wav2vec2-large hidden states (all 25, weighted by learnt SiLU weights) go through causal
1-D convolutions that bring them from video rate to latent rate (4x fewer frames): per
latent frame, `num_audio_token` local tokens plus a learnt padding token, and one global
token. In the listed layers, each latent frame's tokens attend to that frame's local
tokens after an adaptive LayerNorm driven by its global token, and the result is added.
The encoder runs in fp32 whatever the weights' dtype (the authors' fp32 autocast).

Module and parameter names are the published ones (`casual_audio_encoder.encoder.*`,
`audio_injector.injector.*`, `audio_injector.injector_adain_layers.*`).

Legend: B batch, G groups (batch x heads or batch x frames), C channels, F frames, A
wav2vec2 width, S hidden states, T latent frames, P tokens per latent frame, M audio tokens
per latent frame, D model width.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pipeline.models.layers import layer_norm
from pipeline.models.wan.layers import FrameCrossAttention


def linear32(layer: nn.Linear, x: Tensor) -> Tensor:
    """A linear layer in fp32 whatever the weights' dtype (the authors run the timestep and
    head paths under fp32 autocast)."""
    bias = None if layer.bias is None else layer.bias.float()
    return F.linear(x.float(), layer.weight.float(), bias)


@dataclass
class AudioTokens:
    """One block's audio: per latent frame, the global token and the local tokens."""

    global_BTD: Tensor
    local_BTMD: Tensor


class CausalConv1d(nn.Module):
    """A time convolution padded on the past side by repeating the first frame."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, 3, stride=stride)

    def forward(self, x_BCF: Tensor) -> Tensor:
        x = F.pad(x_BCF, (2, 0), mode="replicate")
        bias = cast(Tensor, self.conv.bias)
        return F.conv1d(x, self.conv.weight.float(), bias.float(), self.conv.stride)


class AudioMotionEncoder(nn.Module):
    """wav2vec2 frames (B, F, A) → per latent frame (4x fewer, causal) M local tokens plus a
    learnt padding token, and one global token (the adaptive norm's input)."""

    def __init__(self, audio_dim: int, d: int, n: int) -> None:
        super().__init__()
        self.heads = n
        self.conv1_local = CausalConv1d(audio_dim, d // 4 * n)
        self.conv1_global = CausalConv1d(audio_dim, d // 4)
        self.conv2 = CausalConv1d(d // 4, d // 2, stride=2)
        self.conv3 = CausalConv1d(d // 2, d, stride=2)
        self.final_linear = nn.Linear(d, d)
        self.padding_tokens = nn.Parameter(torch.randn(1, 1, 1, d))

    def tail(self, x_GCF: Tensor) -> Tensor:
        """conv1's output → (G, F/4, D): the layers the local and global paths share."""
        x = F.silu(layer_norm(x_GCF.transpose(1, 2), 1e-6)).transpose(1, 2)
        x = F.silu(layer_norm(self.conv2(x).transpose(1, 2), 1e-6)).transpose(1, 2)
        return F.silu(layer_norm(self.conv3(x).transpose(1, 2), 1e-6))

    def forward(self, x_BFA: Tensor) -> tuple[Tensor, Tensor]:
        B = x_BFA.shape[0]
        x_BAF = x_BFA.transpose(1, 2).float()
        local = self.conv1_local(x_BAF)  # (B, n*c, F): heads outermost
        local = self.tail(local.unflatten(1, (self.heads, -1)).flatten(0, 1))
        local_BTnD = local.unflatten(0, (B, self.heads)).transpose(1, 2)
        pad = self.padding_tokens.float().expand(B, local_BTnD.shape[1], 1, -1)
        local_BTMD = torch.cat([local_BTnD, pad], dim=2)
        glob = linear32(self.final_linear, self.tail(self.conv1_global(x_BAF)))
        return glob[:, :, None], local_BTMD


class CausalAudioEncoder(nn.Module):
    """A learnt softmax-free weighting of the wav2vec2 hidden states, then the encoder."""

    def __init__(self, layers: int, audio_dim: int, dim: int, tokens: int) -> None:
        super().__init__()
        self.weights = nn.Parameter(torch.full((1, layers, 1, 1), 0.01))
        self.encoder = AudioMotionEncoder(audio_dim, dim, tokens)

    def forward(self, feats_BSAF: Tensor) -> tuple[Tensor, Tensor]:
        w = F.silu(self.weights.float())
        x_BAF = ((feats_BSAF.float() * w) / w.sum(dim=1, keepdim=True)).sum(dim=1)
        return self.encoder(x_BAF.transpose(1, 2))


class AdaNorm(nn.Module):
    """LayerNorm (eps 1e-5, no affine) shifted and scaled from the audio's global token."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, 2 * dim)

    def forward(self, x_GPD: Tensor, emb_GD: Tensor) -> Tensor:
        shift, scale = self.linear(F.silu(emb_GD)).chunk(2, dim=1)
        return layer_norm(x_GPD, 1e-5) * (1 + scale[:, None]) + shift[:, None]


class AudioInjector(nn.Module):
    """In the listed layers, after the layer: each latent frame's tokens attend to that
    frame's audio tokens, through an adaptive norm driven by the global audio token."""

    def __init__(self, layers: tuple[int, ...], dim: int, heads: int, eps: float) -> None:
        super().__init__()
        n = len(layers)
        self.layer_ids = {layer: i for i, layer in enumerate(layers)}
        self.injector = nn.ModuleList([FrameCrossAttention(dim, heads, eps) for _ in range(n)])
        self.injector_adain_layers = nn.ModuleList([AdaNorm(dim) for _ in range(n)])

    def forward(self, layer: int, x_BLD: Tensor, audio: AudioTokens) -> Tensor:
        i = self.layer_ids[layer]
        B, L, D = x_BLD.shape
        T = audio.local_BTMD.shape[1]
        ada = cast(AdaNorm, self.injector_adain_layers[i])
        h = ada(x_BLD.reshape(B * T, L // T, D), audio.global_BTD.flatten(0, 1))
        return x_BLD + self.injector[i](h.reshape(B, L, D), audio.local_BTMD)
