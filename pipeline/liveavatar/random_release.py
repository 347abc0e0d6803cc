"""A LiveAvatar release of random weights, laid out as users download it.

    python -m pipeline.liveavatar.random_release DIR [--shape full|test] [--seed N]
        [--device cpu|cuda] [--lean]

writes `DIR/release/` (Wan2.2-S2V-14B's folder: config.json, the sharded transformer, the
VAE, umT5, its tokenizer, wav2vec2-large) and `DIR/lora/liveavatar.safetensors`, and prints
the flags that run them. `full` is the real 14B shape (about 33 GB of transformer in bf16,
for the GPU benchmarks: no download needed to time the real thing); `test` a toy of every
part, for tests and CPU trials. Nothing in it was trained: the video is noise.

`--device cuda` draws the transformer on the GPU (seconds, not minutes of CPU draws; other
values than the CPU's for a seed). `--lean` writes a 2-layer umT5 (same widths and
vocabulary, so the same prompt features' shape): 2.9 GB, not 11.4; umT5 reads the prompt
once a session, so it changes no timing. The full release is then about 37 GB on disk
(transformer 33, umT5 2.9, wav2vec2-large 1.3, VAE 0.5, LoRA), not 46.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch

from pipeline.liveavatar.s2v_weights import random_published_state, random_published_tensors
from pipeline.liveavatar.weights import RANDOM_PARTS, write_random_release
from pipeline.models.wan.s2v import S2VConfig

# The 14B release's behaviour flags (what its config.json says besides the sizes).
RELEASE_FLAGS = {
    "qk_norm": True,
    "cross_attn_norm": True,
    "enable_adain": True,
    "adain_mode": "attn_norm",
    "enable_framepack": True,
    "framepack_drop_mode": "padd",
    "enable_motioner": False,
    "add_last_motion": True,
    "zero_timestep": True,
}


def transformer_shape(shape: str) -> S2VConfig:
    """The transformer of a random release: the 14B, or a toy whose text and audio widths
    are those of the toy umT5 and wav2vec2 the release carries."""
    if shape == "full":
        return S2VConfig()
    parts = RANDOM_PARTS[shape]
    wav2vec_layers = parts.wav2vec["num_hidden_layers"]
    return dataclasses.replace(
        S2VConfig.tiny(),
        text_dim=parts.t5.dim,
        audio_dim=parts.wav2vec["hidden_size"],
        audio_layers=wav2vec_layers + 1,
    )


def release_config(cfg: S2VConfig) -> dict:
    """config.json's fields for a transformer of this shape (the published names)."""
    sizes = (
        "dim", "ffn_dim", "freq_dim", "text_dim", "in_dim", "out_dim", "num_heads",
        "num_layers", "cond_dim", "audio_dim", "num_audio_token", "eps", "motion_frames",
    )  # fmt: skip
    raw: dict = {name: getattr(cfg, name) for name in sizes}
    raw["patch_size"] = list(cfg.patch_size)
    raw["audio_inject_layers"] = list(cfg.audio_inject_layers)
    return {**raw, **RELEASE_FLAGS}


LEAN_T5_LAYERS = 2


def write(
    root: str | Path, shape: str = "test", seed: int = 0, device: str = "cpu", lean: bool = False
) -> tuple[Path, Path]:
    """(the release folder, the LoRA file) under `root`."""
    cfg = transformer_shape(shape)
    dtype = torch.bfloat16 if shape == "full" else torch.float32  # the release is bf16
    if device == "cpu":
        state = random_published_state(cfg, seed, dtype)
    else:
        state = {k: v.cpu() for k, v in random_published_tensors(cfg, seed, dtype, device)}
    parts = RANDOM_PARTS[shape]
    if lean:
        parts = dataclasses.replace(
            parts, t5=dataclasses.replace(parts.t5, num_layers=LEAN_T5_LAYERS)
        )
    paths, lora = write_random_release(root, state, release_config(cfg), shape, seed, parts=parts)
    return paths.root, lora


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root")
    p.add_argument("--shape", choices=sorted(RANDOM_PARTS), default="test")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="where the transformer is drawn (cuda: fast)")
    p.add_argument("--lean", action="store_true", help="a 2-layer umT5 (2.9 GB, not 11.4)")
    args = p.parse_args()
    release, lora = write(args.root, args.shape, args.seed, args.device, args.lean)
    print(f"--weights {release} --lora {lora}")


if __name__ == "__main__":
    main()
