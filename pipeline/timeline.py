"""The session's open-ended audio timeline: 16 kHz mono samples on an absolute clock.

Audio is appended as it arrives and read back by absolute sample ranges (zeros before the
start and past the end, which is what a chunk at the stream's edge needs). Samples no chunk
can need any more are dropped, so memory stays bounded however long the session runs.
"""

from __future__ import annotations

import numpy as np


class AudioTimeline:
    def __init__(self) -> None:
        self._buf = np.zeros(0, dtype=np.float32)
        self._offset = 0  # absolute index of _buf[0]
        self.total = 0  # samples appended so far

    def append(self, samples: np.ndarray) -> None:
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        # NaN/inf would poison every later chunk; clipping keeps loud input usable
        samples = np.clip(np.nan_to_num(samples, nan=0.0, posinf=1.0, neginf=-1.0), -1.0, 1.0)
        self._buf = np.concatenate([self._buf, samples])
        self.total += samples.size

    def read(self, start: int, end: int) -> np.ndarray:
        out = np.zeros(end - start, dtype=np.float32)
        lo, hi = max(start, self._offset), min(end, self.total)
        if hi > lo:
            out[lo - start : hi - start] = self._buf[lo - self._offset : hi - self._offset]
        return out

    def drop_before(self, sample: int) -> None:
        cut = min(max(0, sample - self._offset), self._buf.size)
        if cut:
            self._buf = self._buf[cut:].copy()
            self._offset += cut

    @property
    def retained(self) -> int:
        return self._buf.size
