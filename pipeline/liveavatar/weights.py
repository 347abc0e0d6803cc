"""The LiveAvatar release as users download it: Wan2.2-S2V-14B and the Live-Avatar LoRA.

`huggingface-cli download Wan-AI/Wan2.2-S2V-14B --local-dir DIR` writes (the authors'
`--ckpt_dir`):

    DIR/config.json                                        the S2V transformer's shape
    DIR/diffusion_pytorch_model-0000N-of-00004.safetensors its weights, in 4 shards
    DIR/diffusion_pytorch_model.safetensors.index.json     weight name → shard
    DIR/Wan2.1_VAE.pth                                     the VAE (a state dict)
    DIR/models_t5_umt5-xxl-enc-bf16.pth                    umT5-XXL's encoder, Wan's key layout
    DIR/google/umt5-xxl/                                   its tokenizer (transformers folder)
    DIR/wav2vec2-large-xlsr-53-english/                    the speech encoder (transformers)

and `huggingface-cli download Quark-Vision/Live-Avatar --local-dir LORA` the LoRA the
authors merge into the transformer (`--lora_path_dmd`): `LORA/liveavatar.safetensors`,
PEFT's layout, rank 128 and alpha 64 from their training config (`LORA_ALPHA`).

`check_release` is serve's preflight (every file there, every header whole, the index and
the shards agreeing, the LoRA's keys paired), cheap enough to run before a server
listens; the full reads follow at start-up (`read_merged_state`: the transformer's shards
with the LoRA merged in, as the authors' `add_lora_to_model` leaves the model;
`pipeline.models.encoders.umt5` and `pipeline.models.encoders.s2v_speech` read the prompt and speech
encoders). Every problem is one `CheckpointError` line naming the file.

`write_random_release` lays out both downloads with random weights (tests, benchmarks on
the H200s without downloads): the transformer's state and config are the caller's (its
model file's `random_published_state`), the rest is drawn here, full-sized or tiny.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from pipeline.checkpoints import (
    SAFETENSORS_NAME,
    read_diffusers_weights,
    read_json,
    write_sharded,
)
from pipeline.errors import CheckpointError
from pipeline.lora import check_lora, merge_lora, random_lora, read_lora
from pipeline.models.encoders.s2v_speech import write_random_wav2vec2
from pipeline.models.encoders.umt5 import UMT5Shape, random_wan_state, write_tokenizer
from pipeline.models.encoders.wav2vec2 import WAV2VEC2_TINY
from pipeline.models.wan.vae import WAN21_VAE, WAN21_VAE_TINY, WanVAEConfig, random_checkpoint

LORA_NAME = "liveavatar.safetensors"
LORA_RANK, LORA_ALPHA = 128, 64.0  # liveavatar/configs/s2v_causal_sft.yaml
LORA_TARGETS = ("q", "k", "v", "o", "ffn.0", "ffn.2")  # PEFT target_modules, name suffixes
INDEX_NAME = f"{SAFETENSORS_NAME}.index.json"
T5_NAME = "models_t5_umt5-xxl-enc-bf16.pth"
VAE_NAME = "Wan2.1_VAE.pth"
TOKENIZER_DIR = "google/umt5-xxl"
WAV2VEC_DIR = "wav2vec2-large-xlsr-53-english"
DOWNLOAD = "`huggingface-cli download Wan-AI/Wan2.2-S2V-14B --local-dir DIR`"

# config.json's fields the S2V transformer is built from: name → (kind, default). The
# sizes must be there (None: no default); a flag left out takes the default of the authors'
# `WanModel_S2V.__init__`, as diffusers' `from_pretrained` gives it (not the 14B's values:
# the published config.json carries those). Kinds: "int" (positive), "ints" (a list of
# non-negative), "bool", "str", "float" (positive).
CONFIG_FIELDS: dict[str, tuple[str, object]] = {
    "dim": ("int", None),
    "ffn_dim": ("int", None),
    "freq_dim": ("int", None),
    "text_dim": ("int", None),
    "in_dim": ("int", None),
    "out_dim": ("int", None),
    "num_heads": ("int", None),
    "num_layers": ("int", None),
    "cond_dim": ("int", None),
    "audio_dim": ("int", None),
    "num_audio_token": ("int", None),
    "patch_size": ("ints", None),
    "audio_inject_layers": ("ints", [0, 4, 8, 12, 16, 20, 24, 27]),
    "eps": ("float", 1e-6),
    "qk_norm": ("bool", True),
    "cross_attn_norm": ("bool", True),
    "enable_adain": ("bool", False),
    "adain_mode": ("str", "attn_norm"),
    "enable_framepack": ("bool", False),
    "framepack_drop_mode": ("str", "drop"),
    "enable_motioner": ("bool", True),
    "add_last_motion": ("bool", True),
    "zero_timestep": ("bool", False),
}


@dataclass(frozen=True)
class ReleasePaths:
    """Where each part of a Wan2.2-S2V-14B folder lies (checked to exist)."""

    root: Path
    config: Path
    index: Path
    vae: Path
    t5: Path
    tokenizer: Path
    wav2vec: Path


def release_paths(ckpt_dir: str | Path) -> ReleasePaths:
    """The parts of a Wan2.2-S2V-14B folder, each checked to be there (not yet read)."""
    root = Path(ckpt_dir).expanduser()
    if not root.is_dir():
        raise CheckpointError(
            f"{root}: weights folder not found (--weights wants the folder of {DOWNLOAD})"
        )
    paths = ReleasePaths(
        root=root,
        config=root / "config.json",
        index=root / INDEX_NAME,
        vae=root / VAE_NAME,
        t5=root / T5_NAME,
        tokenizer=root / TOKENIZER_DIR,
        wav2vec=root / WAV2VEC_DIR,
    )
    for path in (paths.config, paths.vae, paths.t5, paths.tokenizer, paths.wav2vec):
        if not path.exists():
            raise CheckpointError(f"{path}: not found in the release folder {root} ({DOWNLOAD})")
    if not paths.index.is_file() and not (root / SAFETENSORS_NAME).is_file():
        raise CheckpointError(f"{paths.index}: not found in the release folder {root} ({DOWNLOAD})")
    return paths


def preflight(cfg) -> None:
    """LiveAvatar's check before a server listens (`pipeline.families`)."""
    la = cfg.liveavatar
    assert la.weights and la.lora, "EngineOptions.validate asks for both"
    check_release(la.weights, la.lora)


def check_release(ckpt_dir: str | Path, lora: str | Path | None) -> ReleasePaths:
    """The cheap checks a server makes before it listens: every file there and readable
    (safetensors headers and lengths, the `.pth` archives' directories), the index and its
    shards agreeing key for key, config.json's fields, the LoRA's keys paired."""
    paths = release_paths(ckpt_dir)
    read_transformer_config(paths.root)
    for shard, keys in transformer_shards(paths.root).items():
        found = set(safetensors_header(shard))
        if found != keys:
            odd = sorted(found - keys) or sorted(keys - found)
            raise CheckpointError(
                f"{shard}: holds other keys than {INDEX_NAME} lists (e.g. {odd[0]!r})"
            )
    for pth in (paths.vae, paths.t5):
        check_pth(pth)
    check_tokenizer(paths.tokenizer)
    check_wav2vec(paths.wav2vec)
    if lora is not None:
        check_lora(lora_path(lora))
    return paths


def lora_path(lora: str | Path) -> Path:
    """The LoRA file: given itself, or the folder `huggingface-cli download` wrote it in."""
    path = Path(lora).expanduser()
    path = path / LORA_NAME if path.is_dir() else path
    if not path.is_file():
        raise CheckpointError(
            f"{path}: LoRA file not found (--lora wants the folder of "
            "`huggingface-cli download Quark-Vision/Live-Avatar`, or its liveavatar.safetensors)"
        )
    return path


def transformer_shards(ckpt_dir: Path) -> dict[Path, set[str]]:
    """Each safetensors file of the transformer and the keys it must hold: the index's
    weight map, or the one unsharded file (its keys then whatever it holds)."""
    index = ckpt_dir / INDEX_NAME
    if not index.is_file():
        single = ckpt_dir / SAFETENSORS_NAME
        return {single: set(safetensors_header(single))}
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index}: no 'weight_map' of parameter name → shard file")
    shards: dict[Path, set[str]] = {}
    for key, shard in weight_map.items():
        if not isinstance(shard, str) or "/" in shard or not shard.endswith(".safetensors"):
            raise CheckpointError(f"{index}: {key!r} maps to {shard!r}, not a shard file name")
        shards.setdefault(ckpt_dir / shard, set()).add(key)
    for shard in shards:
        if not shard.is_file():
            raise CheckpointError(f"{shard}: file not found (listed in {INDEX_NAME}; {DOWNLOAD})")
    return shards


def safetensors_header(path: Path) -> list[str]:
    """The keys of a safetensors file whose header and length are whole (no data read)."""
    from safetensors import safe_open

    if not path.is_file():
        raise CheckpointError(f"{path}: file not found")
    try:
        with safe_open(str(path), "pt") as f:
            return list(f.keys())
    except Exception as exc:  # safetensors raises its own and OS errors
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(
            f"{path}: truncated or damaged ({reason}): download it again"
        ) from None


def check_pth(path: Path) -> None:
    """A `.pth` state dict whose archive opens: memory-mapped, so nothing large is read."""
    try:
        torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # torch raises many kinds for a damaged zip or pickle
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(
            f"{path}: not a readable PyTorch state dict, truncated or damaged ({reason[:120]}): "
            "download it again"
        ) from None


def check_tokenizer(folder: Path) -> None:
    if not (folder / "tokenizer_config.json").is_file():
        raise CheckpointError(f"{folder / 'tokenizer_config.json'}: file not found ({DOWNLOAD})")
    if not any((folder / n).is_file() for n in ("tokenizer.json", "spiece.model")):
        raise CheckpointError(f"{folder}: neither tokenizer.json nor spiece.model ({DOWNLOAD})")


def check_wav2vec(folder: Path) -> None:
    for name in ("config.json", "preprocessor_config.json"):
        if not (folder / name).is_file():
            raise CheckpointError(f"{folder / name}: file not found ({DOWNLOAD})")
    weights = folder / "model.safetensors"
    if weights.is_file():
        safetensors_header(weights)
    elif (folder / "pytorch_model.bin").is_file():
        check_pth(folder / "pytorch_model.bin")
    else:
        raise CheckpointError(f"{folder}: neither model.safetensors nor pytorch_model.bin")


def read_transformer_state(ckpt_dir: str | Path) -> dict[str, Tensor]:
    """The S2V transformer's weights by their published names, through the index."""
    return read_diffusers_weights(Path(ckpt_dir).expanduser())


def read_merged_state(
    ckpt_dir: str | Path,
    lora: str | Path,
    device: torch.device | str = "cpu",
    alpha: float = LORA_ALPHA,
) -> dict[str, Tensor]:
    """The transformer's published weights with the Live-Avatar LoRA merged in, as the
    authors' `add_lora_to_model` leaves the model (their alpha; the rank from the file), on
    `device`: moved there before the merge, so that a GPU does the arithmetic."""
    state = read_transformer_state(ckpt_dir)
    if torch.device(device).type != "cpu":
        state = {k: v.to(device) for k, v in state.items()}
    return merge_lora(state, read_lora(lora_path(lora)), alpha)


def read_transformer_config(ckpt_dir: str | Path) -> dict:
    """The fields of `config.json` the transformer is built from (`CONFIG_FIELDS`), checked,
    as a plain dict of the published names (lists for the tuples), defaults filled in."""
    path = Path(ckpt_dir).expanduser() / "config.json"
    raw = read_json(path)
    config: dict = {}
    for name, (kind, default) in CONFIG_FIELDS.items():
        if name not in raw and default is None:
            raise CheckpointError(f"{path}: no {name!r} (a {kind}): not Wan2.2-S2V's config.json")
        v = raw.get(name, default)
        ok = {
            "int": isinstance(v, int) and not isinstance(v, bool) and v > 0,
            "ints": isinstance(v, list) and all(isinstance(i, int) and i >= 0 for i in v),
            "bool": isinstance(v, bool),
            "str": isinstance(v, str),
            "float": isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0,
        }[kind]
        if not ok:
            raise CheckpointError(f"{path}: {name!r} must be a {kind} (got {v!r})")
        config[name] = v
    if len(config["patch_size"]) != 3:
        raise CheckpointError(
            f"{path}: 'patch_size' must be three integers (got {config['patch_size']!r})"
        )
    if config["dim"] % config["num_heads"]:
        raise CheckpointError(
            f"{path}: dim {config['dim']} does not split into {config['num_heads']} heads"
        )
    late = [i for i in config["audio_inject_layers"] if i >= config["num_layers"]]
    if late:
        raise CheckpointError(
            f"{path}: audio_inject_layers names layer {late[0]} of {config['num_layers']}"
        )
    return config


@dataclass(frozen=True)
class RandomParts:
    """The sizes of a random release's parts other than the transformer (whose state and
    config the caller brings from its model file)."""

    t5: UMT5Shape
    vae: WanVAEConfig
    wav2vec: dict  # transformers.Wav2Vec2Config keyword arguments over XLSR53_LARGE
    lora_rank: int


RANDOM_PARTS = {
    "full": RandomParts(UMT5Shape(), WAN21_VAE, {}, LORA_RANK),
    "test": RandomParts(
        UMT5Shape(vocab=192, dim=32, dim_attn=32, dim_ffn=48, num_heads=4, num_layers=2),
        WAN21_VAE_TINY,
        WAV2VEC2_TINY,
        4,
    ),
}


def write_random_release(
    root: str | Path,
    transformer_state: dict[str, Tensor],
    transformer_config: dict,
    shape: str = "test",
    seed: int = 0,
    max_shard_bytes: int = 10 * 10**9,
    parts: RandomParts | None = None,
) -> tuple[ReleasePaths, Path]:
    """(the Wan2.2-S2V-14B folder `root/release`, the LoRA file `root/lora/liveavatar.safetensors`)
    of random weights, laid out as users download them: the transformer's state and config
    as given (from its model file's `random_published_state`), sharded like the release
    (10 GB shards there: 4 for the 14B model); umT5 (bf16, as published), the VAE, wav2vec2
    and the LoRA (over every weight `LORA_TARGETS` match) drawn here at `RANDOM_PARTS[shape]`.
    The tokenizer is always the tiny one (`umt5.write_tokenizer`). `parts` overrides
    `RANDOM_PARTS[shape]` (a lean umT5, say)."""
    from safetensors.torch import save_file

    parts = parts or RANDOM_PARTS[shape]
    release = Path(root) / "release"
    write_sharded(transformer_state, release, max_shard_bytes)
    config = {"_class_name": "WanModel_S2V", "model_type": "s2v", **transformer_config}
    (release / "config.json").write_text(json.dumps(config, indent=1))
    torch.save(random_checkpoint(parts.vae, seed + 1), release / VAE_NAME)
    torch.save(random_wan_state(parts.t5, seed + 2, torch.bfloat16), release / T5_NAME)
    write_tokenizer(release / TOKENIZER_DIR)
    write_random_wav2vec2(release / WAV2VEC_DIR, parts.wav2vec, seed + 3)
    lora = Path(root) / "lora" / LORA_NAME
    lora.parent.mkdir(parents=True, exist_ok=True)
    state = random_lora(lora_target_shapes(transformer_state), parts.lora_rank, seed + 4)
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in state.items()}, str(lora))
    return release_paths(release), lora


def lora_target_shapes(state: dict[str, Tensor]) -> dict[str, tuple[int, ...]]:
    """The weights PEFT's `target_modules` match in a published state (a linear layer's
    name ends in `.q`, `.ffn.0`, …): what a random LoRA adapts."""
    ends = tuple(f".{t}.weight" for t in LORA_TARGETS)
    return {k: tuple(v.shape) for k, v in state.items() if k.endswith(ends) and v.ndim == 2}
