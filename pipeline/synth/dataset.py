"""Deterministic training shards of the synthetic face world.

A dataset directory holds `manifest.json` and `shard_00000.npz`, ... Each shard packs
several clips end to end:

    frames      uint8   (F, S, S, 3)   RGB video at 25 fps
    audio       int16   (F * 640,)     16 kHz mono, frame n <-> samples [640n, 640(n+1))
    params      float32 (F, P)         per-frame ground truth, columns = PARAM_NAMES
    clip_start  int64   (C + 1,)       clip c is frames [clip_start[c], clip_start[c+1])
    references  uint8   (C, S, S, 3)   each clip's identity in its neutral pose
    identity    int32   (C,)           index into manifest["identities"]

Clip i depends only on (seed, i), and identity k only on (seed, k), so datasets built
with different worker counts or shard sizes hold the same clips, and a 256 px build
shows the same people saying the same things as a 128 px build.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.clock import FPS, MODEL_RATE, MODEL_SAMPLES_PER_FRAME
from pipeline.synth.face import random_identity, render_frames, render_reference
from pipeline.synth.motion import PARAM_NAMES, motion_from_audio, n_frames
from pipeline.synth.motion import silence_segments as find_silences
from pipeline.synth.speech import random_speech

_IDENTITY_STREAM = 1_000_003  # keeps identity seeds apart from clip seeds


@dataclass(frozen=True)
class DatasetConfig:
    """What to build. `n_identities` defaults to one new person per clip."""

    n_clips: int
    size: int = 128
    seed: int = 0
    n_identities: int | None = None
    clips_per_shard: int = 16
    min_clip_s: float = 6.0
    max_clip_s: float = 14.0

    def identities(self) -> int:
        return self.n_identities or self.n_clips


@dataclass(frozen=True)
class Clip:
    """One rendered clip and its ground truth."""

    frames: np.ndarray  # uint8 (T, S, S, 3)
    audio: np.ndarray  # int16 (T * 640,)
    params: np.ndarray  # float32 (T, P)
    reference: np.ndarray  # uint8 (S, S, 3)
    identity: int
    info: dict


def identity_for(seed: int, k: int):
    return random_identity(np.random.default_rng([seed, _IDENTITY_STREAM, k]))


def make_clip(cfg: DatasetConfig, index: int) -> Clip:
    """Speech, motion and frames of clip `index`; a pure function of (cfg, index)."""
    rng = np.random.default_rng([cfg.seed, index])
    audio, utterances = random_speech(rng, cfg.min_clip_s, cfg.max_clip_s)
    n = n_frames(len(audio))
    audio = np.pad(audio, (0, n * MODEL_SAMPLES_PER_FRAME - len(audio)))
    k = int(rng.integers(cfg.identities())) if cfg.n_identities else index
    ident = identity_for(cfg.seed, k)
    motion = motion_from_audio(audio, seed=int(rng.integers(2**31)))
    frames = render_frames(ident, motion, cfg.size)
    first = utterances[0]
    info = {
        "frames": n,
        "identity": k,
        "lang": first.lang,
        "voice": first.voice,
        "speed_wpm": first.speed_wpm,
        "pitch": first.pitch,
        "texts": [u.text for u in utterances],
        "silences": [list(s) for s in find_silences(audio)],
    }
    pcm = np.clip(np.round(audio * 32767.0), -32768, 32767).astype(np.int16)
    return Clip(frames, pcm, motion.to_array(), render_reference(ident, cfg.size), k, info)


def _write_shard(path: Path, clips: list[Clip]) -> None:
    starts = np.cumsum([0] + [len(c.frames) for c in clips]).astype(np.int64)
    np.savez_compressed(
        path,
        frames=np.concatenate([c.frames for c in clips]),
        audio=np.concatenate([c.audio for c in clips]),
        params=np.concatenate([c.params for c in clips]),
        clip_start=starts,
        references=np.stack([c.reference for c in clips]),
        identity=np.array([c.identity for c in clips], np.int32),
    )


def _build_shard(args: tuple[DatasetConfig, int, str]) -> list[dict]:
    cfg, shard, out_dir = args
    first = shard * cfg.clips_per_shard
    clips = [make_clip(cfg, i) for i in range(first, min(cfg.n_clips, first + cfg.clips_per_shard))]
    name = f"shard_{shard:05d}.npz"
    _write_shard(Path(out_dir) / name, clips)
    return [dict(c.info, clip=first + j, shard=name, index=j) for j, c in enumerate(clips)]


def build_dataset(
    out_dir: str | Path,
    n_clips: int,
    size: int = 128,
    seed: int = 0,
    *,
    n_identities: int | None = None,
    clips_per_shard: int = 16,
    workers: int = 1,
) -> dict:
    """Render `n_clips` clips into shards under `out_dir`; returns the manifest.

    Deterministic from `seed`; `workers` > 1 renders shards in parallel processes
    without changing a byte of the result.
    """
    if n_clips < 1:
        raise ValueError(f"n_clips must be at least 1, got {n_clips}")
    cfg = DatasetConfig(n_clips, size, seed, n_identities, clips_per_shard)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    n_shards = -(-n_clips // clips_per_shard)
    jobs = [(cfg, s, str(out)) for s in range(n_shards)]
    t0 = time.perf_counter()
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            results = list(pool.map(_build_shard, jobs))
    else:
        results = [_build_shard(job) for job in jobs]
    clips = [info for shard in results for info in shard]
    used = sorted({c["identity"] for c in clips})
    total = sum(c["frames"] for c in clips)
    manifest = {
        "version": 1,
        "seed": seed,
        "size": size,
        "fps": FPS,
        "sample_rate": MODEL_RATE,
        "param_names": list(PARAM_NAMES),
        "n_clips": n_clips,
        "n_frames": total,
        "seconds": total / FPS,
        "build_seconds": round(time.perf_counter() - t0, 2),
        "shards": [f"shard_{s:05d}.npz" for s in range(n_shards)],
        "clips": clips,
        "identities": {str(k): identity_for(seed, k).to_dict() for k in used},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def load_manifest(out_dir: str | Path) -> dict:
    path = Path(out_dir) / "manifest.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found; build one with build_dataset(out_dir, ...)")
    return json.loads(path.read_text())


def load_shard(path: str | Path) -> dict[str, np.ndarray]:
    """All arrays of one shard, in memory."""
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def iter_clips(out_dir: str | Path):
    """Yield every clip of a dataset as a `Clip`, shard by shard."""
    manifest = load_manifest(out_dir)
    by_shard: dict[str, list[dict]] = {}
    for info in manifest["clips"]:
        by_shard.setdefault(info["shard"], []).append(info)
    for name in manifest["shards"]:
        data = load_shard(Path(out_dir) / name)
        starts = data["clip_start"]
        for info in by_shard.get(name, []):
            j = info["index"]
            a, b = int(starts[j]), int(starts[j + 1])
            yield Clip(
                frames=data["frames"][a:b],
                audio=data["audio"][a * MODEL_SAMPLES_PER_FRAME : b * MODEL_SAMPLES_PER_FRAME],
                params=data["params"][a:b],
                reference=data["references"][j],
                identity=int(data["identity"][j]),
                info=info,
            )
