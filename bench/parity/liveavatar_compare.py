"""Compare Facecast's S2V transformer with the LiveAvatar authors' on the same random weights.

    python bench/parity/liveavatar_compare.py --reference-out DIR [--json OUT]
        [--write-fixture PATH] [--device cpu|cuda]

DIR is what `bench/parity/liveavatar_reference.py` wrote. Facecast loads the release's
safetensors through its mapping (`s2v_weights.load_published`), then runs the same stream:
prefill (prompt + sink), and per block the audio encoding and the 4 Euler steps, each step
on its own cache, each forward given the reference distance the authors' run drew. It
prints, per comparison, the cosine similarity and the largest absolute difference: block
0's first forward alone, then every step's velocity and every block's final latents of the
free-running stream (Facecast's own latents feed its next step and block).
`--write-fixture` keeps the inputs and the authors' outputs for the tests
(tests/fixtures/liveavatar/); the weights are re-made there from the seed.

The run's dtype is the reference run's (`meta['dtype']`); in bf16 Facecast runs as its
engine does (weights, latents and cache in bf16, the Euler step in fp32, rounded back).
Where the reference drew its weights on the GPU (nothing under release/ but config.json)
they are drawn again here, on the same device from the same seed, straight into the model
(`s2v_weights.load_published_streamed`), and their fingerprint must equal the reference's
before anything is compared. On a GPU each block's wall time is kept, and the JSON has
Facecast's timing next to the authors' (their `timing.json`): same weights, same loop.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pipeline.liveavatar.s2v_weights import (  # noqa: E402
    load_published,
    load_published_streamed,
    random_published_tensors,
)
from pipeline.models.wan.s2v import S2VConfig, S2VTransformer  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
FRAMES_PER_BLOCK = 12  # video frames a block of 3 latent frames decodes to


def compare(a: torch.Tensor, b: torch.Tensor) -> dict:
    a, b = a.double().flatten(), b.double().flatten()
    return {
        "cos": torch.nn.functional.cosine_similarity(a, b, dim=0).item(),
        "max_abs": (a - b).abs().max().item(),
        "ref_abs_max": b.abs().max().item(),
    }


def run_stream(
    model: S2VTransformer,
    ins: dict[str, torch.Tensor],
    timesteps: torch.Tensor,
    sigmas: torch.Tensor,
    distances: list[int],
    blocks: int,
    keep_steps: bool = True,
    times: dict | None = None,
) -> dict[str, torch.Tensor]:
    """The authors' streaming loop in Facecast's API: what a caller does per block, on the
    model's device and in its dtype (returned on the CPU in fp32). `times`, if given,
    receives the wall time in ms of the prefill and of each block (synchronised)."""
    cfg = model.cfg
    dev, dtype = model.patch_embedding.weight.device, model.patch_embedding.weight.dtype
    steps, fpb = len(sigmas) - 1, cfg.frames_per_block
    ins = {k: v.to(dev, dtype) for k, v in ins.items()}
    timesteps = timesteps.to(dev)
    H, W = ins["ref"].shape[-2:]

    def sync() -> float:
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    t0 = sync()
    cache = model.new_cache(1, (H, W), steps, dev, dtype)
    model.prefill(cache, ins["prompt"], ins["ref"], ins["motion"])
    if times is not None:
        times["prefill"], times["blocks"] = (sync() - t0) * 1e3, []
    out: dict[str, torch.Tensor] = {}
    draw = iter(distances)
    for b in range(blocks):
        t0 = sync()
        audio = model.encode_audio(ins["audio"][..., b * 4 * fpb : (b + 1) * 4 * fpb])
        x = ins["noise"][None, :, b * fpb : (b + 1) * fpb]
        for i in range(steps):
            s, s_next = sigmas[i], sigmas[i + 1]
            t = timesteps[i : i + 1]
            v = model.forward_block(x, t, audio, cache, i, ref_distance=next(draw))
            if keep_steps:
                out[f"block{b}.step{i}.v"] = v[0].float().cpu()
            # diffusers' Euler step, in fp32 (rounded back to the model's dtype: the engine's)
            x = (x.float() + (s_next - s) * v.float()).to(dtype)
        cache.advance()
        out[f"block{b}.latents"] = x[0].float().cpu()
        if times is not None:
            times["blocks"].append((sync() - t0) * 1e3)
    return out


def fingerprinted(tensors, prints: list):
    for name, t in tensors:
        d = t.double()
        prints.append((d.sum().item(), d.abs().sum().item()))
        yield name, t


def load(out: Path, device: str, dtype_name: str | None) -> tuple[S2VTransformer, dict, dict]:
    with safe_open(str(out / "reference.safetensors"), "pt") as f:
        meta = json.loads(f.metadata()["meta"])
    ref = load_file(str(out / "reference.safetensors"))
    raw = json.loads((out / "release" / "config.json").read_text())
    cfg = S2VConfig.from_release(raw)
    dtype = DTYPES[dtype_name or meta.get("dtype", "float32")]
    weights = out / "release" / "diffusion_pytorch_model.safetensors"
    if weights.exists():  # drawn on the CPU and written by the reference run
        model = S2VTransformer(cfg)
        load_published(model, load_file(str(weights)), weights)
        model.to(device, dtype)
    else:  # drawn on the device there: again here, the same draws straight into the model
        if device != meta["device"] or dtype != DTYPES[meta["dtype"]]:
            raise SystemExit(
                f"the weights were drawn on {meta['device']} in {meta['dtype']}: compare there, so"
            )
        with torch.device("meta"):
            model = S2VTransformer(cfg)
        model.to(dtype=dtype).to_empty(device=device)
        prints: list = []
        t0 = time.perf_counter()
        tensors = random_published_tensors(cfg, meta["seed"], dtype, device)
        load_published_streamed(model, fingerprinted(tensors, prints), "drawn")
        theirs = ref["weights.fingerprint"]
        mine = torch.tensor(prints, dtype=torch.float64)
        if mine.shape != theirs.shape or not torch.allclose(mine, theirs, rtol=1e-12, atol=0):
            raise SystemExit("the weights drawn here differ from the reference run's")
        print(f"weights drawn on {device} in {time.perf_counter() - t0:.0f} s, fingerprint equal")
    return model.eval().requires_grad_(False), ref, meta


def run(args) -> dict:
    out = Path(args.reference_out)
    with safe_open(str(out / "reference.safetensors"), "pt") as f:
        device = args.device or json.loads(f.metadata()["meta"]).get("device", "cpu")
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32
        torch.backends.cudnn.allow_tf32 = False
    model, ref, meta = load(out, device, args.dtype)
    ins = {k[3:]: v for k, v in ref.items() if k.startswith("in.")}
    distances = ref["ref_distances"].tolist()
    rows: dict[str, dict] = {}
    times: dict = {}
    with torch.no_grad():
        mine = run_stream(
            model, ins, ref["timesteps"], ref["sigmas"], distances, meta["blocks"], times=times
        )
    steps = meta.get("steps", 4)
    rows["block 0 step 0 (one forward)"] = compare(mine["block0.step0.v"], ref["block0.step0.v"])
    for b in range(meta["blocks"]):
        worst = min(
            (
                compare(mine[f"block{b}.step{i}.v"], ref[f"block{b}.step{i}.v"])
                for i in range(steps)
            ),
            key=lambda r: r["cos"],
        )
        rows[f"block {b} velocities (worst step)"] = worst
        rows[f"block {b} latents"] = compare(mine[f"block{b}.latents"], ref[f"block{b}.latents"])
    for name, r in rows.items():
        print(
            f"{name:34s} cos {r['cos']:.8f}  max|diff| {r['max_abs']:.3e}"
            f"  (max|ref| {r['ref_abs_max']:.2f})"
        )
    result = {"meta": meta, "facecast_dtype": args.dtype or meta.get("dtype"), "rows": rows}
    if device == "cuda":
        block_ms = statistics.median(times["blocks"][3:] or times["blocks"][1:] or times["blocks"])
        result["timing"] = {
            "side": "facecast",
            "prefill_ms": times["prefill"],
            "block_ms": times["blocks"],
            "block_ms_median": block_ms,
            "median_of": "blocks 3.. (the key window full)",
            "fps": FRAMES_PER_BLOCK / (block_ms / 1e3),
            "peak_gb": torch.cuda.max_memory_allocated() / 1e9,
            "gpu": torch.cuda.get_device_name(),
        }
        theirs_path = out / "timing.json"
        theirs = json.loads(theirs_path.read_text()) if theirs_path.exists() else None
        result["authors_timing"] = theirs
        line = f"Facecast: block {block_ms:.0f} ms = {result['timing']['fps']:.2f} fps"
        if theirs:
            line += (
                f"; authors: block {theirs['block_ms_median']:.0f} ms = {theirs['fps']:.2f} fps"
                f" (attention {theirs['attention']})"
            )
        print(f"{meta['dtype']}, {steps} steps, median block (window full): {line}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if args.write_fixture:
        write_fixture(Path(args.write_fixture), ref, meta)
    return result


def write_fixture(path: Path, ref: dict, meta: dict) -> None:
    """Inputs, timesteps and sigmas, the drawn distances, block 0's first velocity and every block's
    final latents; the weights are re-made from `meta['seed']`."""
    keep = {k: v for k, v in ref.items() if k.startswith("in.")}
    keep |= {k: ref[k] for k in ("timesteps", "sigmas", "ref_distances", "block0.step0.v")}
    keep |= {f"block{b}.latents": ref[f"block{b}.latents"] for b in range(meta["blocks"])}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.contiguous() for k, v in keep.items()}, str(path), metadata={"meta": json.dumps(meta)}
    )
    print(f"fixture: {path} ({path.stat().st_size / 1e6:.2f} MB)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reference-out", required=True)
    p.add_argument("--json")
    p.add_argument("--write-fixture")
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: where the reference ran")
    p.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        help="Facecast's dtype; default the reference run's (another: a CPU check of bf16)",
    )
    run(p.parse_args())


if __name__ == "__main__":
    main()
