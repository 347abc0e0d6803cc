"""Run Wan2.2-S2V's own audio encoder (as LiveAvatar ships it) on a random wav2vec2 and keep
what it computes: the parity fixture of `pipeline.models.encoders.s2v_speech`.

    PYTHONPATH=TF4 python bench/parity/s2v_speech_reference.py --reference-repo PATH
        [--out FILE] [--shape tiny|wide]
    python bench/parity/s2v_speech_reference.py --compare FILE

PATH is a checkout of github.com/Alibaba-Quark/LiveAvatar; its
`wan_2_2/modules/s2v/audio_encoder.py` is imported from PATH in this process (nothing of
it is copied into Facecast), with a stand-in for `librosa.load` that hands it the test
clip (a second and a bit of the project's sample speech, at the model rate). TF4 holds transformers 4.51.3, the newest the authors allow
(`requirements.txt`: transformers<=4.51.3): their `torch.cat(res.hidden_states)` depends
on what transformers returns there, and 5.x returns something else (see s2v_speech.py).

It writes FILE (default `tests/fixtures/liveavatar/s2v_speech_tiny.safetensors`): the
stacked hidden states (`hidden`), the 30 fps features (`feat30`, their
`extract_audio_feat(return_all_layers=True)`), and the buckets their `encode_audio`
hands the transformer (`bucket`, (1, L, W, F)) with its clip count; the seed, wav2vec2
shape, the clip's place in the sample speech and the bucket length in the metadata. The
test re-makes the weights and reads the same clip. `--shape wide` is the large model's
widths (1024, 16 heads, 512 convolution channels) with 2 of its 24 layers; `--compare FILE`
(with Facecast's own transformers, no TF4) computes the same through
`pipeline.models.encoders.s2v_speech` and prints the largest differences.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import torch

FACECAST = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(FACECAST))

from pipeline.clock import FPS, MODEL_RATE  # noqa: E402
from pipeline.media import read_audio  # noqa: E402
from pipeline.models.encoders.s2v_speech import write_random_wav2vec2  # noqa: E402
from pipeline.models.encoders.wav2vec2 import WAV2VEC2_TINY  # noqa: E402

SEED = 11
CLIP_FRAMES = 12  # the authors' infer_frames is 48; a short clip reaches several buckets
SPEECH = "pipeline/assets/sample_speech.wav"
START, SECONDS = 1.0, 1.37
# over XLSR53_LARGE: "tiny" keeps the large model's structure (stable layer norm, conv
# bias), shrunk
SHAPES = {"tiny": WAV2VEC2_TINY, "wide": dict(num_hidden_layers=2)}


def speech_clip() -> np.ndarray:
    """The test clip: SECONDS of the project's sample speech from START (16 kHz 16-bit in the
    file: read exactly, nothing resampled)."""
    audio = read_audio(FACECAST / SPEECH)
    start = int(START * MODEL_RATE)
    return audio[start : start + int(SECONDS * MODEL_RATE)]


def import_theirs(repo: Path, audio: np.ndarray) -> types.ModuleType:
    librosa = types.ModuleType("librosa")
    librosa.load = lambda path, sr: (audio, sr)  # type: ignore[attr-defined]
    sys.modules["librosa"] = librosa
    path = repo / "liveavatar/models/wan/wan_2_2/modules/s2v/audio_encoder.py"
    spec = importlib.util.spec_from_file_location("wan_s2v_audio_encoder", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reference-repo", type=Path)
    p.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    p.add_argument("--compare", type=Path, help="a file this script wrote: Facecast's vs it")
    p.add_argument(
        "--out",
        type=Path,
        default=FACECAST / "tests/fixtures/liveavatar/s2v_speech_tiny.safetensors",
    )
    args = p.parse_args()
    if args.compare:
        compare(args.compare)
        return
    if args.reference_repo is None:
        p.error("--reference-repo PATH is needed (or --compare FILE)")
    import transformers
    from safetensors.torch import save_file

    audio, wav2vec = speech_clip(), SHAPES[args.shape]
    theirs = import_theirs(args.reference_repo.resolve(), audio)
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_random_wav2vec2(Path(tmp) / "wav2vec2", wav2vec, SEED)
        encoder = theirs.AudioEncoder(model_id=str(folder))
        encoder.model.eval()
        with torch.no_grad():
            # their extract_audio_feat before the resampling, line for line
            values = encoder.processor(audio, sampling_rate=MODEL_RATE, return_tensors="pt")
            res = encoder.model(values.input_values, output_hidden_states=True)
            hidden = torch.cat(res.hidden_states)
            feat30 = encoder.extract_audio_feat("speech.wav", return_all_layers=True)
            frames, clips = encoder.get_audio_embed_bucket_fps(
                feat30, fps=FPS, batch_frames=CLIP_FRAMES, m=0
            )
    bucket = frames.unsqueeze(0).permute(0, 2, 3, 1)  # their encode_audio, for 4-d buckets
    meta = {
        "seed": SEED,
        "speech": SPEECH,
        "start": START,
        "seconds": SECONDS,
        "clip_frames": CLIP_FRAMES,
        "clips": clips,
        "wav2vec": wav2vec,
        "transformers": transformers.__version__,
    }
    tensors = {"hidden": hidden, "feat30": feat30, "bucket": bucket}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.float().contiguous() for k, v in tensors.items()}, str(args.out),
              metadata={"meta": json.dumps(meta)})  # fmt: skip
    print(f"wrote {args.out}: " + ", ".join(f"{k} {tuple(v.shape)}" for k, v in tensors.items()))


def compare(path: Path) -> None:
    """Facecast's features for the file's weights and clip against the file's."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    from pipeline.models.encoders.s2v_speech import S2VSpeechFeatures, bucket, to_feature_rate

    with safe_open(str(path), "pt") as f:
        meta = json.loads(f.metadata()["meta"])
    ref = load_file(str(path))
    wav2vec = {k: tuple(v) if isinstance(v, list) else v for k, v in meta["wav2vec"].items()}
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_random_wav2vec2(Path(tmp) / "wav2vec2", wav2vec, meta["seed"])
        hidden = S2VSpeechFeatures(folder).hidden_states(speech_clip())
    feat30 = to_feature_rate(hidden)
    ours = {"hidden": hidden, "feat30": feat30, "bucket": bucket(feat30, meta["clip_frames"])[0]}
    for name, t in ours.items():
        err = (t - ref[name]).abs().max() / ref[name].abs().max()
        print(f"{name} {tuple(t.shape)}: max |ours - theirs| / max |theirs| = {err:.3g}")


if __name__ == "__main__":
    main()
