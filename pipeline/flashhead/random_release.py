"""A FlashHead release of random weights, laid out as users download the real one.

    python -m pipeline.flashhead.random_release DIR [--shape full|test] [--seed N]

writes `DIR/release/` (`Model_Pro/config.json` + safetensors, `VAE_Wan/Wan2.1_VAE.pth`)
and `DIR/wav2vec/` (a transformers wav2vec2 folder), so that every path a user takes —
`facecast render|serve|bench|gate --model flashhead-pro --weights DIR/release --wav2vec
DIR/wav2vec` — runs without a download: at the published sizes (`full`, for GPU speed and
memory measurements; vLLM's "dummy" weights) or tiny (`test`, for CPU tests). Nothing
here is zero or one: such paths hide bugs.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import torch

from pipeline.flashhead.weights import random_dit_state, randomise_module, write_release_dit
from pipeline.models.wan.dit import WanDiTConfig
from pipeline.models.wan.vae import WAN21_VAE, WAN21_VAE_TINY, WanVAEConfig, random_checkpoint


@dataclass(frozen=True)
class ReleaseShape:
    dit: WanDiTConfig
    vae: WanVAEConfig
    wav2vec: dict  # transformers.Wav2Vec2Config keyword arguments


SHAPES = {
    "full": ReleaseShape(WanDiTConfig(), WAN21_VAE, {}),  # wav2vec2-base's defaults
    # every size shrunk, the structure kept: a chunk takes well under a second on a CPU
    "test": ReleaseShape(
        WanDiTConfig(
            dim=32,
            ffn_dim=64,
            text_dim=8,
            freq_dim=32,
            num_heads=2,
            num_layers=2,
            audio_dim=16,
            audio_layers=2,
            audio_hidden=16,
            context_tokens=4,
        ),
        WAN21_VAE_TINY,
        dict(
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=32,
            conv_dim=(8,) * 7,
            num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=2,
        ),
    ),
}


def write_wav2vec(folder: Path, config_kwargs: dict, seed: int) -> Path:
    from transformers import Wav2Vec2Config, Wav2Vec2FeatureExtractor, Wav2Vec2Model

    model = Wav2Vec2Model(Wav2Vec2Config(**config_kwargs))
    randomise_module(model, seed)
    model.save_pretrained(str(folder))
    Wav2Vec2FeatureExtractor(
        feature_size=1,
        sampling_rate=16_000,
        padding_value=0.0,
        do_normalize=True,
        return_attention_mask=False,
    ).save_pretrained(str(folder))
    return folder


def write_random_release(root: str | Path, shape: str = "test", seed: int = 0) -> tuple[Path, Path]:
    """(release folder, wav2vec folder) of random weights under `root`."""
    s = SHAPES[shape]
    root = Path(root)
    release = root / "release"
    write_release_dit(release / "Model_Pro", s.dit, random_dit_state(s.dit, seed))
    (release / "VAE_Wan").mkdir(parents=True, exist_ok=True)
    torch.save(random_checkpoint(s.vae, seed + 1), release / "VAE_Wan" / "Wan2.1_VAE.pth")
    wav2vec = write_wav2vec(root / "wav2vec", s.wav2vec, seed + 2)
    return release, wav2vec


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root")
    p.add_argument("--shape", choices=sorted(SHAPES), default="test")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    release, wav2vec = write_random_release(args.root, args.shape, args.seed)
    print(f"--weights {release} --wav2vec {wav2vec}")


if __name__ == "__main__":
    main()
