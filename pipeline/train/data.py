"""Training data from the synthetic face world: speech, rendered segments, batches.

Two layers, because speech needs espeak-ng and rendering needs only numpy:

- the *speech cache* (`build_speech_cache`): espeak-ng utterances with their motion
  tracks (mouth from the audio, head/blinks from a seed), one compact `.npz`. It is made
  once wherever espeak-ng is installed and carried to the GPU machine.
- the *segment pool* (`SegmentPool.render`): fixed-length video segments of random
  identities saying random stretches of the cached speech, rendered in parallel
  processes. Segment i depends only on (seed, i), so a resumed run sees the same data.

Batches are cut from the pool on the training device: frames for the VAE, latent windows
plus the exact audio window the engine's context stage would read for the A2V and SR.

Legend: S segments, F frames per segment, H/W pixels, P motion parameters.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.clock import MODEL_SAMPLES_PER_FRAME
from pipeline.synth.dataset import identity_for
from pipeline.synth.face import render_frames, render_reference
from pipeline.synth.motion import MotionTrack, motion_from_audio, n_frames
from pipeline.synth.speech import random_speech

_SEGMENT_STREAM = 7_000_003  # keeps segment seeds apart from speech and identity seeds


@dataclass
class SpeechCache:
    """Clips of speech and their motion: `audio[c]` int16 (F_c * 640,), `params[c]` (F_c, P)."""

    audio: list[np.ndarray]
    params: list[np.ndarray]

    @property
    def frames(self) -> int:
        return sum(len(p) for p in self.params)


def _speech_clip(args: tuple[int, int, float, float]) -> tuple[np.ndarray, np.ndarray]:
    seed, index, min_s, max_s = args
    rng = np.random.default_rng([seed, index])
    audio, _ = random_speech(rng, min_s, max_s)
    n = n_frames(len(audio))
    audio = np.pad(audio, (0, n * MODEL_SAMPLES_PER_FRAME - len(audio)))
    motion = motion_from_audio(audio, seed=int(rng.integers(2**31)))
    pcm = np.clip(np.round(audio * 32767.0), -32768, 32767).astype(np.int16)
    return pcm, motion.to_array()


def build_speech_cache(
    path: str | Path,
    n_clips: int,
    seed: int = 0,
    min_s: float = 5.0,
    max_s: float = 9.0,
    workers: int = 2,
) -> SpeechCache:
    """Synthesise `n_clips` clips with espeak-ng and save them to one compressed `.npz`."""
    jobs = [(seed, i, min_s, max_s) for i in range(n_clips)]
    with ProcessPoolExecutor(workers) as pool:
        clips = list(pool.map(_speech_clip, jobs))
    starts = np.cumsum([0] + [len(p) for _, p in clips]).astype(np.int64)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        path,
        audio=np.concatenate([a for a, _ in clips]),
        params=np.concatenate([p for _, p in clips]),
        clip_start=starts,
    )
    return SpeechCache([a for a, _ in clips], [p for _, p in clips])


def load_speech_cache(path: str | Path) -> SpeechCache:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"speech cache {path} not found; make one where espeak-ng is installed with "
            f"`python -m pipeline.train --make-speech {path}`"
        )
    with np.load(path) as data:
        audio, params, starts = data["audio"], data["params"], data["clip_start"]
    spf = MODEL_SAMPLES_PER_FRAME
    return SpeechCache(
        [audio[a * spf : b * spf] for a, b in zip(starts[:-1], starts[1:], strict=True)],
        [params[a:b] for a, b in zip(starts[:-1], starts[1:], strict=True)],
    )


@dataclass
class SegmentPool:
    """Rendered training segments, all of `frames_per_segment` frames.

    frames      uint8   (S, F, H, W, 3)
    references  uint8   (S, H, W, 3)   each segment's identity in its neutral pose
    audio       float32 (S, (F + ctx + look) * 640)  speech around the segment, zero
                outside its clip, starting `ctx` frames before the segment's first frame
    jaw         float32 (S, F)  ground-truth mouth opening (for logs and tests)
    """

    frames: np.ndarray
    references: np.ndarray
    audio: np.ndarray
    jaw: np.ndarray
    context_frames: int
    lookahead_frames: int
    seconds: float = 0.0  # how long `render` took

    @staticmethod
    def render(
        speech: SpeechCache,
        n_segments: int,
        frames_per_segment: int,
        size: int,
        context_frames: int,
        lookahead_frames: int,
        seed: int = 0,
        workers: int | None = None,
    ) -> SegmentPool:
        workers = workers or max(1, min(32, (os.cpu_count() or 2)))
        spec = (speech, frames_per_segment, size, context_frames, lookahead_frames, seed)
        t0 = time.perf_counter()
        if workers > 1:
            with ProcessPoolExecutor(workers, initializer=_init_worker, initargs=(spec,)) as pool:
                parts = list(pool.map(_render_segment, range(n_segments), chunksize=4))
        else:
            _init_worker(spec)
            parts = [_render_segment(i) for i in range(n_segments)]
        frames, refs, audio, jaw = (np.stack(x) for x in zip(*parts, strict=True))
        seconds = time.perf_counter() - t0
        return SegmentPool(frames, refs, audio, jaw, context_frames, lookahead_frames, seconds)


_WORKER_SPEC: tuple | None = None


def _init_worker(spec: tuple) -> None:
    global _WORKER_SPEC
    _WORKER_SPEC = spec


def _render_segment(i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Segment i: a random clip, start and identity, all from (seed, i)."""
    assert _WORKER_SPEC is not None, "_init_worker runs first in every worker"
    speech, F, size, ctx, look, seed = _WORKER_SPEC
    rng = np.random.default_rng([seed, _SEGMENT_STREAM, i])
    c = int(rng.integers(len(speech.params)))
    params = speech.params[c]
    # starts may run a little off either end of the clip: the edges of a stream (silence
    # before speech, speech cut off) must be in the data too
    start = int(rng.integers(-F // 4, max(1, len(params) - 3 * F // 4)))
    idx = np.clip(np.arange(start, start + F), 0, len(params) - 1)
    motion = MotionTrack.from_array(params[idx])
    ident = identity_for(seed, int(rng.integers(2**31)))
    frames = render_frames(ident, motion, size)
    ref = render_reference(ident, size)
    spf = MODEL_SAMPLES_PER_FRAME
    lo, hi = (start - ctx) * spf, (start + F + look) * spf
    clip = speech.audio[c].astype(np.float32) / 32767.0
    audio = np.zeros(hi - lo, np.float32)
    a, b = max(lo, 0), min(hi, len(clip))
    if b > a:
        audio[a - lo : b - lo] = clip[a:b]
    # off the clip's ends the clamped parameters are its edge silences: mouth closed
    return frames, ref, audio, params[idx, 0].astype(np.float32)
