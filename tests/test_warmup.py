"""The warm-up's step times, which every call's playout is planned on (`pipeline.warmup`)."""

import time

from support.fakewan import PRESET
from support.fakewan.engine import FakeWanEngine, FakeWanStream

from pipeline.config import load_config
from pipeline.warmup import FIRST_STEP_SAMPLES, warm_session


def test_one_slow_first_step_does_not_set_every_calls_first_frame(fakewan, monkeypatch):
    """The first stream's step 0 hits a hiccup (a kernel plan, a page fault): the first
    frame every call is planned on is the median of several fresh streams' step 0."""
    step0_sleeps = iter([0.30] + [0.02] * (FIRST_STEP_SAMPLES - 1))  # one hiccup, then ordinary
    made = FakeWanStream.make_chunk

    def make_chunk(self, k, chunk):
        time.sleep(next(step0_sleeps) if k == 0 else 0.01)
        yield from made(self, k, chunk)

    monkeypatch.setattr(FakeWanStream, "make_chunk", make_chunk)
    engine = FakeWanEngine.load(load_config(PRESET))
    times = warm_session(engine, seed=0, timed=True)
    assert 0.02 <= times["first"] < 0.1, times  # 0.3 s with one sample
    assert times["steady"] < 0.1, times
