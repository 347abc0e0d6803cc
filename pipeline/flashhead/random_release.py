"""A FlashHead release of random weights, laid out as users download the real one.

    python -m pipeline.flashhead.random_release DIR [--shape full|test] [--seed N]

writes `DIR/release/` (`Model_Pro/config.json` + safetensors, `VAE_Wan/Wan2.1_VAE.pth`;
`Model_Lite/` and `VAE_LTX/` too with `--lite`) and `DIR/wav2vec/` (a transformers wav2vec2 folder), so that every path a user takes —
`facecast render|serve|bench|gate --model flashhead-pro --weights DIR/release --wav2vec
DIR/wav2vec` — runs without a download: at the published sizes (`full`, for GPU speed and
memory measurements; vLLM's "dummy" weights) or tiny (`test`, for CPU tests). Nothing
here is zero or one: such paths hide bugs.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from pipeline.flashhead.dit import WanDiTConfig
from pipeline.flashhead.weights import random_dit_state, write_release_dit
from pipeline.models.encoders.wav2vec2 import WAV2VEC2_TINY, write_feature_extractor
from pipeline.models.ltx.vae import RELEASE as LTX_RELEASE
from pipeline.models.ltx.vae import TINY as LTX_TINY
from pipeline.models.ltx.vae import LtxVaeConfig, build_network
from pipeline.models.wan.vae import WAN21_VAE, WAN21_VAE_TINY, WanVAEConfig, random_checkpoint
from pipeline.random_weights import randomise_module


@dataclass(frozen=True)
class ReleaseShape:
    dit: WanDiTConfig
    vae: WanVAEConfig
    wav2vec: dict  # transformers.Wav2Vec2Config keyword arguments
    ltx: LtxVaeConfig

    def lite_dit(self) -> WanDiTConfig:
        """Lite's DiT: the same blocks on LTX-Video latents (8x32x32, one latent a token)."""
        c = self.ltx.latent_channels
        return replace(
            self.dit, in_dim=2 * c, out_dim=c, vae_stride=(8, 32, 32), patch_size=(1, 1, 1)
        )


SHAPES = {
    "full": ReleaseShape(WanDiTConfig(), WAN21_VAE, {}, LTX_RELEASE),  # wav2vec2-base's defaults
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
        WAV2VEC2_TINY,
        LTX_TINY,
    ),
}


def write_wav2vec(folder: Path, config_kwargs: dict, seed: int) -> Path:
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    model = Wav2Vec2Model(Wav2Vec2Config(**config_kwargs))
    randomise_module(model, seed)
    model.save_pretrained(str(folder))
    write_feature_extractor(folder, attention_mask=False)
    return folder


def write_ltx_vae(folder: Path, cfg: LtxVaeConfig, seed: int) -> None:
    from safetensors.torch import save_file

    network: torch.nn.Module = build_network(cfg)  # diffusers' model is a torch Module
    randomise_module(network, seed)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg.to_json(), indent=1))
    state = {k: v.contiguous() for k, v in network.state_dict().items()}
    state["latents_std"] = state["latents_std"].abs() + 0.5  # a spread: positive by nature
    save_file(state, str(folder / "diffusion_pytorch_model.safetensors"))


def write_random_release(
    root: str | Path, shape: str = "test", seed: int = 0, lite: bool = False
) -> tuple[Path, Path]:
    """(release folder, wav2vec folder) of random weights under `root`."""
    s = SHAPES[shape]
    root = Path(root)
    release = root / "release"
    write_release_dit(release / "Model_Pro", s.dit, random_dit_state(s.dit, seed))
    (release / "VAE_Wan").mkdir(parents=True, exist_ok=True)
    torch.save(random_checkpoint(s.vae, seed + 1), release / "VAE_Wan" / "Wan2.1_VAE.pth")
    if lite:
        lite_dit = s.lite_dit()
        write_release_dit(release / "Model_Lite", lite_dit, random_dit_state(lite_dit, seed + 3))
        write_ltx_vae(release / "VAE_LTX", s.ltx, seed + 4)
    wav2vec = write_wav2vec(root / "wav2vec", s.wav2vec, seed + 2)
    return release, wav2vec


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root")
    p.add_argument("--shape", choices=sorted(SHAPES), default="test")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lite", action="store_true", help="also Model_Lite/ and VAE_LTX/")
    args = p.parse_args()
    release, wav2vec = write_random_release(args.root, args.shape, args.seed, args.lite)
    print(f"--weights {release} --wav2vec {wav2vec}")


if __name__ == "__main__":
    main()
