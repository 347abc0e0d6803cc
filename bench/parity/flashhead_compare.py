"""Compare Facecast's FlashHead family with the authors' code on the same random weights.

    python bench/parity/flashhead_compare.py --reference-out DIR [--device cpu|cuda]
        [--json OUT] [--write-fixture PATH]

DIR is what `bench/parity/flashhead_reference.py` wrote: the release folder of random
weights, the inputs, and the authors' outputs. Facecast loads the release through its own
loaders (`facecast … --model flashhead-pro --weights DIR/release --wav2vec DIR/wav2vec`),
recomputes everything and prints, per comparison, the cosine similarity and the largest
absolute difference: the DiT forward, the wav2vec2 features, the VAE's encode and decode,
and the stream-mode render chunk by chunk (audio embedding, sampled latents, motion latents
handed to the next chunk, frames). `--write-fixture` keeps the tiny-shape inputs and the
authors' outputs for the tests (tests/fixtures/flashhead/).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pipeline.clock import MODEL_SAMPLES_PER_FRAME  # noqa: E402
from pipeline.startup import EngineOptions, start_engine  # noqa: E402


def compare(a: torch.Tensor, b: torch.Tensor) -> dict:
    a, b = a.double().flatten(), b.double().flatten()
    return {
        "cos": torch.nn.functional.cosine_similarity(a, b, dim=0).item(),
        "max_abs": (a - b).abs().max().item(),
        "ref_abs_max": b.abs().max().item(),
    }


def run(args) -> dict:
    out = Path(args.reference_out)
    meta = json.loads((out / "meta.json").read_text())
    ref = load_file(str(out / "reference.safetensors"))
    audio = load_file(str(out / "speech.safetensors"))["audio"].numpy()
    size = meta["size"]
    opts = EngineOptions(
        model="flashhead-pro",
        weights=str(out / "release"),
        wav2vec=str(out / "wav2vec"),
        device=args.device,
        warmup=False,
        overrides={
            "flashhead.dtype": meta["dtype"],
            "video.width": size,
            "video.height": size,
        },
    )
    engine, _ = start_engine(opts)
    dev, dtype = engine.device, engine.dtype
    models = engine.models
    rows: dict[str, dict] = {}
    with torch.inference_mode():
        ctx = models.dit.project_audio(ref["dit.audio"].to(dev))
        out_dit = models.dit(
            ref["dit.x"].to(dev, dtype), ref["dit.t"].to(dev), ctx, ref["dit.y"].to(dev, dtype)
        )
        rows["dit forward"] = compare(out_dit.float().cpu(), ref["dit.out"])
        feats = models.speech.frames(ref["w2v.window"].numpy(), 200)
        rows["wav2vec2 features"] = compare(feats.cpu(), ref["w2v.features"])
        lat = models.vae.encode(ref["vae.video"].to(dev, dtype))[0]
        rows["vae encode (33 frames)"] = compare(lat.float().cpu(), ref["vae.latents"])
        pix = models.vae.decode(ref["vae.z"].to(dev, dtype)[None])
        rows["vae decode (9 latents)"] = compare(pix.float().cpu(), ref["vae.decoded"])

    from PIL import Image

    image = np.asarray(Image.open(out / "reference.png").convert("RGB"))
    stream = engine.new_stream(image, seed=meta["seed"])
    rows["reference latents"] = compare(stream.ref_lat.float().cpu(), ref["ref.latents"])
    seen: dict[str, torch.Tensor] = {}
    decode, encode = models.vae.decode, models.vae.encode

    def keep_decode(z):
        seen["latents"] = z[0].float().cpu()
        return decode(z)

    def keep_encode(video):
        z = encode(video)
        seen["motion"] = z[0].float().cpu()
        return z

    models.vae.decode, models.vae.encode = keep_decode, keep_encode
    k = 0
    samples = engine.new_frames * MODEL_SAMPLES_PER_FRAME
    for k in range(meta["chunks"]):
        stream.push_audio(audio[k * samples : (k + 1) * samples])
        (batch,) = stream.generate_ready()
        frames = torch.from_numpy(batch.frames)
        theirs = ref[f"chunk{k}.frames"]
        rows[f"chunk {k} latents"] = compare(seen["latents"], ref[f"chunk{k}.latents"])
        rows[f"chunk {k} motion latents"] = compare(seen["motion"], ref[f"chunk{k}.motion"])
        diff = (frames.int() - theirs.int()).abs()
        rows[f"chunk {k} frames"] = {
            **compare(frames.float(), theirs.float()),
            "identical_share": (diff == 0).float().mean().item(),
        }
    models.vae.decode, models.vae.encode = decode, encode
    stream.close()
    for name, r in rows.items():
        extra = f" identical {r['identical_share']:.4f}" if "identical_share" in r else ""
        print(f"{name:28s} cos {r['cos']:.8f}  max|diff| {r['max_abs']:.3e}{extra}")
    result = {"meta": meta, "device": str(dev), "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if args.write_fixture:
        write_fixture(Path(args.write_fixture), out, ref, audio, image, meta)
    return result


def write_fixture(path: Path, out: Path, ref: dict, audio, image, meta: dict) -> None:
    """The tiny run's inputs and the authors' outputs, small enough for the repository: the
    weights (DiT, VAE, wav2vec2) and the DiT's random inputs are re-made from their seeds
    by the test (`random_dit_state`, `random_checkpoint`, `randomise_module`)."""
    keep = {}
    keep["audio"] = torch.from_numpy(audio)
    keep["reference"] = torch.from_numpy(np.ascontiguousarray(image))
    keep["dit.out"] = ref["dit.out"]
    keep["w2v.features_190_200"] = ref["w2v.features"][190:200]
    for k in range(meta["chunks"]):
        for part in ("latents", "motion", "frames"):
            keep[f"chunk{k}.{part}"] = ref[f"chunk{k}.{part}"]
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.contiguous() for k, v in keep.items()}, str(path), metadata={"meta": json.dumps(meta)}
    )
    print(f"fixture: {path} ({path.stat().st_size / 1e6:.2f} MB)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reference-out", required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json")
    p.add_argument("--write-fixture")
    run(p.parse_args())


if __name__ == "__main__":
    main()
