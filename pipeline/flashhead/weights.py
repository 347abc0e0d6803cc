"""The SoulX-FlashHead release as users download it, read into Facecast's modules.

`huggingface-cli download Soul-AILab/SoulX-FlashHead-1_3B --local-dir DIR` writes:

    DIR/Model_Pro/config.json + diffusion_pytorch_model.safetensors   the Pro DiT (diffusers)
    DIR/Model_Lite/…                                                  the Lite DiT
    DIR/VAE_Wan/Wan2.1_VAE.pth                                        Pro's VAE (a state dict)
    DIR/VAE_LTX/…                                                     Lite's VAE

and `facebook/wav2vec2-base-960h` comes as its own transformers folder (`--wav2vec`).

The DiT's published names map onto `WanAudioDiT` through one table (`DIT_FUSED`: the
attention matrices Facecast fuses); the release also carries a text embedding and an
older audio embedding that the model never reads (`DIT_UNUSED`). Every problem is one
`CheckpointError` line naming the file.

`random_dit_state` makes a release-shaped state dict of random weights
(`pipeline.random_weights`: no zero or one left anywhere, the same for a seed everywhere):
for tests, the parity scripts and benchmarks.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import torch
from torch import Tensor

from pipeline.checkpoints import load_mapped, read_diffusers_weights, read_json
from pipeline.errors import CheckpointError
from pipeline.flashhead.dit import WanAudioDiT, WanDiTConfig
from pipeline.random_weights import random_value

VARIANT_DIRS = {"pro": ("Model_Pro", "VAE_Wan/Wan2.1_VAE.pth"), "lite": ("Model_Lite", "VAE_LTX")}
DIT_FUSED = {
    "self_attn.qkv.weight": ["self_attn.q.weight", "self_attn.k.weight", "self_attn.v.weight"],
    "self_attn.qkv.bias": ["self_attn.q.bias", "self_attn.k.bias", "self_attn.v.bias"],
    "cross_attn.kv.weight": ["cross_attn.k.weight", "cross_attn.v.weight"],
    "cross_attn.kv.bias": ["cross_attn.k.bias", "cross_attn.v.bias"],
}
DIT_UNUSED = ("text_embedding.", "audio_emb.")
_CONFIG_INTS = ("dim", "in_dim", "ffn_dim", "out_dim", "text_dim", "freq_dim", "num_heads")


def write_release_dit(folder: Path, cfg: WanDiTConfig, state: dict[str, Tensor]) -> None:
    """A DiT folder as the release lays it out (tests, benchmarks without downloads)."""
    import json

    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(dit_config_json(cfg), indent=1))
    save_file(state, str(folder / "diffusion_pytorch_model.safetensors"))


def release_paths(weights: str | Path, variant: str) -> tuple[Path, Path]:
    """(DiT folder, VAE path) of a release folder, each checked to exist."""
    root = Path(weights).expanduser()
    if not root.is_dir():
        raise CheckpointError(
            f"{root}: weights folder not found (--weights wants the folder of "
            "`huggingface-cli download Soul-AILab/SoulX-FlashHead-1_3B`)"
        )
    dit_name, vae_name = VARIANT_DIRS[variant]
    dit, vae = root / dit_name, root / vae_name
    for path in (dit, vae):
        if not path.exists():
            raise CheckpointError(f"{path}: not found in the release folder {root}")
    return dit, vae


def preflight(cfg) -> None:
    """FlashHead's check before a server listens (`pipeline.families`): a broken download
    fails here, not after listening."""
    fh = cfg.flashhead
    assert fh.weights and fh.wav2vec, "EngineOptions.validate asks for both"
    check_release(fh.weights, fh.wav2vec, fh.variant)


def check_release(weights: str | Path, wav2vec: str | Path, variant: str) -> None:
    """The cheap checks a server makes before it listens: the folders and files are there,
    the DiT's config reads, every safetensors file's header and length are whole. The full
    load (every key and shape) follows at start-up."""
    from safetensors import safe_open

    dit, _ = release_paths(weights, variant)
    read_dit_config(dit)
    for path in sorted(dit.glob("*.safetensors")):
        try:
            with safe_open(str(path), "pt"):
                pass
        except Exception as exc:  # safetensors raises its own and OS errors
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise CheckpointError(f"{path}: truncated or damaged ({reason})") from None
    for name in ("config.json", "preprocessor_config.json"):
        if not (Path(wav2vec) / name).is_file():
            raise CheckpointError(
                f"{Path(wav2vec) / name}: file not found (--wav2vec wants the folder of "
                "`huggingface-cli download facebook/wav2vec2-base-960h`)"
            )


def read_dit_config(folder: Path) -> WanDiTConfig:
    """The DiT's shape from the release's `config.json`, checked."""
    path = folder / "config.json"
    raw = read_json(path)
    values: dict = {}
    for key in (*_CONFIG_INTS, "num_layers"):
        v = raw.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise CheckpointError(f"{path}: {key!r} must be a positive integer (got {v!r})")
        values[key] = v
    for key in ("vae_stride", "patch_size"):
        v = raw.get(key)
        if not (isinstance(v, list) and len(v) == 3 and all(isinstance(i, int) for i in v)):
            raise CheckpointError(f"{path}: {key!r} must be three integers (got {v!r})")
        values[key] = tuple(v)
    eps = raw.get("eps", 1e-6)
    if not isinstance(eps, (int, float)) or not 0 < eps < 1:
        raise CheckpointError(f"{path}: 'eps' must be a small positive number (got {eps!r})")
    if raw.get("has_image_input"):
        raise CheckpointError(f"{path}: has_image_input is true; FlashHead's DiT has none")
    cfg = WanDiTConfig(**values, eps=float(eps))
    if cfg.dim % cfg.num_heads or (cfg.head_dim % 2):
        raise CheckpointError(f"{path}: dim {cfg.dim} does not split into {cfg.num_heads} heads")
    if cfg.in_dim != 2 * cfg.out_dim:
        raise CheckpointError(
            f"{path}: in_dim {cfg.in_dim} must be twice out_dim {cfg.out_dim} "
            "(noisy latents and reference latents)"
        )
    return cfg


def load_dit(
    folder: Path,
    device: torch.device | str,
    dtype: torch.dtype,
    audio_layers: int = 12,
    audio_dim: int = 768,
) -> WanAudioDiT:
    """The release's DiT (config.json + safetensors, single or sharded), on `device`, for
    speech features of `audio_layers` x `audio_dim` (the wav2vec2 model's)."""
    cfg = read_dit_config(folder)
    state = read_diffusers_weights(folder)
    # sizes the authors fix in code rather than config.json: read off the tensors
    hidden = state.get("audio_proj.proj2.weight")
    tokens = state.get("audio_proj.proj3.weight")
    if hidden is not None and tokens is not None and tokens.shape[0] % cfg.dim == 0:
        cfg = dataclasses.replace(
            cfg, audio_hidden=hidden.shape[0], context_tokens=tokens.shape[0] // cfg.dim
        )
    cfg = dataclasses.replace(cfg, audio_layers=audio_layers, audio_dim=audio_dim)
    with torch.device("meta"):
        model = WanAudioDiT(cfg)
    model.to_empty(device="cpu")
    load_mapped(model, state, folder, fused=DIT_FUSED, ignored=DIT_UNUSED)
    return model.to(device=device, dtype=dtype).eval().requires_grad_(False)


def dit_config_json(cfg: WanDiTConfig) -> dict:
    """The release's `config.json` for a DiT of this shape (tests, parity, benchmarks)."""
    raw = {k: v for k, v in dataclasses.asdict(cfg).items() if k in (*_CONFIG_INTS, "eps")}
    return {
        "_class_name": "WanModelAudioProject",
        **raw,
        "num_layers": cfg.num_layers,
        "vae_stride": list(cfg.vae_stride),
        "patch_size": list(cfg.patch_size),
        "has_image_input": False,
    }


def published_dit_shapes(cfg: WanDiTConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of the release's DiT checkpoint, by its published name."""
    d, f, a = cfg.dim, cfg.ffn_dim, cfg.audio_dim
    shapes: dict[str, tuple[int, ...]] = {
        "patch_embedding.weight": (d, cfg.in_dim, *cfg.patch_size),
        "patch_embedding.bias": (d,),
        "text_embedding.0.weight": (d, cfg.text_dim),
        "text_embedding.0.bias": (d,),
        "text_embedding.2.weight": (d, d),
        "text_embedding.2.bias": (d,),
        "time_embedding.0.weight": (d, cfg.freq_dim),
        "time_embedding.0.bias": (d,),
        "time_embedding.2.weight": (d, d),
        "time_embedding.2.bias": (d,),
        "time_projection.1.weight": (6 * d, d),
        "time_projection.1.bias": (6 * d,),
        "head.head.weight": (cfg.out_dim * math.prod(cfg.patch_size), d),
        "head.head.bias": (cfg.out_dim * math.prod(cfg.patch_size),),
        "head.modulation": (1, 2, d),
        "audio_emb.proj.0.weight": (a,),
        "audio_emb.proj.0.bias": (a,),
        "audio_emb.proj.1.weight": (a, a),
        "audio_emb.proj.1.bias": (a,),
        "audio_emb.proj.3.weight": (d, a),
        "audio_emb.proj.3.bias": (d,),
        "audio_emb.proj.4.weight": (d,),
        "audio_emb.proj.4.bias": (d,),
    }
    per_frame = cfg.audio_layers * a
    w, r, hid = cfg.audio_window, cfg.frames_per_latent, cfg.audio_hidden
    for name, shape in (
        ("proj1", (hid, w * per_frame)),
        ("proj1_vf", (hid, (w + r - 1) * per_frame)),
        ("proj2", (hid, hid)),
        ("proj3", (cfg.context_tokens * d, hid)),
    ):
        shapes[f"audio_proj.{name}.weight"] = shape
        shapes[f"audio_proj.{name}.bias"] = (shape[0],)
    shapes["audio_proj.norm.weight"] = (d,)
    shapes["audio_proj.norm.bias"] = (d,)
    for i in range(cfg.num_layers):
        p = f"blocks.{i}."
        for attn in ("self_attn", "cross_attn"):
            for m in "qkvo":
                shapes[f"{p}{attn}.{m}.weight"] = (d, d)
                shapes[f"{p}{attn}.{m}.bias"] = (d,)
            shapes[f"{p}{attn}.norm_q.weight"] = (d,)
            shapes[f"{p}{attn}.norm_k.weight"] = (d,)
        shapes[f"{p}norm3.weight"] = (d,)
        shapes[f"{p}norm3.bias"] = (d,)
        shapes[f"{p}ffn.0.weight"] = (f, d)
        shapes[f"{p}ffn.0.bias"] = (f,)
        shapes[f"{p}ffn.2.weight"] = (d, f)
        shapes[f"{p}ffn.2.bias"] = (d,)
        shapes[f"{p}modulation"] = (1, 6, d)
    return shapes


def random_dit_state(cfg: WanDiTConfig, seed: int) -> dict[str, Tensor]:
    """Random weights in the release's layout, the same for a seed on every machine
    (drawn on the CPU in name order): matrices ~ N(0, 1/fan_in), biases ~ N(0, 0.02²),
    norm gains ~ 1 + N(0, 0.1²), modulation tables ~ N(0, 1/dim)."""
    gen = torch.Generator().manual_seed(seed)
    return {
        name: random_value(name, shape, gen)
        for name, shape in sorted(published_dit_shapes(cfg).items())
    }
