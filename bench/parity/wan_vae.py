"""Parity of `pipeline.models.wan.vae` with the authors' Wan 2.1 VAE on the same random weights.

Imports `flash_head/wan/modules/vae.py` from a checkout of SoulX-FlashHead at run time (their
code stays outside the project), builds their `WanVAE_` at the chosen sizes, gives every
parameter a fresh random value (`random_tensor`: norm gains near 1, small biases, no zero or
one paths), saves it as a `.pth` in the published layout, loads that file with
`load_wan_vae`, and compares on the same random inputs:

- encode of 1 + 4k-frame clips (their `WanVAE.encode`, normalised latents);
- decode of whole chunks of latent frames (their `WanVAE.decode`, clamped pixels);
- our streamed decode, fed in pieces (`--split`), against their whole decode.

It prints cosine similarity and max-abs error per comparison (target: fp32 cos >= 0.9999) and
the seconds each side took. `--write-fixture PATH` also stores the tiny case's seed, inputs
and the authors' outputs for tests/test_wan_vae.py.

    python bench/parity/wan_vae.py --reference-repo /work/scratch/flashhead-ref --shape tiny
    python bench/parity/wan_vae.py --reference-repo ... --shape full --encode-frames 5 \
        --decode-latents 3 --split 2,1 --json bench/results/wan_vae_parity_full.json
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import logging
import sys
import tempfile
import time
import types
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pipeline.models.wan.vae import (  # noqa: E402
    WAN21_VAE,
    WAN21_VAE_TINY,
    WanVAE,
    WanVAEConfig,
    load_wan_vae,
    random_tensor,
)

SHAPES = {"tiny": (WAN21_VAE_TINY, (32, 48)), "full": (WAN21_VAE, (512, 512))}
DEFAULTS = {  # shape → (encode clip lengths, decode chunk lengths, stream split)
    "tiny": ("5,33", "2,9", "2,3,4"),
    "full": ("5", "3", "2,1"),
}
# the fixture's case: a few hundred kB, and a test that replays it in seconds on a CPU
FIXTURE_SIZE, FIXTURE_CASES = (16, 24), ("5,9", "2,4", "")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def import_reference(repo: Path) -> types.ModuleType:
    """The authors' vae module, loaded from its file (their package __init__ pulls in the
    whole model). loguru only logs there: a stand-in is injected when it is not installed."""
    if importlib.util.find_spec("loguru") is None:
        sys.modules["loguru"] = types.SimpleNamespace(logger=logging.getLogger("flashhead"))  # type: ignore[assignment]
    path = repo / "flash_head" / "wan" / "modules" / "vae.py"
    if not path.is_file():
        sys.exit(f"no {path}: --reference-repo must be a SoulX-FlashHead checkout")
    spec = importlib.util.spec_from_file_location("flashhead_reference_wan_vae", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ModuleNotFoundError as exc:
        sys.exit(f"the authors' vae.py needs {exc.name!r}: pip install {exc.name}")
    return module


def write_reference_checkpoint(ref: types.ModuleType, config: WanVAEConfig, seed: int, out: Path):
    """Their WanVAE_ with every parameter re-randomised, saved as the published .pth."""
    model = ref.WanVAE_(
        dim=config.base_dim,
        z_dim=config.z_dim,
        dim_mult=list(config.dim_mult),
        num_res_blocks=config.num_res_blocks,
        attn_scales=[],
        temperal_downsample=list(config.temporal_downsample),
    )
    state = model.state_dict()
    for name, value in state.items():
        value.copy_(random_tensor(name, tuple(value.shape), seed))
    torch.save(state, out)
    return state


def reference_wrapper(ref: types.ModuleType, config: WanVAEConfig, pth: Path, device, dtype):
    """Their `WanVAE` (normalisation, clamp) around the saved weights; their loader is bound
    to the published sizes, so the config's sizes are passed through to it."""
    sizes = dict(dim=config.base_dim, dim_mult=list(config.dim_mult))
    sizes |= dict(num_res_blocks=config.num_res_blocks)
    sizes |= dict(temperal_downsample=list(config.temporal_downsample))
    original = ref._video_vae
    ref._video_vae = functools.partial(original, **sizes)
    try:
        return ref.WanVAE(z_dim=config.z_dim, vae_path=str(pth), dtype=dtype, device=device)
    finally:
        ref._video_vae = original


def compare(ours: torch.Tensor, theirs: torch.Tensor) -> dict:
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    a, b = ours.double().flatten(), theirs.double().flatten()
    return {
        "cos": F.cosine_similarity(a, b, dim=0).item(),
        "max_abs": (a - b).abs().max().item(),
        "ref_std": b.std().item(),
        "shape": list(ours.shape),
    }


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    if out.is_cuda:
        torch.cuda.synchronize()  # the work is queued: the clock stops when it is done
    return out, time.perf_counter() - t0


def make_inputs(config: WanVAEConfig, size, encode_frames, decode_latents, seed: int):
    """Videos in [-1, 1] (values exact in fp16, so a fixture can store them at half size)
    and normalised latents ~ N(0, 1)."""
    gen = torch.Generator().manual_seed(seed + 1)
    H, W = size
    h, w = H // config.spatial_ratio, W // config.spatial_ratio
    videos = {
        f: (torch.rand(1, 3, f, H, W, generator=gen) * 2 - 1).half().float() for f in encode_frames
    }
    latents = {t: torch.randn(1, config.z_dim, t, h, w, generator=gen) for t in decode_latents}
    return videos, latents


def run_case(name: str, ours_fn, theirs_fn, truth_fn, results: dict) -> torch.Tensor:
    """One comparison of ours with theirs at the same dtype; with `truth_fn` (their fp32
    model, when the run is in bf16) also both against fp32. Returns their output."""
    ref, t_ref = timed(theirs_fn)
    got, t_got = timed(ours_fn)
    r = compare(got.float(), ref.float()) | {"s_ref": t_ref, "s_ours": t_got}
    if truth_fn is not None:
        truth = truth_fn().float()
        r["ours_vs_fp32"] = compare(got.float(), truth)
        r["theirs_vs_fp32"] = compare(ref.float(), truth)
    results[name] = r
    print_result(name, r)
    return ref


@torch.inference_mode()
def run_cases(theirs, ours: WanVAE, truth, inputs, split, device, dtype) -> tuple[dict, dict]:
    """Every comparison; returns the results and the authors' outputs (fp32, on the CPU)."""
    videos, latents = inputs
    results, outputs = {}, {}
    for f, video in videos.items():
        v = video.to(device, dtype)
        fns = (lambda v=v: ours.encode(v)[0], lambda v=v: theirs.encode(v))
        truth_fn = None if truth is None else lambda v=video: truth.encode(v.to(device))
        ref = run_case(f"encode_{f}", *fns, truth_fn, results)
        outputs[f"encode_{f}"] = ref.float().cpu()[None]
    for t, lat in latents.items():
        z = lat.to(device, dtype)
        fns = (lambda z=z: ours.decode(z), lambda z=z: theirs.decode(z[0]))
        truth_fn = None if truth is None else lambda lat=lat: truth.decode(lat[0].to(device))
        ref = run_case(f"decode_{t}", *fns, truth_fn, results)
        results[f"decode_{t}"]["clamped_share"] = (ref.abs() == 1).float().mean().item()
        outputs[f"decode_{t}"] = ref.float().cpu()
    if split:
        t = sum(split)
        assert t in latents, f"--split must add up to one of --decode-latents, not {t}"
        z = latents[t].to(device, dtype)
        stream, pieces, lo = ours.stream(), [], 0
        t0 = time.perf_counter()
        for n in split:
            pieces.append(stream.decode(z[:, :, lo : lo + n]))
            lo += n
        got = torch.cat(pieces, dim=2)
        key = "stream_" + "+".join(map(str, split))
        results[key] = compare(got.float(), outputs[f"decode_{t}"].to(got.device))
        results[key] |= {"s_ours": time.perf_counter() - t0}
        print_result(key, results[key])
    return results, outputs


def fingerprint(state: dict[str, torch.Tensor]) -> torch.Tensor:
    """(keys, 2): each weight's sum and first value, keys sorted: a test rebuilding the
    weights from the seed checks it got the same ones before comparing outputs."""
    return torch.tensor(
        [[state[k].sum().item(), state[k].flatten()[0].item()] for k in sorted(state)]
    )


def write_fixture(path: Path, state, seed: int, size, videos, latents, outputs) -> None:
    tensors = {"weights.fingerprint": fingerprint(state)}
    tensors |= {f"encode_{f}.video": v.half() for f, v in videos.items()}
    tensors |= {f"decode_{t}.latents": z for t, z in latents.items()}
    tensors |= {f"{k}.reference": v.contiguous() for k, v in outputs.items()}
    meta = {
        "config": "WAN21_VAE_TINY",
        "seed": str(seed),
        "size": f"{size[0]}x{size[1]}",
        "weights": "pipeline.models.wan.vae.random_checkpoint(config, seed)",
        "reference": "SoulX-FlashHead flash_head/wan/modules/vae.py WanVAE.encode/decode, fp32 CPU",
        "written_by": "bench/parity/wan_vae.py --write-fixture",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata=meta)
    print(f"fixture: {path} ({path.stat().st_size / 1024:.0f} kB)")


def print_result(name: str, r: dict) -> None:
    secs = f"ours {r['s_ours']:.2f} s"
    if "s_ref" in r:
        secs += f", theirs {r['s_ref']:.2f} s"
    print(
        f"  {name:<16} cos {r['cos']:.7f}  max-abs {r['max_abs']:.2e}  "
        f"ref-std {r['ref_std']:.3f}  {tuple(r['shape'])}  {secs}",
        flush=True,
    )
    for side in ("ours", "theirs"):
        if f"{side}_vs_fp32" in r:
            v = r[f"{side}_vs_fp32"]
            print(f"    {side:>6} vs fp32: cos {v['cos']:.7f}  max-abs {v['max_abs']:.2e}")


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def parse_args() -> tuple[argparse.Namespace, WanVAEConfig, tuple[int, int], list, list, list]:
    """The options, and the case they name: config, pixel size, clips, chunks, split."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reference-repo", type=Path, required=True)
    p.add_argument("--shape", choices=SHAPES, default="tiny")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="float32", choices=DTYPES)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--size", help="HxW pixels (default: 32x48 tiny, 512x512 full)")
    p.add_argument("--encode-frames", help="clip lengths to encode, 1 + 4k each")
    p.add_argument("--decode-latents", help="chunk lengths (latent frames) to decode")
    p.add_argument("--split", help="stream the longest chunk in these pieces")
    p.add_argument("--vs-fp32", action="store_true", help="in bf16, also both against fp32")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave)")
    p.add_argument("--json", type=Path)
    p.add_argument("--write-fixture", type=Path, help="tiny case at 16x24 → a test fixture")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.write_fixture and (args.shape != "tiny" or args.dtype != "float32"):
        p.error("--write-fixture is the tiny fp32 case on the CPU")
    config, size = SHAPES[args.shape]
    if args.write_fixture:
        size = FIXTURE_SIZE
    if args.size:
        size = tuple(int(x) for x in args.size.split("x"))
    enc, dec, split = FIXTURE_CASES if args.write_fixture else DEFAULTS[args.shape]
    enc, dec = ints(args.encode_frames or enc), ints(args.decode_latents or dec)
    split = ints(args.split if args.split is not None else split)
    return args, config, size, enc, dec, split


def main() -> None:
    args, config, size, enc, dec, split = parse_args()
    dtype = DTYPES[args.dtype]

    ref = import_reference(args.reference_repo)
    with tempfile.TemporaryDirectory() as tmp:
        pth = Path(tmp) / "Wan2.1_VAE.pth"
        state = write_reference_checkpoint(ref, config, args.seed, pth)
        theirs = reference_wrapper(ref, config, pth, args.device, dtype)
        ours = load_wan_vae(pth, args.device, dtype, config)
        truth = None
        if args.vs_fp32 and dtype != torch.float32:
            truth = reference_wrapper(ref, config, pth, args.device, torch.float32)
    n_keys, n_params = len(state), sum(v.numel() for v in state.values())
    print(
        f"Wan 2.1 VAE parity: {args.shape} {size[0]}x{size[1]}, {args.dtype}, {args.device}, "
        f"{n_keys} keys / {n_params / 1e6:.2f} M params",
        flush=True,
    )
    videos, latents = make_inputs(config, size, enc, dec, args.seed)
    inputs = (videos, latents)
    results, outputs = run_cases(theirs, ours, truth, inputs, split, args.device, dtype)
    report = {
        "shape": args.shape,
        "size": list(size),
        "dtype": args.dtype,
        "device": args.device,
        "threads": torch.get_num_threads(),
        "seed": args.seed,
        "keys": n_keys,
        "params": n_params,
        "torch": torch.__version__,
        "results": results,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    if args.write_fixture:
        write_fixture(args.write_fixture, state, args.seed, size, videos, latents, outputs)


if __name__ == "__main__":
    main()
