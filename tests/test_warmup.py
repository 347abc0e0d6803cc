"""The warm-up's step times, which every call's playout is planned on (`pipeline.warmup`)."""

import time

import numpy as np
import pytest
import torch
from support.fakewan import PRESET
from support.fakewan.engine import FakeWanEngine, FakeWanStream

from pipeline.clock import MODEL_RATE, MODEL_SAMPLES_PER_FRAME
from pipeline.config import load_config
from pipeline.startup import EngineOptions, start_engine
from pipeline.stream import ready_pieces
from pipeline.warmup import FIRST_STEP_SAMPLES, warm_session
from realtime.reference import load_reference


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


@pytest.mark.slow  # compiles the tiny engine (~20 s on 2 cores)
def test_a_compiled_engine_compiles_nothing_in_a_session_after_its_warm_up():
    """Warm-up runs every shape a session meets, so a call's steps (each step's audio just
    in time, as a server feeds them) reuse its graphs: on a GPU, a graph missed there is a
    compile of seconds inside some call's first frame."""
    torch._dynamo.reset()
    graphs = torch._dynamo.utils.counters["stats"]  # of the process: reset() keeps them
    before = graphs["unique_graphs"]
    engine, _ = start_engine(EngineOptions(config="tiny", device="cpu", compile=True))
    warm = graphs["unique_graphs"]
    assert warm > before  # the warm-up compiled them
    audio = (np.random.default_rng(0).standard_normal(6 * MODEL_RATE) * 0.1).astype(np.float32)
    stream = engine.new_stream(load_reference(None, engine.cfg), seed=5)
    made, steps = 0, engine.warmup_steps + 2
    for k in range(steps):
        end = engine.stream_step(k).audio_frames * MODEL_SAMPLES_PER_FRAME
        stream.push_audio(audio[stream.timeline.total : end])
        made += sum(len(batch.frames) for batch in ready_pieces(stream))
    stream.close()
    assert made == sum(engine.stream_step(k).frames for k in range(steps))
    assert graphs["unique_graphs"] == warm
