"""Wan2.2-S2V's published tensor names, mapped onto `S2VTransformer`.

The release (`diffusion_pytorch_model-0000N-of-0000M.safetensors`, the names of the
authors' `WanModel_S2V` / `CausalWanModel_S2V` modules) maps onto the model through one
table: the attention matrices Facecast fuses (self-attention's q, k, v; the text and audio
cross-attentions' k, v). Every other name is the model's own (the modules keep the
published names, the audio encoder's misspelling `casual_audio_encoder` included). Reading
the release folder and merging the LiveAvatar LoRA happen before this (`pipeline.lora`,
`pipeline.liveavatar.weights`); `load_published` takes the merged state dict.

`published_shapes` lists every tensor of a release of a given shape, and
`random_published_state` fills it with random values (no zero or one anywhere: such paths
hide bugs), the same for a seed on every machine: for tests, parity scripts, benchmarks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from torch import Tensor

from pipeline.checkpoints import load_mapped
from pipeline.errors import CheckpointError
from pipeline.models.wan.s2v import S2VConfig, S2VTransformer
from pipeline.random_weights import random_value

S2V_FUSED = {
    ".qkv.weight": [".q.weight", ".k.weight", ".v.weight"],
    ".qkv.bias": [".q.bias", ".k.bias", ".v.bias"],
    ".kv.weight": [".k.weight", ".v.weight"],
    ".kv.bias": [".k.bias", ".v.bias"],
}


def load_published(
    model: S2VTransformer, state: dict[str, Tensor], source: Path | str = "state dict"
) -> None:
    """Load the release's tensors (published names, LoRA merged) into `model`, strictly:
    a missing, unknown or mis-shaped name is one `CheckpointError` naming `source`."""
    load_mapped(model, state, Path(source), fused=S2V_FUSED)


def published_shapes(cfg: S2VConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of the release's transformer, by its published name."""
    d, f, p = cfg.dim, cfg.ffn_dim, cfg.patch_size
    out = cfg.out_dim * math.prod(p)
    shapes: dict[str, tuple[int, ...]] = {}

    def linear(name: str, n_out: int, n_in: int) -> None:
        shapes[f"{name}.weight"] = (n_out, n_in)
        shapes[f"{name}.bias"] = (n_out,)

    def conv(name: str, n_out: int, n_in: int, kernel: tuple[int, ...]) -> None:
        shapes[f"{name}.weight"] = (n_out, n_in, *kernel)
        shapes[f"{name}.bias"] = (n_out,)

    def attention(prefix: str) -> None:
        for m in "qkvo":
            linear(f"{prefix}.{m}", d, d)
        shapes[f"{prefix}.norm_q.weight"] = (d,)
        shapes[f"{prefix}.norm_k.weight"] = (d,)

    conv("patch_embedding", d, cfg.in_dim, p)
    conv("cond_encoder", d, cfg.cond_dim, p)
    linear("text_embedding.0", d, cfg.text_dim)
    linear("text_embedding.2", d, d)
    linear("time_embedding.0", d, cfg.freq_dim)
    linear("time_embedding.2", d, d)
    linear("time_projection.1", 6 * d, d)
    for i in range(cfg.num_layers):
        b = f"blocks.{i}"
        attention(f"{b}.self_attn")
        attention(f"{b}.cross_attn")
        shapes[f"{b}.norm3.weight"] = (d,)
        shapes[f"{b}.norm3.bias"] = (d,)
        linear(f"{b}.ffn.0", f, d)
        linear(f"{b}.ffn.2", d, f)
        shapes[f"{b}.modulation"] = (1, 6, d)
    linear("head.head", out, d)
    shapes["head.modulation"] = (1, 2, d)
    enc = "casual_audio_encoder"
    shapes[f"{enc}.weights"] = (1, cfg.audio_layers, 1, 1)
    conv(f"{enc}.encoder.conv1_local.conv", d // 4 * cfg.num_audio_token, cfg.audio_dim, (3,))
    conv(f"{enc}.encoder.conv1_global.conv", d // 4, cfg.audio_dim, (3,))
    conv(f"{enc}.encoder.conv2.conv", d // 2, d // 4, (3,))
    conv(f"{enc}.encoder.conv3.conv", d, d // 2, (3,))
    linear(f"{enc}.encoder.final_linear", d, d)
    shapes[f"{enc}.encoder.padding_tokens"] = (1, 1, 1, d)
    for j in range(len(cfg.audio_inject_layers)):
        attention(f"audio_injector.injector.{j}")
        linear(f"audio_injector.injector_adain_layers.{j}.linear", 2 * d, d)
    shapes["trainable_cond_mask.weight"] = (3, d)
    conv("frame_packer.proj", d, cfg.in_dim, (1, 2, 2))
    conv("frame_packer.proj_2x", d, cfg.in_dim, (2, 4, 4))
    conv("frame_packer.proj_4x", d, cfg.in_dim, (4, 8, 8))
    return shapes


def random_published_tensors(
    cfg: S2VConfig,
    seed: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> Iterator[tuple[str, Tensor]]:
    """Random weights in the release's layout, one tensor at a time, drawn in name order from
    a generator on `device` (the 14B drawn on its GPU never passes through host memory):
    matrices ~ N(0, 1/fan_in), biases ~ N(0, 0.02²), norm gains ~ 1 + N(0, 0.1²),
    modulation tables ~ N(0, 1/dim); the audio layers' weights ~ 1 + N(0, 0.1²) (their
    SiLUs are summed and divided by: a sum near zero would blow the features up). Each
    tensor is cast to `dtype` as it is drawn. The same seed gives the same values on the
    CPU everywhere, and on one GPU model and torch build in every process."""
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, shape in sorted(published_shapes(cfg).items()):
        if name.endswith("audio_encoder.weights"):
            noise = torch.randn(shape, generator=gen, device=gen.device)
            yield name, (1.0 + 0.1 * noise).to(dtype)
        else:
            yield name, random_value(name, shape, gen).to(dtype)


def random_published_state(
    cfg: S2VConfig, seed: int, dtype: torch.dtype = torch.float32
) -> dict[str, Tensor]:
    """`random_published_tensors` drawn on the CPU, as one state dict (the 14B state is
    60 GB in fp32, 30 GB in bf16)."""
    return dict(random_published_tensors(cfg, seed, dtype))


def load_published_streamed(
    model: S2VTransformer, tensors: Iterable[tuple[str, Tensor]], source: str = "stream"
) -> None:
    """`load_published` one tensor at a time: each published tensor is copied into its
    parameter (or its rows of a fused one) as it comes, so a 14B state drawn on the GPU
    never exists twice. Strict like `load_published`: an unknown or mis-shaped name, or a
    parameter row left unfilled, is a `CheckpointError` naming `source`."""
    targets: dict[str, tuple[Tensor, int, int]] = {}  # published name → (param, row0, rows)
    state = model.state_dict(keep_vars=True)
    for name, param in state.items():
        parts = next(
            (
                [name[: -len(suffix)] + p for p in srcs]
                for suffix, srcs in S2V_FUSED.items()
                if name.endswith(suffix)
            ),
            [name],
        )
        rows = param.shape[0] // len(parts) if len(parts) > 1 else param.shape[0]
        for j, p in enumerate(parts):
            targets[p] = (param, j * rows, rows) if len(parts) > 1 else (param, 0, -1)
    filled: set[str] = set()
    with torch.no_grad():
        for name, tensor in tensors:
            if name not in targets:
                raise CheckpointError(f"{source}: key {name!r} does not map onto the model")
            param, row0, rows = targets[name]
            dest = param if rows == -1 else param[row0 : row0 + rows]
            if tuple(dest.shape) != tuple(tensor.shape):
                raise CheckpointError(
                    f"{source}: {name!r} has shape {tuple(tensor.shape)}, "
                    f"the model expects {tuple(dest.shape)}"
                )
            dest.copy_(tensor)
            filled.add(name)
    missing = sorted(set(targets) - filled)
    if missing:
        raise CheckpointError(f"{source}: missing key {missing[0]!r} ({len(missing)} in all)")
