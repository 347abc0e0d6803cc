"""Motion that does not come from the words: blinks and head sway, per absolute frame.

Everything is made in frame order from a seed, so a stream gives the same motion however
its audio was split: blinks are scheduled ahead from a seeded generator (an interval of
about 1-6 s, a fast close and a slower open, as the synthetic world's `blink_track`), the
head sways along a few seeded sinusoids, more while the person talks (an exponential
average of the jaw, causal), never frozen in silence. The sway is small (about a pixel at
256x256) and quick (periods of 2-7 s): every 10 s window holds several periods, so
windows look alike and the photo's likeness does not drift. State is a few floats and the next
blinks: nothing grows with the stream.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from pipeline.clock import FPS

IDLE_PARAMS = ("blink", "head_x", "head_y", "head_roll")
# Sway amplitudes (face widths, radians) at talking gain 1 and photo.head_motion 1.
_SWAY = (0.006, 0.004, 0.007)
_TALK_TAU_S = 0.4


class IdleMotion:
    def __init__(self, seed: int, head_motion: float = 1.0, blink: bool = True) -> None:
        self.rng = np.random.default_rng([seed, 16])
        self.head_motion = head_motion
        self.blink_on = blink
        # per axis: 4 sinusoids, frequency in Hz, phase, weight
        self.waves = [
            (
                self.rng.uniform(0.15, 0.5, 4),
                self.rng.uniform(0, 2 * np.pi, 4),
                self.rng.uniform(0.5, 1, 4),
            )
            for _ in _SWAY
        ]
        self.blinks: deque[tuple[float, float, float, float]] = deque()
        self.horizon = float(self.rng.uniform(0.5, 2.5))  # time of the next blink to schedule
        self.talk = 0.0
        self.next_frame = 0

    def frames(self, start: int, jaw: np.ndarray) -> np.ndarray:
        """(T, 4) blink, head_x, head_y, head_roll for frames [start, start + T); called in
        frame order (the talking gain carries over from the previous call)."""
        assert start == self.next_frame, "idle motion is made in frame order"
        n = len(jaw)
        self.next_frame = start + n
        t = (start + np.arange(n) + 0.5) / FPS
        a = float(np.exp(-1.0 / (_TALK_TAU_S * FPS)))
        talk = np.empty(n, np.float32)
        for i, j in enumerate(jaw):
            self.talk = a * self.talk + (1 - a) * float(j > 0.05)
            talk[i] = self.talk
        gain = (0.7 + 0.6 * talk) * self.head_motion
        sway = []
        for amp, (freq, phase, weight) in zip(_SWAY, self.waves, strict=True):
            w = np.sin(2 * np.pi * freq[None] * t[:, None] + phase[None]) @ weight
            sway.append(amp * gain * w / np.sqrt(len(freq) / 2))
        lid = self._lids(t) if self.blink_on else np.zeros(n)
        return np.stack([lid, *sway], axis=1).astype(np.float32)

    def _lids(self, t: np.ndarray) -> np.ndarray:
        while self.horizon < t[-1] + 1.0:
            close, hold, open_ = (
                self.rng.uniform(0.05, 0.09),
                self.rng.uniform(0.0, 0.05),
                self.rng.uniform(0.1, 0.17),
            )
            self.blinks.append((self.horizon, close, hold, open_))
            self.horizon += max(1.0, float(self.rng.gamma(4.0, 0.9)))
        while self.blinks and self.blinks[0][0] + 0.5 < t[0]:
            self.blinks.popleft()
        out = np.zeros(len(t))
        for when, close, hold, open_ in self.blinks:
            d = t - when
            shape = np.where(
                d < close + hold,
                np.clip(d / close, 0, 1),
                np.clip(1 - (d - close - hold) / open_, 0, 1),
            ) * (d >= 0)
            out = np.maximum(out, shape)
        return out * out * (3 - 2 * out)  # smoothstep: the lid accelerates and settles
