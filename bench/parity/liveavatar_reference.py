"""Run the LiveAvatar authors' transformer and streaming loop on random weights; keep what
it computes.

    PYTHONPATH=/path/to/refsite python bench/parity/liveavatar_reference.py \
        --reference-repo PATH --out DIR [--shape tiny|mid] [--blocks 5] [--seed 0]

PATH is a checkout of github.com/Alibaba-Quark/LiveAvatar; nothing of it is copied into
Facecast: it is imported from PATH, in its own process, with diffusers 0.35, einops and
easydict on the path (refsite), and stand-ins for what a CPU run does not have:
- the packages' `__init__` files (they import the T5, VAE, decord, ...) are skipped: each
  package is registered empty and only the modules the transformer needs are loaded;
- flash-attention / cuDNN attention → an fp32 scaled_dot_product_attention (their kernels
  take bf16; this run is fp32 end to end);
- `CausalWanModel_S2V.__init__` moves its RoPE table `.to("cuda")`: kept on the CPU;
- `_forward_sink` builds its empty noisy tensor with a hard-coded width of 5120: the
  model's width here;
- `_forward_inference` draws the reference's RoPE distance with `random.randint(4, 30)` on
  every call: drawn from a seeded generator and recorded, so Facecast can be given the same.

The loop is `WanS2V.generate` (causal_s2v_pipeline.py) reduced to the transformer: one KV
cache per sampling step (their `kv_cache1["1".."4"]`) sharing one sink cache, the sink
prefilled once per cache (`sink_flag=True`), then per block of 3 latent frames the Euler
scheduler's 4 steps (`FlowMatchEulerDiscreteScheduler(shift=3)`), step i on cache i, the
block's audio `audio_input[..., 12b:12b+12]`, the pose latents zero.

Writes, under DIR: `release/diffusion_pytorch_model.safetensors` (the random weights, as
`save_pretrained` would name them) + `config.json`, and `reference.safetensors` (inputs,
timesteps, sigmas, the recorded distances, every step's input and velocity, every
block's final latents) with the run's settings in its metadata.
`bench/parity/liveavatar_compare.py` loads the same files through Facecast and compares.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys
import types
from pathlib import Path

import torch
import torch.nn.functional as F

FACECAST = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(FACECAST))

from pipeline.models.wan.s2v import S2VConfig  # noqa: E402
from pipeline.models.wan.s2v_weights import random_published_state  # noqa: E402

PACKAGES = (
    "liveavatar",
    "liveavatar.models",
    "liveavatar.models.wan",
    "liveavatar.models.wan.wan_2_2",
    "liveavatar.models.wan.wan_2_2.modules",
    "liveavatar.models.wan.wan_2_2.modules.s2v",
    "liveavatar.models.wan.wan_2_2.distributed",
)
SHAPES = {
    # (config, latent h x w): non-square, so a swapped h/w shows
    "tiny": (S2VConfig.tiny(), (8, 16)),
    # the release's head size (128: RoPE's 44/42/42 split), wav2vec2-large and umT5 widths
    "mid": (
        S2VConfig(
            dim=256,
            ffn_dim=512,
            num_heads=2,
            num_layers=4,
            audio_inject_layers=(0, 3),
        ),
        (16, 24),
    ),
}
PROMPT_TOKENS = 7


def attention_stand_in(q, k, v, q_lens=None, k_lens=None, softmax_scale=None, **_):
    """Their flash/cuDNN attention: (B, L, N, K) in and out; every call here passes the
    full lengths (checked), so no padding mask is needed."""
    if k_lens is not None:
        assert all(int(n) == k.shape[1] for n in k_lens), "a padded key length"
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=softmax_scale
    )
    return out.transpose(1, 2).type(q.dtype)


class DistanceDraws:
    """`random.randint(4, 30)` of `_forward_inference`: seeded, recorded in call order."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.drawn: list[int] = []
        self.original = random.randint

    def __call__(self, a: int, b: int) -> int:
        if (a, b) != (4, 30):
            return self.original(a, b)
        d = self.rng.randint(a, b)
        self.drawn.append(d)
        return d


def import_model(repo: Path, dim: int):
    os.environ["ENABLE_COMPILE"] = "false"  # their inference_utils compiles by default
    sys.path.insert(0, str(repo))
    for name in PACKAGES:
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(repo.joinpath(*name.split(".")))]
        sys.modules[name] = pkg
    import importlib

    cm = importlib.import_module("liveavatar.models.wan.causal_model_s2v")
    base = importlib.import_module("liveavatar.models.wan.wan_2_2.modules.model")
    cm.attention = attention_stand_in
    base.flash_attention = attention_stand_in

    class TorchWithWidth(types.ModuleType):
        """`torch` as causal_model_s2v sees it: zeros([1, 5120, ...]) takes our width."""

        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def zeros(size, *a, **k):
            if isinstance(size, list) and len(size) == 5 and size[1] == 5120:
                size = [size[0], dim, *size[2:]]
            return torch.zeros(size, *a, **k)

    cm.torch = TorchWithWidth("torch")
    return cm


def build(cm, cfg: S2VConfig, state: dict):
    kwargs = dict(
        cond_dim=cfg.cond_dim,
        audio_dim=cfg.audio_dim,
        num_audio_token=cfg.num_audio_token,
        enable_adain=True,
        adain_mode="attn_norm",
        audio_inject_layers=list(cfg.audio_inject_layers),
        zero_init=True,
        zero_timestep=True,
        enable_motioner=False,
        add_last_motion=True,
        enable_tsm=False,
        trainable_token_pos_emb=False,
        enable_framepack=True,
        framepack_drop_mode="padd",
        model_type="s2v",
        patch_size=cfg.patch_size,
        text_len=cfg.text_len,
        in_dim=cfg.in_dim,
        dim=cfg.dim,
        ffn_dim=cfg.ffn_dim,
        freq_dim=cfg.freq_dim,
        text_dim=cfg.text_dim,
        out_dim=cfg.out_dim,
        num_heads=cfg.num_heads,
        num_layers=cfg.num_layers,
        eps=cfg.eps,
    )
    original_to = torch.Tensor.to

    def cpu_to(self, *a, **k):  # their __init__ ends in .to("cuda")
        if a and a[0] == "cuda":
            a = ("cpu", *a[1:])
        return original_to(self, *a, **k)

    torch.Tensor.to = cpu_to  # type: ignore[method-assign]
    try:
        model = cm.CausalWanModel_S2V(**kwargs)
    finally:
        torch.Tensor.to = original_to  # type: ignore[method-assign]
    model.load_state_dict(state, strict=True)  # the published names, every one
    return model.eval().requires_grad_(False), kwargs


def make_inputs(cfg: S2VConfig, hw, blocks: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed + 1)
    H, W = hw
    fpb = cfg.frames_per_block
    return {
        "prompt": torch.randn(1, PROMPT_TOKENS, cfg.text_dim, generator=g),
        "ref": torch.randn(1, cfg.in_dim, 1, H, W, generator=g),
        "motion": torch.randn(1, cfg.in_dim, cfg.motion_latent_frames, H, W, generator=g),
        "audio": torch.randn(1, cfg.audio_layers, cfg.audio_dim, 4 * fpb * blocks, generator=g),
        "noise": torch.randn(cfg.in_dim, fpb * blocks, H, W, generator=g),
    }


def stream(cm, model, cfg: S2VConfig, inputs: dict, blocks: int, steps: int, seed: int) -> dict:
    from diffusers import FlowMatchEulerDiscreteScheduler

    H, W = inputs["ref"].shape[-2:]
    fpb, n, k = cfg.frames_per_block, cfg.num_heads, cfg.head_dim
    fsl = (H // 2) * (W // 2)  # their frame_seq_length
    lat_motion = cfg.motion_latent_frames
    cache_tokens = cfg.window_frames * fsl  # their max_seq_len for infer_frames 48
    shared_cond = [
        {
            "cond_k": torch.zeros(1, 2800, n, k),  # their size
            "cond_v": torch.zeros(1, 2800, n, k),
            "cond_end": torch.tensor([0]),
        }
        for _ in range(cfg.num_layers)
    ]
    caches = {
        i: [
            {"k": torch.zeros(1, cache_tokens, n, k), "v": torch.zeros(1, cache_tokens, n, k)}
            | shared_cond[layer]
            for layer in range(cfg.num_layers)
        ]
        for i in range(1, steps + 1)
    }
    cross = [{"k": None, "v": None, "is_init": False} for _ in range(cfg.num_layers)]
    context = [inputs["prompt"][0]]
    cond = torch.zeros(1, cfg.cond_dim, fpb, H, W)  # COND[0] * 0: no pose video
    latents = inputs["noise"].clone()
    out: dict[str, torch.Tensor] = {}
    draws = DistanceDraws(seed + 7)
    random.randint = draws  # type: ignore[assignment]

    def args(b: int) -> dict:
        return {
            "context": context,
            "seq_len": None,
            "cond_states": cond,
            "motion_latents": inputs["motion"],
            "ref_latents": inputs["ref"],
            "audio_input": inputs["audio"][..., b * 4 * fpb : (b + 1) * 4 * fpb],
            "motion_frames": [cfg.motion_frames, lat_motion],
            "drop_motion_frames": False,
        }

    try:
        with torch.no_grad():
            for i in range(1, steps + 1):  # the sink, once into each step's cache
                model(
                    [latents[:, :fpb]],
                    t=torch.zeros(1, fpb),
                    **args(0),
                    sink_flag=True,
                    kv_cache=caches[i],
                    crossattn_cache=cross,
                    current_start=0,
                    current_end=fpb * fsl,
                )
            scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3)
            scheduler.set_timesteps(steps, device="cpu")
            timesteps, sigmas = scheduler.timesteps, scheduler.sigmas
            out["timesteps"], out["sigmas"] = timesteps.float(), sigmas.float()
            for b in range(blocks):
                scheduler.timesteps, scheduler.sigmas = timesteps, sigmas
                scheduler._step_index, scheduler._begin_index = 0, 0
                x = latents[:, b * fpb : (b + 1) * fpb]
                for i, t in enumerate(timesteps):
                    out[f"block{b}.step{i}.x"] = x.clone()
                    (v,) = model(
                        [x],
                        t=torch.tensor([t] * fpb).unsqueeze(0),
                        **args(b),
                        kv_cache=caches[i + 1],
                        crossattn_cache=cross,
                        current_start=b * fpb * fsl,
                        current_end=(b + 1) * fpb * fsl,
                        mask=None,
                    )
                    out[f"block{b}.step{i}.v"] = v.clone()
                    x = scheduler.step(v[None], t, x[None], return_dict=False)[0][0]
                out[f"block{b}.latents"] = x.clone()
    finally:
        random.randint = draws.original  # type: ignore[assignment]
    out["ref_distances"] = torch.tensor(draws.drawn, dtype=torch.int64)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reference-repo", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    p.add_argument("--blocks", type=int, default=5)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    torch.manual_seed(a.seed)
    out = Path(a.out)
    (out / "release").mkdir(parents=True, exist_ok=True)
    cfg, hw = SHAPES[a.shape]
    cm = import_model(Path(a.reference_repo).resolve(), cfg.dim)
    state = random_published_state(cfg, a.seed)
    model, kwargs = build(cm, cfg, state)
    inputs = make_inputs(cfg, hw, a.blocks, a.seed)
    results = stream(cm, model, cfg, inputs, a.blocks, a.steps, a.seed)
    from safetensors.torch import save_file

    save_file(state, str(out / "release" / "diffusion_pytorch_model.safetensors"))
    (out / "release" / "config.json").write_text(json.dumps(kwargs | {"motion_frames": 73}))
    meta = {
        "seed": a.seed,
        "blocks": a.blocks,
        "steps": a.steps,
        "shape": a.shape,
        "latent_hw": list(hw),
        "config": {k: v for k, v in dataclasses.asdict(cfg).items()},
    }
    tensors = {f"in.{k}": v for k, v in inputs.items()} | results
    save_file(
        {k: v.contiguous() for k, v in tensors.items()},
        str(out / "reference.safetensors"),
        metadata={"meta": json.dumps(meta)},
    )
    print(
        f"reference: {len(tensors)} tensors, {a.blocks} blocks x {a.steps} steps, "
        f"distances {results['ref_distances'].tolist()} → {out / 'reference.safetensors'}"
    )


if __name__ == "__main__":
    main()
