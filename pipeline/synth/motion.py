"""Per-frame motion of the synthetic face: mouth from audio, blinks and head from a seed.

Frame n covers audio samples [n * 640, (n + 1) * 640) at 16 kHz (25 fps). The mouth
is a deterministic function of the audio (this is the lip-sync ground truth); blinks,
gaze and head motion come from a seeded RNG, with larger head motion while speaking
and a small, never-frozen idle motion during silence.

Audio analysis runs at 100 Hz (hop 160) and is averaged down to the video rate, so
smoothing and the articulatory lead are finer than one video frame.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from pipeline.clock import FPS, MODEL_RATE

_HOP = 160  # 10 ms analysis hop
_WIN = 400  # 25 ms analysis window
_NFFT = 512

# Lip movements lead the sound they shape (anticipatory coarticulation): the mouth
# starts opening ~40 ms before a vowel is heard.
LEAD_S = 0.04


@dataclass(frozen=True)
class MouthParams:
    """Per-frame mouth shape, each float32 (N,).

    jaw      0..1  lip-to-lip opening (0 closed, 1 wide open)
    width   -1..1  lip spread (+1 smile-like spread, -1 narrowed)
    rounding 0..1  lip rounding / protrusion (o, u, w)
    teeth    0..1  how much of the teeth shows when the lips part
    """

    jaw: np.ndarray
    width: np.ndarray
    rounding: np.ndarray
    teeth: np.ndarray

    def __len__(self) -> int:
        return len(self.jaw)


# Column order of `MotionTrack.to_array`: the dataset's `params` columns.
PARAM_NAMES = (
    "jaw",
    "width",
    "rounding",
    "teeth",
    "blink",
    "brow",
    "head_x",
    "head_y",
    "head_roll",
    "yaw",
    "pitch",
    "gaze_x",
    "gaze_y",
)


@dataclass(frozen=True)
class MotionTrack:
    """Everything that moves, per frame (each float32 (N,)).

    Mouth fields as in MouthParams; blink 0 open .. 1 closed; brow 0..1 raise;
    head_x, head_y translation in normalised frame units (frame spans 2.0);
    head_roll in radians; yaw, pitch, gaze_x, gaze_y in -1..1.
    """

    jaw: np.ndarray
    width: np.ndarray
    rounding: np.ndarray
    teeth: np.ndarray
    blink: np.ndarray
    brow: np.ndarray
    head_x: np.ndarray
    head_y: np.ndarray
    head_roll: np.ndarray
    yaw: np.ndarray
    pitch: np.ndarray
    gaze_x: np.ndarray
    gaze_y: np.ndarray

    def __len__(self) -> int:
        return len(self.jaw)

    @staticmethod
    def neutral(n: int) -> MotionTrack:
        z = np.zeros(n, np.float32)
        return MotionTrack(**{name: z for name in PARAM_NAMES})

    def slice(self, start: int, stop: int) -> MotionTrack:
        return MotionTrack(**{f.name: getattr(self, f.name)[start:stop] for f in fields(self)})

    def replace(self, **arrays: np.ndarray) -> MotionTrack:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data.update({k: np.asarray(v, np.float32) for k, v in arrays.items()})
        return MotionTrack(**data)

    @property
    def mouth(self) -> MouthParams:
        return MouthParams(self.jaw, self.width, self.rounding, self.teeth)

    def to_array(self) -> np.ndarray:
        """float32 (N, len(PARAM_NAMES)), columns in PARAM_NAMES order."""
        return np.stack([getattr(self, name) for name in PARAM_NAMES], axis=1).astype(np.float32)

    @staticmethod
    def from_array(params: np.ndarray) -> MotionTrack:
        if params.ndim != 2 or params.shape[1] != len(PARAM_NAMES):
            raise ValueError(f"expected params (N, {len(PARAM_NAMES)}), got {params.shape}")
        return MotionTrack(
            **{name: params[:, i].astype(np.float32) for i, name in enumerate(PARAM_NAMES)}
        )


def n_frames(n_samples: int, fps: int = FPS) -> int:
    """Frames that a stretch of audio covers (a partial last frame counts)."""
    spf = MODEL_RATE // fps
    return -(-n_samples // spf)


# ---------------------------------------------------------------------------
# Audio analysis.


@dataclass(frozen=True)
class _Features:
    """Per-hop (100 Hz) audio features."""

    level_db: np.ndarray  # loudness relative to the clip's speech level
    active: np.ndarray  # 0..1 soft speech activity
    openness: np.ndarray  # 0..1 first-formant proxy (a high, i/u low)
    front: np.ndarray  # -1..1 second-formant proxy (i/e high, o/u low)
    hiss: np.ndarray  # 0..1 share of energy above 3 kHz (s, f, sh)


def _band(freqs: np.ndarray, power: np.ndarray, lo: float, hi: float) -> np.ndarray:
    sel = (freqs >= lo) & (freqs < hi)
    return power[:, sel].sum(axis=1)


def _features(samples: np.ndarray) -> _Features:
    x = np.asarray(samples, np.float32).reshape(-1)
    n_hops = -(-len(x) // _HOP)
    # Window k is centred on the middle of hop k.
    pad = (_WIN - _HOP) // 2
    xp = np.pad(x, (pad, pad + n_hops * _HOP - len(x) + _WIN))
    idx = np.arange(n_hops)[:, None] * _HOP + np.arange(_WIN)[None, :]
    frames = xp[idx] * np.hanning(_WIN).astype(np.float32)
    power = np.abs(np.fft.rfft(frames, _NFFT, axis=1)) ** 2
    freqs = np.fft.rfftfreq(_NFFT, 1.0 / MODEL_RATE)

    total = _band(freqs, power, 80, 8000) + 1e-10
    low = _band(freqs, power, 80, 1100) + 1e-10
    f1 = _band(freqs, power, 450, 1100)
    mid = _band(freqs, power, 900, 3000) + 1e-10
    high = _band(freqs, power, 3000, 8000)

    level = 10 * np.log10(total)
    # Normalise loudness to the clip's own speech level, so gain does not matter.
    ref = np.percentile(level, 95) if len(level) else 0.0
    level_db = np.maximum(level - ref, -80.0)
    active = np.clip((level_db + 38.0) / 8.0, 0, 1) * (level > -75)

    sel = (freqs >= 900) & (freqs < 3000)
    centroid = (power[:, sel] * freqs[sel]).sum(axis=1) / mid
    return _Features(
        level_db=level_db.astype(np.float32),
        active=active.astype(np.float32),
        openness=np.clip((f1 / low - 0.12) / 0.5, 0, 1).astype(np.float32),
        front=np.clip((centroid - 1500.0) / 600.0, -1, 1).astype(np.float32),
        hiss=np.clip(high / total, 0, 1).astype(np.float32),
    )


def _smooth(x: np.ndarray, tau_s: float, rate: float) -> np.ndarray:
    """Zero-phase one-pole smoothing (forward then backward): no added lag."""
    a = float(np.exp(-1.0 / (tau_s * rate)))

    def run(y: np.ndarray) -> np.ndarray:
        out = np.empty_like(y)
        acc = y[0] if len(y) else 0.0
        for i, val in enumerate(y):
            acc = a * acc + (1 - a) * val
            out[i] = acc
        return out

    if len(x) == 0:
        return x.astype(np.float32)
    return run(run(x.astype(np.float64))[::-1])[::-1].astype(np.float32)


def _to_frames(x_hops: np.ndarray, n: int, lead_hops: int) -> np.ndarray:
    """Average 100 Hz values to 25 fps, reading `lead_hops` ahead of each frame."""
    per = MODEL_RATE // FPS // _HOP
    shifted = np.concatenate([x_hops[lead_hops:], np.repeat(x_hops[-1:], lead_hops)])
    need = n * per
    if len(shifted) < need:
        shifted = np.pad(shifted, (0, need - len(shifted)), mode="edge")
    return shifted[:need].reshape(n, per).mean(axis=1).astype(np.float32)


def mouth_track_from_audio(samples_16k: np.ndarray, fps: int = FPS) -> MouthParams:
    """The ground-truth mouth of every video frame, from 16 kHz mono audio.

    jaw follows loudness shaped by vowel openness and closes on hissing consonants;
    width and rounding follow the second-formant proxy; teeth show on spread vowels
    and fricatives. Opening is smoothed (~30 ms, zero-phase) and leads the audio by
    LEAD_S, as real mouths do.
    """
    if fps != FPS:
        raise ValueError(f"the synthetic world runs at {FPS} fps; got fps={fps}")
    n = n_frames(len(np.asarray(samples_16k).reshape(-1)), fps)
    if n == 0:
        z = np.zeros(0, np.float32)
        return MouthParams(z, z, z, z)
    f = _features(samples_16k)
    rate = MODEL_RATE / _HOP
    loud = np.clip((f.level_db + 30.0) / 26.0, 0, 1) * f.active
    voiced = np.clip(1.0 - 2.0 * f.hiss, 0, 1)
    jaw = loud * (0.35 + 0.65 * f.openness) * (0.3 + 0.7 * voiced)
    width = f.front * f.active * 0.9
    rounding = np.clip(-f.front, 0, 1) * (1.0 - 0.6 * f.openness) * f.active * voiced
    teeth = np.clip(0.35 + 0.5 * np.clip(f.front, 0, 1) + 1.5 * f.hiss, 0, 1) * f.active

    lead = int(round(LEAD_S * rate))
    out = []
    for x, tau in ((jaw, 0.03), (width, 0.05), (rounding, 0.05), (teeth, 0.04)):
        out.append(_to_frames(_smooth(x, tau, rate), n, lead))
    jaw_f, width_f, round_f, teeth_f = out
    return MouthParams(
        jaw=np.clip(jaw_f, 0, 1),
        width=np.clip(width_f, -1, 1),
        rounding=np.clip(round_f, 0, 1),
        teeth=np.clip(teeth_f, 0, 1),
    )


def speech_activity(samples_16k: np.ndarray, fps: int = FPS) -> np.ndarray:
    """Per-frame speech activity in 0..1 (1 = someone is talking)."""
    n = n_frames(len(np.asarray(samples_16k).reshape(-1)), fps)
    if n == 0:
        return np.zeros(0, np.float32)
    return _to_frames(_features(samples_16k).active, n, 0)


def silence_segments(
    samples_16k: np.ndarray, min_s: float = 0.4, fps: int = FPS
) -> list[tuple[int, int]]:
    """Frame ranges [start, stop) of silences at least `min_s` long."""
    quiet = speech_activity(samples_16k, fps) < 0.05
    segs, start = [], None
    for i, q in enumerate(np.append(quiet, False)):
        if q and start is None:
            start = i
        elif not q and start is not None:
            if i - start >= min_s * fps:
                segs.append((start, i))
            start = None
    return segs


# ---------------------------------------------------------------------------
# Blinks, gaze, head.


def blink_track(n: int, rng: np.random.Generator, fps: int = FPS) -> np.ndarray:
    """Lid closure per frame: a blink every ~2-6 s, fast close, slower open."""
    t = (np.arange(n) + 0.5) / fps
    out = np.zeros(n, np.float32)
    when = rng.uniform(0.3, 3.0)
    while when < n / fps + 1:
        close, hold, open_ = rng.uniform(0.05, 0.09), rng.uniform(0.0, 0.05), rng.uniform(0.1, 0.17)
        for start in [when] + ([when + 0.35] if rng.random() < 0.1 else []):
            d = t - start
            closing = np.clip(d / close, 0, 1)
            opening = np.clip(1 - (d - close - hold) / open_, 0, 1)
            shape = np.where(d < close + hold, closing, opening) * (d >= 0)
            out = np.maximum(out, shape.astype(np.float32))
        when += max(1.0, rng.gamma(4.0, 0.9))
    # Smoothstep so the lid accelerates and settles like a real one.
    return (out * out * (3 - 2 * out)).astype(np.float32)


def _wander(n: int, rng: np.random.Generator, freqs: tuple[float, float], k: int = 4) -> np.ndarray:
    """A smooth random signal in about -1..1: a few sinusoids of random frequency."""
    t = np.arange(n) / FPS
    out = np.zeros(n)
    for _ in range(k):
        f = rng.uniform(*freqs)
        out += np.sin(2 * np.pi * f * t + rng.uniform(0, 2 * np.pi)) * rng.uniform(0.5, 1.0)
    return (out / np.sqrt(k / 2)).astype(np.float32)


def _saccades(n: int, rng: np.random.Generator) -> np.ndarray:
    """Gaze: mostly still, hopping to a new target every 0.5-3 s."""
    out = np.zeros(n, np.float32)
    i, target = 0, 0.0
    while i < n:
        hold = int(rng.uniform(0.5, 3.0) * FPS)
        target = float(np.clip(rng.normal(0, 0.5), -1, 1)) if rng.random() < 0.7 else 0.0
        out[i : i + hold] = target
        i += hold
    return _smooth(out, 0.03, FPS)


def motion_from_audio(samples_16k: np.ndarray, seed: int, fps: int = FPS) -> MotionTrack:
    """A full motion track for an utterance: mouth from audio, the rest from `seed`.

    Head motion is a slow sway always present (idle motion during silence, small
    but never frozen), plus speech-driven nods and larger sway while talking.
    """
    mouth = mouth_track_from_audio(samples_16k, fps)
    n = len(mouth)
    rng = np.random.default_rng(seed)
    talk = _smooth(speech_activity(samples_16k, fps), 0.4, fps) if n else np.zeros(0, np.float32)
    # Emphasis: rises in the loudness envelope drive nods and brow raises.
    env = _smooth(mouth.jaw, 0.12, fps) if n else mouth.jaw
    rise = np.clip(np.diff(env, prepend=env[:1]) * 8.0, 0, 1)
    emph = _smooth(rise, 0.15, fps) if n else rise
    gain = 0.6 + 0.9 * talk  # idle motion: smaller than the talking sway, never zero

    breath = np.sin(2 * np.pi * rng.uniform(0.2, 0.3) * np.arange(n) / fps + rng.uniform(0, 6.3))
    head_x = 0.02 * gain * _wander(n, rng, (0.05, 0.35))
    head_y = 0.01 * gain * _wander(n, rng, (0.05, 0.35)) + 0.004 * breath + 0.01 * emph
    roll = 0.03 * gain * _wander(n, rng, (0.04, 0.3))
    yaw = 0.35 * gain * _wander(n, rng, (0.03, 0.25))
    pitch = 0.25 * gain * _wander(n, rng, (0.05, 0.3)) + 0.8 * emph
    brow = np.clip(1.5 * emph + 0.3 * np.clip(_wander(n, rng, (0.05, 0.2)), 0, 1) * talk, 0, 1)
    f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    return MotionTrack(
        jaw=mouth.jaw,
        width=mouth.width,
        rounding=mouth.rounding,
        teeth=mouth.teeth,
        blink=blink_track(n, rng, fps),
        brow=f32(brow),
        head_x=f32(head_x),
        head_y=f32(head_y),
        head_roll=f32(roll),
        yaw=f32(np.clip(yaw, -1, 1)),
        pitch=f32(np.clip(pitch, -1, 1)),
        gaze_x=_saccades(n, rng),
        gaze_y=0.5 * _saccades(n, rng),
    )
