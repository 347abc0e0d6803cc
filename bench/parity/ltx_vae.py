"""Parity of Facecast's LTX VAE (pipeline/models/ltx) with SoulX-FlashHead's own code.

The authors' `CausalVideoAutoencoder` is built from their config, every parameter is
re-randomised, and it is saved in the published `VAE_LTX/` layout (diffusers' config.json
and diffusion_pytorch_model.safetensors under diffusers' names: the rename is their own
table, imported from the reference checkout). Their `LtxVAE` then loads that folder through
their `from_pretrained`, ours through `load_ltx_vae`, and both encode and decode the same
random inputs:

  encode_mean    their posterior mean, normalised   vs ours with sample=False
  encode_sample  their LtxVAE.encode (a posterior draw from the global RNG) vs ours with the
                 same seed
  decode         their LtxVAE.decode vs ours, on the same random latents

Their code runs from --reference-repo and is never copied here. It needs einops (pip
install einops into the venv for this script). Usage:

  python bench/parity/ltx_vae.py --reference-repo /path/to/SoulX-FlashHead \
      [--shape tiny|release|full] [--device cpu|cuda] [--dtype float32|bfloat16] [--json OUT] \
      [--write-fixture tests/fixtures/flashhead_lite]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from pipeline.models.ltx.vae import (
    CONFIG_FILE,
    RELEASE,
    TINY,
    WEIGHTS_FILE,
    LtxVaeConfig,
    build_network,
    latent_shape,
    load_ltx_vae,
)

SHAPES = {  # config, (frames, height, width)
    "tiny": (TINY, (9, 32, 64)),  # the test fixture's: small and not square
    "release": (RELEASE, (33, 96, 128)),  # the release's network and chunk length, small frames
    "full": (RELEASE, (33, 512, 512)),  # FlashHead Lite's chunk: ~21x "release"; for a GPU
}
STATS = "per_channel_statistics."


def import_reference(repo: Path):
    """The authors' modules, imported from their checkout."""
    sys.path.insert(0, str(repo))
    from flash_head.ltx_video import ltx_vae
    from flash_head.ltx_video.models.autoencoders import causal_video_autoencoder as cva
    from flash_head.ltx_video.utils import diffusers_config_mapping as mapping

    return ltx_vae, cva, mapping


def authors_config(cfg: LtxVaeConfig) -> dict:
    """Their block-list config for a diffusers-style LTX 0.9.0 config: per level, its resnets,
    a 2x2x2 compression where the level scales, and a channel-doubling resnet where the
    width changes; the mid block last."""
    widths = cfg.block_out_channels
    blocks: list[list] = []
    for i, scales in enumerate(cfg.spatio_temporal_scaling):
        blocks.append(["res_x", cfg.layers_per_block[i]])
        if scales:
            blocks.append(["compress_all", 1])
        if i + 1 < len(widths) and widths[i + 1] != widths[i]:
            assert widths[i + 1] == 2 * widths[i], "their res_x_y doubles the width"
            blocks.append(["res_x_y", 1])
    blocks.append(["res_x", cfg.layers_per_block[-1]])
    return {
        "_class_name": "CausalVideoAutoencoder",
        "dims": 3,
        "in_channels": cfg.in_channels,
        "out_channels": cfg.out_channels,
        "latent_channels": cfg.latent_channels,
        "blocks": blocks,
        "scaling_factor": cfg.scaling_factor,
        "norm_layer": "pixel_norm",
        "patch_size": cfg.patch_size,
        "latent_log_var": "uniform",
        "use_quant_conv": False,
        "causal_decoder": cfg.decoder_causal,
        "encoder_base_channels": widths[0],
        "decoder_base_channels": widths[0],
    }


def randomise(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """New values for every parameter (weights ~ 1/sqrt(fan_in), biases and norm shifts
    non-zero, norm scales around 1), rounded to bf16-representable numbers so a bf16 file
    holds them exactly; plus random per-channel latent statistics. Returns their state dict."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if p.dim() > 1:
                value = noise / p[0].numel() ** 0.5
            elif "norm" in name and name.endswith("weight"):
                value = 1.0 + 0.2 * noise
            else:
                value = 0.1 * noise
            p.copy_(value.bfloat16().float())
    state = dict(model.state_dict())
    channels = model.decoder.conv_in.in_channels
    state[STATS + "mean-of-means"] = (0.2 * torch.randn(channels, generator=gen)).bfloat16().float()
    std = 0.5 + torch.rand(channels, generator=gen)
    state[STATS + "std-of-means"] = std.bfloat16().float()
    flat = [k for k, v in state.items() if v.unique().numel() < min(2, v.numel())]
    assert not flat, f"tensors left constant: {flat[:3]}"
    return state


def to_published(theirs: dict[str, torch.Tensor], cfg: LtxVaeConfig, rename: dict) -> dict:
    """Their state dict under diffusers' names: each diffusers key goes through their own
    rename table (as their from_pretrained does) to find its tensor."""
    wanted = build_network(cfg, "meta").state_dict()
    out, used = {}, set()
    for key, meta in wanted.items():
        theirs_key = key
        for old, new in rename.items():
            theirs_key = theirs_key.replace(old, new)
        tensor = theirs[theirs_key]
        assert tensor.shape == meta.shape, (key, theirs_key, tensor.shape, meta.shape)
        out[key] = tensor
        used.add(theirs_key)
    assert used == set(theirs), f"their tensors left out: {sorted(set(theirs) - used)[:5]}"
    return out


def write_layout(folder: Path, cfg: LtxVaeConfig, state: dict, dtype: torch.dtype) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG_FILE).write_text(json.dumps(cfg.to_json(), indent=2) + "\n")
    save_file({k: v.to(dtype).contiguous() for k, v in state.items()}, str(folder / WEIGHTS_FILE))


def compare(ref: torch.Tensor, ours: torch.Tensor) -> dict:
    a, b = ref.double().flatten(), ours.double().flatten()
    assert a.shape == b.shape, (ref.shape, ours.shape)
    cos = torch.nn.functional.cosine_similarity(a, b, dim=0).item()
    return {
        "shape": list(ref.shape),
        "cosine": cos,
        "max_abs": (a - b).abs().max().item(),
        "ref_max_abs": a.abs().max().item(),
    }


def run(args) -> dict:
    ltx_vae, cva, mapping = import_reference(args.reference_repo)
    cfg, (frames, height, width) = SHAPES[args.shape]
    dtype = getattr(torch, args.dtype)
    device = torch.device(args.device)
    ours_json, theirs_json = cfg.to_json(), authors_config(cfg)
    if cfg == RELEASE:  # the release's config is exactly the one their loader accepts
        assert ours_json == mapping.DIFFUSERS_VAE_CONFIG, "config differs from the release's"
        assert theirs_json["blocks"] == mapping.OURS_VAE_CONFIG["blocks"]
    # their from_pretrained takes only configs it knows: teach it this one (a no-op for full)
    mapping.diffusers_and_ours_config_mapping[mapping.make_hashable_key(ours_json)] = theirs_json

    model = cva.CausalVideoAutoencoder.from_config(dict(theirs_json))
    theirs_state = randomise(model, args.seed)
    published = to_published(theirs_state, cfg, mapping.VAE_KEYS_RENAME_DICT)
    del model  # the full-size network is 1.7 GB in fp32: keep one copy of its tensors

    gen = torch.Generator().manual_seed(args.seed + 1)
    video = (2 * torch.rand(1, 3, frames, height, width, generator=gen) - 1).bfloat16().float()
    lat_shape = (1, *latent_shape(cfg, frames, height, width))
    latents = torch.randn(lat_shape, generator=gen).bfloat16().float()
    noise_seed = args.seed + 2
    video_d, latents_d = video.to(device, dtype), latents.to(device, dtype)

    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        folder = Path(tmp) / "VAE_LTX"
        write_layout(folder, cfg, published, torch.float32)
        t0 = time.perf_counter()
        ref = ltx_vae.LtxVAE(str(folder), dtype=dtype, device=device)
        ours = load_ltx_vae(folder, device, dtype)
        t_load = time.perf_counter() - t0
        loaded = ref.model.state_dict()
        for k, v in theirs_state.items():  # their loader read back what we wrote
            if not k.startswith(STATS):
                assert torch.equal(loaded[k].float().cpu(), v), k

        timings, results = {"load_s": t_load}, {}
        t0 = time.perf_counter()
        ref_out = reference_outputs(ref, video_d, latents_d, noise_seed)
        timings["theirs_s"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        our_mean = ours.encode(video_d, sample=False)
        our_sample = ours.encode(video_d, generator=_generator(device, noise_seed))
        our_dec = ours.decode(latents_d)
        timings["ours_s"] = time.perf_counter() - t0

        diffusers_check = diffusers_from_pretrained(folder, ours)
        ours_out = {"encode_mean": our_mean, "encode_sample": our_sample, "decode": our_dec}
        results = {k: compare(ref_out[k], ours_out[k]) for k in ref_out}
        if dtype != torch.float32:  # how far each side's low precision is from fp32
            del ref
            ref32 = ltx_vae.LtxVAE(str(folder), dtype=torch.float32, device=device)
            out32 = reference_outputs(ref32, video_d.float(), latents_d.float(), noise_seed)
            for k, r in results.items():
                r["theirs_vs_their_fp32"] = compare(out32[k], ref_out[k])["cosine"]
                r["ours_vs_their_fp32"] = compare(out32[k], ours_out[k])["cosine"]

        if args.write_fixture:
            write_fixture(args.write_fixture, cfg, published, video, latents, noise_seed, ref_out)

    return {
        "shape": args.shape,
        "input": [1, 3, frames, height, width],
        "latents": list(lat_shape),
        "device": str(device),
        "dtype": args.dtype,
        "torch": torch.__version__,
        "diffusers": __import__("diffusers").__version__,
        "seed": args.seed,
        "results": results,
        "diffusers_from_pretrained": diffusers_check,
        "timings_s": {k: round(v, 2) for k, v in timings.items()},
    }


def diffusers_from_pretrained(folder: Path, ours) -> dict:
    """Does diffusers' own `AutoencoderKLLTXVideo.from_pretrained` read the folder into the
    tensors our loader holds? (For the release config yes: its defaults for the decoder_*
    keys, absent from the 0.9.0 config, are the release's sizes; for other sizes, no.)"""
    from diffusers import AutoencoderKLLTXVideo

    try:
        net = AutoencoderKLLTXVideo.from_pretrained(str(folder))
    except Exception as exc:  # what diffusers says is the finding
        return {"loads": False, "error": " ".join(str(exc).split())[:300]}
    mine = ours.network.state_dict()
    theirs = net.state_dict()
    same = set(theirs) == set(mine) and all(
        torch.equal(v.to(mine[k].dtype).cpu(), mine[k].cpu()) for k, v in theirs.items()
    )
    return {"loads": True, "same_tensors_as_ours": same}


def reference_outputs(ref, video, latents, noise_seed: int) -> dict[str, torch.Tensor]:
    """Their LtxVAE on the inputs: encode as LtxVAE.encode does (batched: one encoder pass
    for both the posterior mean and the draw), decode through LtxVAE.decode."""
    dist = ref.model.encode(video, return_dict=False)[0]
    mean = ref.normalize_latents(dist.mean)
    torch.manual_seed(noise_seed)
    sample = ref.normalize_latents(dist.sample())
    return {"encode_mean": mean, "encode_sample": sample, "decode": ref.decode(latents[0])}


def _generator(device: torch.device, seed: int) -> torch.Generator:
    """A generator on `device` seeded as torch.manual_seed seeds that device's global RNG."""
    return torch.Generator(device).manual_seed(seed)


def write_fixture(path: Path, cfg, published, video, latents, noise_seed, outputs) -> None:
    """Tiny weights (bf16, exact: they are bf16-representable), inputs and their outputs."""
    write_layout(path, cfg, published, torch.bfloat16)
    tensors = {"video": video.bfloat16(), "latents": latents.bfloat16()}  # exact in bf16
    tensors.update({k: v.float().cpu().contiguous() for k, v in outputs.items()})
    save_file(tensors, str(path / "io.safetensors"), metadata={"noise_seed": str(noise_seed)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reference-repo", type=Path, required=True)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--write-fixture", type=Path)
    args = parser.parse_args()
    report = run(args)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
