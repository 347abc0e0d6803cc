"""Run the LiveAvatar authors' transformer and streaming loop on random weights; keep what
it computes.

    PYTHONPATH=/path/to/refsite python bench/parity/liveavatar_reference.py \
        --reference-repo PATH --out DIR [--shape tiny|mid|full] [--blocks 5] [--steps 4]
        [--seed 0] [--device cpu|cuda] [--dtype float32|bfloat16]
        [--attention auto|stand-in|theirs] [--compile]

PATH is a checkout of github.com/Alibaba-Quark/LiveAvatar; nothing of it is copied into
Facecast: it is imported from PATH, in its own process, with diffusers 0.35, einops and
easydict on the path (refsite), and stand-ins for what a CPU run does not have:
- the packages' `__init__` files (they import the T5, VAE, decord, ...) are skipped: each
  package is registered empty and only the modules the transformer needs are loaded;
- flash-attention / cuDNN attention → a scaled_dot_product_attention stand-in (their kernels
  take bf16 only). `--attention theirs` (the default on a GPU in bf16) keeps their
  self-attention's cuDNN kernel (`attention`, `torch.ops.aten._scaled_dot_product_cudnn_
  attention`) and replaces only `flash_attention` (the text cross-attention's; the
  flash-attn package is not installed); in fp32 both are the stand-in (neither kernel takes
  fp32), with TF32 off;
- `CausalWanModel_S2V.__init__` moves its RoPE table `.to("cuda")`: kept on the CPU when
  the run is on the CPU;
- `_forward_sink` builds its empty noisy tensor with a hard-coded width of 5120: the
  model's width here;
- `_forward_inference` draws the reference's RoPE distance with `random.randint(4, 30)` on
  every call: drawn from a seeded generator and recorded, so Facecast can be given the same.

The loop is `WanS2V.generate` (causal_s2v_pipeline.py) reduced to the transformer: one KV
cache per sampling step (their `kv_cache1["1".."4"]`) sharing one sink cache, the sink
prefilled once per cache (`sink_flag=True`), then per block of 3 latent frames the Euler
scheduler's 4 steps (`FlowMatchEulerDiscreteScheduler(shift=3)`), step i on cache i, the
block's audio `audio_input[..., 12b:12b+12]`, the pose latents zero.

In bf16 it runs as their pipeline does: parameters, latents, caches and conditions in bf16
under `torch.amp.autocast("cuda", bfloat16)`, the scheduler's step upcasting.

Writes, under DIR: `release/config.json`; on the CPU also
`release/diffusion_pytorch_model.safetensors` (the random weights, as `save_pretrained`
would name them). On a GPU the weights are drawn there, tensor by tensor into the model,
from a seeded CUDA generator (`s2v_weights.random_published_tensors`) and not written: the
14B is 66 GB in fp32; the compare script draws the same ones on the same GPU and checks the
per-tensor fingerprint (`weights.fingerprint`: each tensor's sum and absolute sum) saved
here. `reference.safetensors` holds the inputs (fp32, drawn on the CPU), timesteps,
sigmas, the recorded distances, every step's input and velocity, every block's final
latents (in fp32), with the run's settings in its metadata; on a GPU `timing.json` has
the wall time of the sink prefill and of each block (4 steps + scheduler, synchronised),
and the frames per second that makes (12 video frames a block).

Memory at `--shape full` (d 5120, 40 layers, 704x384 → latents 88x48; 16.3 B parameters):
weights 65 GB in fp32 / 33 GB in bf16; their caches: each step's 12-frame window (12672
tokens, 40 layers) 21 GB in fp32 / 10 GB in bf16, plus one shared 2800-token cond cache (4.6 /
2.3 GB); Facecast's (compare) 27 / 13 GB a step. fp32 fits an H200 (139 GiB) with `--steps
2` (about 120 GB on either side), bf16 with the release's 4 (about 85 GB).
`bench/parity/liveavatar_compare.py` loads the same files through Facecast and compares.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import sys
import time
import types
from pathlib import Path

import torch
import torch.nn.functional as F

FACECAST = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(FACECAST))

from pipeline.liveavatar.s2v_weights import (  # noqa: E402
    random_published_state,
    random_published_tensors,
)
from pipeline.models.wan.s2v import S2VConfig  # noqa: E402

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
    # the release: 704x384 video (H x W) → 88x48 latents
    "full": (S2VConfig(), (88, 48)),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
FRAMES_PER_BLOCK = 12  # video frames a block of 3 latent frames decodes to
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


def cudnn_attention_runs(dtype: torch.dtype) -> bool:
    """Whether their self-attention kernel (cuDNN SDPA) runs here: a GPU, bf16, this torch."""
    if dtype != torch.bfloat16 or not torch.cuda.is_available():
        return False
    q = torch.randn(1, 2, 64, 128, device="cuda", dtype=dtype)
    try:
        torch.ops.aten._scaled_dot_product_cudnn_attention(q, q, q, None, True, 0.0, False)
    except Exception as e:  # noqa: BLE001 - any failure means: not here
        print(f"cuDNN attention does not run here ({type(e).__name__}: {e}); stand-in")
        return False
    return True


def import_model(repo: Path, dim: int, keep_cudnn: bool = False, compile_: bool = False):
    """Their modules, loaded from `repo`; `keep_cudnn`: their self-attention kernel stays
    (else the stand-in); `flash_attention` is always the stand-in unless flash-attn is
    importable; `compile_`: their `conditional_compile` compiles (their default)."""
    # their inference_utils compiles by default
    os.environ["ENABLE_COMPILE"] = "true" if compile_ else "false"
    sys.path.insert(0, str(repo))
    for name in PACKAGES:
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(repo.joinpath(*name.split(".")))]
        sys.modules[name] = pkg
    import importlib

    cm = importlib.import_module("liveavatar.models.wan.causal_model_s2v")
    base = importlib.import_module("liveavatar.models.wan.wan_2_2.modules.model")
    attn = importlib.import_module("liveavatar.models.wan.wan_2_2.modules.attention")
    if not keep_cudnn:
        cm.attention = attention_stand_in
    if not (attn.FLASH_ATTN_2_AVAILABLE or attn.FLASH_ATTN_3_AVAILABLE) or not keep_cudnn:
        cm.flash_attention = attention_stand_in
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


def build(cm, cfg: S2VConfig, state: dict | None, device: str, dtype: torch.dtype, seed: int):
    """Their model with the random weights: `state` (drawn on the CPU) loaded, or with none
    given the weights drawn on `device` into it tensor by tensor; returns the model, the
    constructor's arguments and the fingerprint of what was loaded."""
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
    if device == "cpu":
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
    else:
        with torch.device(device):  # built (and their init run) on the GPU, then cast
            model = cm.CausalWanModel_S2V(**kwargs)
    model.to(dtype)  # parameter by parameter: the fp32 copy is never there twice
    if state is not None:
        model.load_state_dict(state, strict=True)  # the published names, every one
        tensors = sorted(state.items())
    else:
        tensors = random_published_tensors(cfg, seed, dtype, device)
    own = model.state_dict(keep_vars=True)
    prints, filled = [], set()
    with torch.no_grad():
        for name, t in tensors:
            if state is None:
                own[name].copy_(t)  # KeyError / shape error: a name that is not theirs
            filled.add(name)
            prints.append(fingerprint(t))
    assert filled == set(own), f"not filled: {sorted(set(own) - filled)[:3]}"
    return model.eval().requires_grad_(False), kwargs, torch.tensor(prints, dtype=torch.float64)


def fingerprint(t: torch.Tensor) -> tuple[float, float]:
    """A tensor's sum and absolute sum in fp64: equal draws give equal prints."""
    d = t.double()
    return d.sum().item(), d.abs().sum().item()


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


def stream(
    cm,
    model,
    cfg: S2VConfig,
    inputs: dict,
    blocks: int,
    steps: int,
    seed: int,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> tuple[dict, dict]:
    """(what it computed, on the CPU in fp32; wall times in ms: 'prefill', 'blocks')."""
    import contextlib

    from diffusers import FlowMatchEulerDiscreteScheduler

    dev = torch.device(device)
    inputs = {k: v.to(dev, dtype) for k, v in inputs.items()}
    # their pipeline's autocast: their fp32 regions (`torch.cuda.amp.autocast(float32)`)
    # need CUDA's, which takes fp32 as a target (the CPU's does not: no bf16 on the CPU)
    autocast = (
        torch.amp.autocast("cuda", dtype=dtype)
        if dtype != torch.float32
        else contextlib.nullcontext()
    )

    def sync() -> float:
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    def keep(t: torch.Tensor) -> torch.Tensor:
        return t.detach().float().cpu()

    H, W = inputs["ref"].shape[-2:]
    fpb, n, k = cfg.frames_per_block, cfg.num_heads, cfg.head_dim
    fsl = (H // 2) * (W // 2)  # their frame_seq_length
    lat_motion = cfg.motion_latent_frames
    cache_tokens = cfg.window_frames * fsl  # their max_seq_len for infer_frames 48
    shared_cond = [
        {
            "cond_k": torch.zeros(1, 2800, n, k, device=dev, dtype=dtype),  # their size
            "cond_v": torch.zeros(1, 2800, n, k, device=dev, dtype=dtype),
            "cond_end": torch.tensor([0], device=dev),
        }
        for _ in range(cfg.num_layers)
    ]
    caches = {
        i: [
            {
                "k": torch.zeros(1, cache_tokens, n, k, device=dev, dtype=dtype),
                "v": torch.zeros(1, cache_tokens, n, k, device=dev, dtype=dtype),
            }
            | shared_cond[layer]
            for layer in range(cfg.num_layers)
        ]
        for i in range(1, steps + 1)
    }
    cross = [{"k": None, "v": None, "is_init": False} for _ in range(cfg.num_layers)]
    context = [inputs["prompt"][0]]
    cond = torch.zeros(1, cfg.cond_dim, fpb, H, W, device=dev, dtype=dtype)  # COND[0] * 0
    latents = inputs["noise"].clone()
    out: dict[str, torch.Tensor] = {}
    times: dict = {"blocks": []}
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
        with torch.no_grad(), autocast:
            t0 = sync()
            for i in range(1, steps + 1):  # the sink, once into each step's cache
                model(
                    [latents[:, :fpb]],
                    t=torch.zeros(1, fpb, device=dev, dtype=dtype),
                    **args(0),
                    sink_flag=True,
                    kv_cache=caches[i],
                    crossattn_cache=cross,
                    current_start=0,
                    current_end=fpb * fsl,
                )
            times["prefill"] = (sync() - t0) * 1e3
            scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3)
            scheduler.set_timesteps(steps, device=dev)
            timesteps, sigmas = scheduler.timesteps, scheduler.sigmas
            out["timesteps"], out["sigmas"] = keep(timesteps), keep(sigmas)
            for b in range(blocks):
                t0 = sync()
                scheduler.timesteps, scheduler.sigmas = timesteps, sigmas
                scheduler._step_index, scheduler._begin_index = 0, 0
                x = latents[:, b * fpb : (b + 1) * fpb]
                for i, t in enumerate(timesteps):
                    out[f"block{b}.step{i}.x"] = keep(x)
                    (v,) = model(
                        [x],
                        t=torch.tensor([t] * fpb).to(dev).unsqueeze(0),  # as theirs
                        **args(b),
                        kv_cache=caches[i + 1],
                        crossattn_cache=cross,
                        current_start=b * fpb * fsl,
                        current_end=(b + 1) * fpb * fsl,
                        mask=None,
                    )
                    out[f"block{b}.step{i}.v"] = keep(v)
                    x = scheduler.step(v[None], t, x[None], return_dict=False)[0][0]
                out[f"block{b}.latents"] = keep(x)
                times["blocks"].append((sync() - t0) * 1e3)
    finally:
        random.randint = draws.original  # type: ignore[assignment]
    out["ref_distances"] = torch.tensor(draws.drawn, dtype=torch.int64)
    return out, times


def steady_blocks(block_ms: list[float]) -> list[float]:
    """The blocks that attend to a full window (the 4th on: 4 slots of 3 latent frames) and
    are not the first (warm-up); all but the first when there are too few."""
    return block_ms[STEADY_FROM:] or block_ms[1:] or block_ms


STEADY_FROM = 3


def timing_report(times: dict, **extra) -> dict:
    """Per-block wall times → the median of the steady blocks, and the fps it makes."""
    block_ms = statistics.median(steady_blocks(times["blocks"]))
    return extra | {
        "prefill_ms": times["prefill"],
        "block_ms": times["blocks"],
        "block_ms_median": block_ms,
        "median_of": f"blocks {STEADY_FROM}.. (the key window full)",
        "video_frames_per_block": FRAMES_PER_BLOCK,
        "fps": FRAMES_PER_BLOCK / (block_ms / 1e3),
        "peak_gb": torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reference-repo", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    p.add_argument("--blocks", type=int, default=5)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument(
        "--attention",
        choices=["auto", "stand-in", "theirs"],
        default="auto",
        help="auto: their cuDNN self-attention where it runs (GPU, bf16), else the stand-in",
    )
    p.add_argument("--compile", action="store_true", help="their torch.compile (for timing)")
    p.add_argument(
        "--weights",
        choices=["auto", "write", "draw"],
        default="auto",
        help="write: drawn on the CPU and saved under release/ (auto on the CPU); draw: "
        "drawn on the device, not saved, drawn again by the compare (auto on a GPU)",
    )
    a = p.parse_args()
    dtype = DTYPES[a.dtype]
    if a.device == "cpu" and dtype != torch.float32:
        p.error("bf16 needs --device cuda: their fp32 regions need CUDA's autocast")
    write = a.weights == "write" or (a.weights == "auto" and a.device == "cpu")
    if a.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32
        torch.backends.cudnn.allow_tf32 = False
    if a.attention == "theirs" and not cudnn_attention_runs(dtype):
        p.error("their cuDNN attention needs a GPU and bf16")
    keep_cudnn = a.attention == "theirs" or (a.attention == "auto" and cudnn_attention_runs(dtype))
    attention = "theirs (cuDNN self-attn; cross-attn stand-in)" if keep_cudnn else "stand-in"
    torch.manual_seed(a.seed)
    out = Path(a.out)
    (out / "release").mkdir(parents=True, exist_ok=True)
    cfg, hw = SHAPES[a.shape]
    cm = import_model(Path(a.reference_repo).resolve(), cfg.dim, keep_cudnn, a.compile)
    state = random_published_state(cfg, a.seed) if write else None
    t0 = time.perf_counter()
    model, kwargs, prints = build(cm, cfg, state, a.device, dtype, a.seed)
    print(
        f"built their model ({a.shape}, {a.dtype}, {a.device}) in {time.perf_counter() - t0:.0f} s"
    )
    inputs = make_inputs(cfg, hw, a.blocks, a.seed)
    results, times = stream(cm, model, cfg, inputs, a.blocks, a.steps, a.seed, a.device, dtype)
    from safetensors.torch import save_file

    if state is not None:
        save_file(state, str(out / "release" / "diffusion_pytorch_model.safetensors"))
    (out / "release" / "config.json").write_text(json.dumps(kwargs | {"motion_frames": 73}))
    meta = {
        "seed": a.seed,
        "blocks": a.blocks,
        "steps": a.steps,
        "shape": a.shape,
        "latent_hw": list(hw),
        "config": {k: v for k, v in dataclasses.asdict(cfg).items()},
        "device": a.device,
        "dtype": a.dtype,
        "attention": attention,
        "compile": a.compile,
        "weights": "release/" if state is not None else f"drawn on {a.device} from the seed",
    }
    tensors = {f"in.{k}": v for k, v in inputs.items()} | results
    tensors["weights.fingerprint"] = prints
    save_file(
        {k: v.contiguous() for k, v in tensors.items()},
        str(out / "reference.safetensors"),
        metadata={"meta": json.dumps(meta)},
    )
    timing = timing_report(times, side="authors", **{k: meta[k] for k in TIMING_KEYS})
    if a.device == "cuda":
        timing["gpu"] = torch.cuda.get_device_name()
        (out / "timing.json").write_text(json.dumps(timing, indent=1))
    print(
        f"reference: {len(tensors)} tensors, {a.blocks} blocks x {a.steps} steps, "
        f"distances {results['ref_distances'].tolist()}, attention {attention}; "
        f"prefill {timing['prefill_ms']:.0f} ms, block {timing['block_ms_median']:.0f} ms "
        f"(median, full window) = {timing['fps']:.2f} fps → {out / 'reference.safetensors'}"
    )


TIMING_KEYS = ("shape", "dtype", "device", "blocks", "steps", "attention", "compile")


if __name__ == "__main__":
    main()
