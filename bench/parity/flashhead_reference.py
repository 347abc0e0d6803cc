"""Run the SoulX-FlashHead authors' own code on random weights and keep what it computes.

    python bench/parity/flashhead_reference.py --reference-repo PATH --out DIR
        [--shape tiny|full] [--device cpu|cuda] [--dtype float32|bfloat16] [--chunks 3]
        [--time N]

PATH is a checkout of github.com/Soul-AILab/SoulX-FlashHead; nothing of it is copied into
Facecast: it is imported from PATH, in its own process, with transformers 4.x on the path
(its wav2vec2 subclass predates transformers 5), stand-ins for the modules it imports but
never needs here (xfuser's multi-GPU helpers, mediapipe's face detector, loguru, pyloudnorm; torchvision's
centre crop where torchvision is not installed)
and `torch.cuda.synchronize` made harmless on a CPU.

It writes, under DIR:
- `release/`: the random weights in the published layout (`Model_Pro/config.json` +
  safetensors as the authors' `save_pretrained` writes it, `VAE_Wan/Wan2.1_VAE.pth`), and
  `wav2vec/`, a random wav2vec2 folder (base-sized at full shape);
- `reference.png` and `speech.safetensors`: the inputs;
- `reference.safetensors`: their outputs — the DiT forward on random inputs, the wav2vec2
  features of the first audio window, the VAE's encode and decode, and the whole stream-mode
  render (`generate_video.py --audio_encode_mode stream`): each chunk's audio embedding,
  sampled latents, motion latents and frames (uint8, as their writer truncates them).
- with `--time N`: `timing.json`, N chunks of their compiled pipeline (as they compile it).

`bench/parity/flashhead_compare.py` loads the same files through Facecast and compares.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch

FACECAST = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(FACECAST))

from pipeline.clock import MODEL_RATE, MODEL_SAMPLES_PER_FRAME  # noqa: E402
from pipeline.flashhead.dit import WanDiTConfig  # noqa: E402
from pipeline.flashhead.random_release import write_wav2vec  # noqa: E402
from pipeline.flashhead.weights import (  # noqa: E402
    dit_config_json,
    random_dit_state,
)
from pipeline.models.wan.vae import WanVAEConfig, random_checkpoint  # noqa: E402

SHAPES = {
    # the published sizes; tiny keeps what the authors' code hard-codes (width 1536, 12 heads,
    # wav2vec2 width 768 and 12 layers) and shrinks the rest
    "full": dict(dit=WanDiTConfig(), size=512, vae_dim=96, wav2vec={}),  # wav2vec2-base
    "tiny": dict(
        dit=WanDiTConfig(num_layers=2, ffn_dim=64),
        size=32,
        vae_dim=8,
        wav2vec=dict(
            intermediate_size=64,
            conv_dim=(32,) * 7,
            num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=4,
        ),
    ),
}


def stand_ins(device: str) -> None:
    """Modules the authors' code imports but does not need on one GPU or a CPU."""

    def module(name: str, **attrs) -> None:
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        sys.modules[name] = m

    module("xfuser")
    module("xfuser.core")
    module(
        "xfuser.core.distributed",
        get_sequence_parallel_rank=lambda: 0,
        get_sequence_parallel_world_size=lambda: 1,
        get_sp_group=lambda: None,
    )
    module("xfuser.core.long_ctx_attention", xFuserLongContextAttention=None)
    module("mediapipe")
    module("pyloudnorm")
    try:
        import loguru  # noqa: F401
    except ImportError:
        import logging

        module("loguru", logger=logging.getLogger("reference"))
    import diffusers  # noqa: F401  (before any stand-in: both probe optional packages)
    import transformers  # noqa: F401

    try:
        import torchvision  # noqa: F401
    except ImportError:  # only center_crop is used (their resize_and_centercrop)

        def center_crop(img: torch.Tensor, size) -> torch.Tensor:
            h, w = img.shape[-2:]
            th, tw = size
            top, left = int(round((h - th) / 2.0)), int(round((w - tw) / 2.0))
            return img[..., top : top + th, left : left + tw]

        functional = types.ModuleType("torchvision.transforms.functional")
        functional.center_crop = center_crop  # type: ignore[attr-defined]
        transforms = types.ModuleType("torchvision.transforms")
        transforms.functional = functional  # type: ignore[attr-defined]
        module("torchvision", transforms=transforms)
        sys.modules["torchvision.transforms"] = transforms
        sys.modules["torchvision.transforms.functional"] = functional
    if device == "cpu":
        torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]


def make_inputs(out: Path, size: int, chunks: int, seed: int) -> tuple[Path, np.ndarray]:
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size] / size
    img = np.stack([0.6 + 0.3 * x, 0.4 + 0.3 * y, 0.5 - 0.2 * x * y], -1)
    img = np.clip(img + 0.08 * rng.standard_normal(img.shape), 0, 1)
    path = out / "reference.png"
    Image.fromarray((img * 255).astype(np.uint8)).save(path)
    n = chunks * 28 * MODEL_SAMPLES_PER_FRAME
    t = np.arange(n) / MODEL_RATE
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 3.1 * t)
    audio = envelope * (0.3 * np.sin(2 * np.pi * 180 * t) + 0.1 * rng.standard_normal(n))
    audio = audio.astype(np.float32)
    from safetensors.numpy import save_file

    save_file({"audio": audio}, str(out / "speech.safetensors"))
    return path, audio


def build_release(args, shape: dict, out: Path) -> tuple[Path, Path]:
    from flash_head.src.modules.flash_head_model import WanModelAudioProject
    from flash_head.wan.modules import vae as wan_vae

    cfg: WanDiTConfig = shape["dit"]
    release = out / "release"
    raw = dit_config_json(cfg)
    raw.pop("_class_name")
    model = WanModelAudioProject(**raw)
    model.load_state_dict(random_dit_state(cfg, args.seed), strict=True)
    model.save_pretrained(str(release / "Model_Pro"))

    vae = wan_vae.WanVAE_(
        dim=shape["vae_dim"],
        z_dim=16,
        dim_mult=[1, 2, 4, 4],
        num_res_blocks=2,
        attn_scales=[],
        temperal_downsample=[False, True, True],
        dropout=0.0,
    )
    # the published layout's random weights, as Facecast's tests re-make them
    vae.load_state_dict(random_checkpoint(WanVAEConfig(base_dim=shape["vae_dim"]), args.seed + 1))
    (release / "VAE_Wan").mkdir(parents=True, exist_ok=True)
    torch.save(vae.state_dict(), release / "VAE_Wan" / "Wan2.1_VAE.pth")
    # the authors' loader builds the published size; at tiny shape, the tiny one
    original = wan_vae._video_vae
    wan_vae._video_vae = lambda **kw: original(**kw, dim=shape["vae_dim"])

    # saved by the authors' transformers (4.x), read by Facecast's (5.x)
    return release, write_wav2vec(out / "wav2vec", shape["wav2vec"], args.seed + 2)


def run(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    repo = Path(args.reference_repo).resolve()
    stand_ins(args.device)
    sys.path.insert(0, str(repo))
    os.chdir(repo)  # flash_head.inference reads its YAML by a relative path
    shape = SHAPES[args.shape]
    torch.manual_seed(args.seed)
    release, wav2vec = build_release(args, shape, out)
    image_path, audio = make_inputs(out, shape["size"], args.chunks, args.seed)
    dtype = getattr(torch, args.dtype)

    pipeline_mod = importlib.import_module("flash_head.src.pipeline.flash_head_pipeline")
    pipeline_mod.COMPILE_MODEL = pipeline_mod.COMPILE_VAE = False
    inference = importlib.import_module("flash_head.inference")
    inference.get_device = lambda *_: args.device
    inference.infer_params.update(height=shape["size"], width=shape["size"])
    init = pipeline_mod.FlashHeadPipeline.__init__
    defaults = list(init.__defaults__)
    defaults[1] = dtype  # param_dtype: get_pipeline leaves it at bf16; build in `dtype`
    init.__defaults__ = tuple(defaults)
    pipe = inference.get_pipeline(1, str(release), "pro", str(wav2vec))
    inference.get_base_data(pipe, str(image_path), base_seed=args.seed, use_face_crop=False)

    results: dict[str, torch.Tensor] = {}
    dev = args.device
    cfg: WanDiTConfig = shape["dit"]
    lat = shape["size"] // 8
    g = torch.Generator().manual_seed(args.seed + 2)
    x = torch.randn(1, 16, 9, lat, lat, generator=g)
    y = torch.randn(1, 16, 9, lat, lat, generator=g)
    ctx = torch.randn(1, 33, 5, cfg.audio_layers, cfg.audio_dim, generator=g)
    t = torch.tensor([937.5])
    with torch.no_grad():
        results["dit.x"], results["dit.y"], results["dit.audio"], results["dit.t"] = x, y, ctx, t
        results["dit.out"] = (
            pipe.model(
                x=x.to(dev, dtype),
                timestep=t.to(dev),
                context=ctx.to(dev, dtype),
                y=y.to(dev, dtype),
            )
            .float()
            .cpu()
        )
        video = torch.rand(1, 3, 33, shape["size"], shape["size"], generator=g) * 2 - 1
        results["vae.video"] = video
        results["vae.latents"] = pipe.vae.encode(video.to(dev, dtype)).float().cpu()
        z = torch.randn(16, 9, lat, lat, generator=g)
        results["vae.z"] = z
        results["vae.decoded"] = pipe.vae.decode(z.to(dev, dtype)).float().cpu()
        results["ref.latents"] = pipe.ref_img_latent.float().cpu()

    stream_render(pipe, inference, audio, results)
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in results.items()}, str(out / "reference.safetensors"))
    meta = {
        "shape": args.shape,
        "dtype": args.dtype,
        "device": dev,
        "seed": args.seed,
        "chunks": args.chunks,
        "size": shape["size"],
        "vae_dim": shape["vae_dim"],
        "dit_layers": shape["dit"].num_layers,
        "dit_ffn": shape["dit"].ffn_dim,
        "wav2vec": {k: list(v) if isinstance(v, tuple) else v for k, v in shape["wav2vec"].items()},
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    print(f"reference outputs: {len(results)} tensors in {out / 'reference.safetensors'}")
    if args.time:
        time_compiled(args, release, wav2vec, image_path, audio, out, inference, pipeline_mod)


def stream_render(pipe, inference, audio: np.ndarray, results: dict) -> None:
    """generate_video.py's stream mode, chunk by chunk, keeping every intermediate."""
    from collections import deque

    params = inference.get_infer_params()
    rate, fps = params["sample_rate"], params["tgt_fps"]
    frame_num, motion = params["frame_num"], params["motion_frames_num"]
    slice_len = frame_num - motion
    cached = rate * params["cached_audio_duration"]
    end_idx = params["cached_audio_duration"] * fps
    start_idx = end_idx - frame_num
    window = deque([0.0] * cached, maxlen=cached)
    samples = slice_len * rate // fps
    decoded = {}
    original_decode = pipe.vae.decode

    def keep_latents(zs):
        decoded["z"] = zs.float().cpu()
        return original_decode(zs)

    pipe.vae.decode = keep_latents
    for k, piece in enumerate(audio.reshape(-1, samples)):
        window.extend(piece.tolist())
        emb = inference.get_audio_embedding(pipe, np.array(window), start_idx, end_idx)
        if k == 0:
            feats = pipe.preprocess_audio(np.array(window), sr=rate, fps=fps)
            results["w2v.window"] = torch.from_numpy(np.array(window, dtype=np.float32))
            results["w2v.features"] = feats.float().cpu()
        with torch.no_grad():
            video = inference.run_pipeline(pipe, emb)
        frames = video[motion:].cpu().numpy().astype(np.uint8)  # as their writer does
        results[f"chunk{k}.audio_emb"] = emb.float().cpu()
        results[f"chunk{k}.latents"] = decoded["z"]
        results[f"chunk{k}.motion"] = pipe.latent_motion_frames.float().cpu()
        results[f"chunk{k}.frames"] = torch.from_numpy(frames)
    pipe.vae.decode = original_decode


def time_compiled(args, release, wav2vec, image_path, audio, out, inference, pipeline_mod):
    """Their pipeline as they run it (models compiled, bf16), N chunks, wall time each."""
    from collections import deque

    pipeline_mod.COMPILE_MODEL = pipeline_mod.COMPILE_VAE = True
    init = pipeline_mod.FlashHeadPipeline.__init__
    defaults = list(init.__defaults__)
    defaults[1] = torch.bfloat16  # as they run it
    init.__defaults__ = tuple(defaults)
    pipe = inference.get_pipeline(1, str(release), "pro", str(wav2vec))
    inference.get_base_data(pipe, str(image_path), base_seed=args.seed, use_face_crop=False)
    params = inference.get_infer_params()
    rate, fps = params["sample_rate"], params["tgt_fps"]
    slice_len = params["frame_num"] - params["motion_frames_num"]
    cached = rate * params["cached_audio_duration"]
    end_idx = params["cached_audio_duration"] * fps
    window = deque([0.0] * cached, maxlen=cached)
    samples = slice_len * rate // fps
    pieces = np.resize(audio, (args.time + 3) * samples).reshape(-1, samples)
    chunk_s, audio_s = [], []
    for piece in pieces:
        window.extend(piece.tolist())
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        emb = inference.get_audio_embedding(
            pipe, np.array(window), end_idx - params["frame_num"], end_idx
        )
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        inference.run_pipeline(pipe, emb).cpu()
        t2 = time.perf_counter()
        audio_s.append(t1 - t0)
        chunk_s.append(t2 - t0)
    steady = sorted(chunk_s[3:])
    report = {
        "chunks": len(steady),
        "new_frames_per_chunk": slice_len,
        "chunk_seconds_median": steady[len(steady) // 2],
        "fps": slice_len / steady[len(steady) // 2],
        "audio_seconds_median": sorted(audio_s[3:])[len(steady) // 2],
        "chunk_seconds": chunk_s,
        "peak_gb": torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else None,
    }
    (out / "timing.json").write_text(json.dumps(report, indent=1))
    print(
        f"authors' code, compiled: {report['fps']:.1f} fps "
        f"(chunk {report['chunk_seconds_median']:.3f} s for {slice_len} frames)"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reference-repo", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--chunks", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--time", type=int, default=0, help="time N chunks of their compiled code")
    run(p.parse_args())


if __name__ == "__main__":
    main()
