"""Compare Facecast's S2V transformer with the LiveAvatar authors' on the same random weights.

    python bench/parity/liveavatar_compare.py --reference-out DIR [--json OUT]
        [--write-fixture PATH]

DIR is what `bench/parity/liveavatar_reference.py` wrote. Facecast loads the release's
safetensors through its mapping (`s2v_weights.load_published`), then runs the same stream:
prefill (prompt + sink), and per block the audio encoding and the 4 Euler steps, each step
on its own cache, each forward given the reference distance the authors' run drew. It
prints, per comparison, the cosine similarity and the largest absolute difference: block
0's first forward alone, then every step's velocity and every block's final latents of the
free-running stream (Facecast's own latents feed its next step and block).
`--write-fixture` keeps the inputs and the authors' outputs for the tests
(tests/fixtures/liveavatar/); the weights are re-made there from the seed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pipeline.models.wan.s2v import S2VConfig, S2VTransformer  # noqa: E402
from pipeline.models.wan.s2v_weights import load_published  # noqa: E402


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
) -> dict[str, torch.Tensor]:
    """The authors' streaming loop in Facecast's API: what a caller does per block."""
    cfg = model.cfg
    steps, fpb = len(sigmas) - 1, cfg.frames_per_block
    H, W = ins["ref"].shape[-2:]
    cache = model.new_cache(1, (H, W), steps, "cpu", torch.float32)
    model.prefill(cache, ins["prompt"], ins["ref"], ins["motion"])
    out: dict[str, torch.Tensor] = {}
    draw = iter(distances)
    for b in range(blocks):
        audio = model.encode_audio(ins["audio"][..., b * 4 * fpb : (b + 1) * 4 * fpb])
        x = ins["noise"][None, :, b * fpb : (b + 1) * fpb]
        for i in range(steps):
            s, s_next = sigmas[i], sigmas[i + 1]
            t = timesteps[i : i + 1]
            v = model.forward_block(x, t, audio, cache, i, ref_distance=next(draw))
            if keep_steps:
                out[f"block{b}.step{i}.v"] = v[0]
            x = x + (s_next - s) * v  # diffusers' Euler step, in fp32
        cache.advance()
        out[f"block{b}.latents"] = x[0]
    return out


def load(out: Path) -> tuple[S2VTransformer, dict, dict]:
    with safe_open(str(out / "reference.safetensors"), "pt") as f:
        meta = json.loads(f.metadata()["meta"])
    ref = load_file(str(out / "reference.safetensors"))
    raw = json.loads((out / "release" / "config.json").read_text())
    cfg = S2VConfig.from_release(raw)
    model = S2VTransformer(cfg)
    weights = out / "release" / "diffusion_pytorch_model.safetensors"
    load_published(model, load_file(str(weights)), weights)
    return model.eval().requires_grad_(False), ref, meta


def run(args) -> dict:
    out = Path(args.reference_out)
    model, ref, meta = load(out)
    ins = {k[3:]: v for k, v in ref.items() if k.startswith("in.")}
    distances = ref["ref_distances"].tolist()
    rows: dict[str, dict] = {}
    with torch.no_grad():
        mine = run_stream(model, ins, ref["timesteps"], ref["sigmas"], distances, meta["blocks"])
    rows["block 0 step 0 (one forward)"] = compare(mine["block0.step0.v"], ref["block0.step0.v"])
    for b in range(meta["blocks"]):
        worst = min(
            (compare(mine[f"block{b}.step{i}.v"], ref[f"block{b}.step{i}.v"]) for i in range(4)),
            key=lambda r: r["cos"],
        )
        rows[f"block {b} velocities (worst step)"] = worst
        rows[f"block {b} latents"] = compare(mine[f"block{b}.latents"], ref[f"block{b}.latents"])
    for name, r in rows.items():
        print(
            f"{name:34s} cos {r['cos']:.8f}  max|diff| {r['max_abs']:.3e}"
            f"  (max|ref| {r['ref_abs_max']:.2f})"
        )
    result = {"meta": meta, "rows": rows}
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
    run(p.parse_args())


if __name__ == "__main__":
    main()
