"""The N/I chunk schedule: execution order, every frame once and in order, anchors dropped."""

import numpy as np
import pytest
import torch

from pipeline.config import ScheduleConfig
from pipeline.schedule import ChunkPlan

KIND = {"N": 1, "I": 2}


def test_execution_order_n0_n1_i0_n2_i1():
    plan = ChunkPlan(ScheduleConfig(chunk_latents=6, first_chunk_latents=3, seam_latents=1))
    names = [f"{c.kind}{c.index}" for c in plan.execution_order(4)]
    assert names == ["N0", "N1", "I0", "N2", "I1", "N3", "I2"]


@pytest.mark.parametrize("w,b", [(1, 2), (2, 1), (0, 2)])
def test_plan_emits_each_latent_frame_once_in_order(w, b):
    plan = ChunkPlan(
        ScheduleConfig(chunk_latents=7, first_chunk_latents=5, seam_latents=w, boundary_latents=b)
    )
    emitted = []
    for k in range(5):
        emitted += range(*plan.n_chunk(k).emit) if k == 0 else []
        if k > 0:
            if w:
                emitted += range(*plan.i_chunk(k - 1).emit)
            emitted += range(*plan.n_chunk(k).emit)
    emitted += range(*plan.tail(4))
    assert emitted == list(range(plan.n_end(4)))


@pytest.mark.parametrize("w,ratio", [(0, 1), (1, 2), (2, 4)])
def test_seams_are_where_one_generated_sequence_hands_over_to_the_next(w, ratio):
    """`facecast eval --model` scores these frames: every frame whose latent another chunk
    made than the one before it, and no other."""
    plan = ChunkPlan(ScheduleConfig(chunk_latents=7, first_chunk_latents=5, seam_latents=w))
    owner: list[str] = []
    for k in range(6):
        if k == 0:
            owner += ["N0"] * (plan.n_chunk(0).emit[1] - plan.n_chunk(0).emit[0])
        else:
            if w:
                i = plan.i_chunk(k - 1)
                owner += [f"I{k - 1}"] * (i.emit[1] - i.emit[0])
            n = plan.n_chunk(k)
            owner += [f"N{k}"] * (n.emit[1] - n.emit[0])
    frames = len(owner) * ratio
    handovers = [t * ratio for t in range(1, len(owner)) if owner[t] != owner[t - 1]]
    assert plan.seams(ratio, frames) == handovers


def test_i_chunk_anchors_are_the_last_kept_and_first_body_frames():
    plan = ChunkPlan(ScheduleConfig(chunk_latents=6, first_chunk_latents=4, seam_latents=1))
    i0 = plan.i_chunk(0)
    assert i0.start == plan.n_chunk(0).emit[1] - 1  # last kept frame of N0
    assert i0.end - 1 == plan.n_chunk(1).emit[0]  # first body frame of N1
    assert i0.emit == (i0.start + 1, i0.end - 1)  # anchors are never emitted from I0


def _coded_session(engine, monkeypatch_target):
    """A session whose A2V writes (kind, index, absolute position) into every latent and
    whose SR records which latents reach it, so the schedule can be checked end to end."""
    session = engine.new_stream(np.full((32, 32, 3), 100, np.uint8))
    seen: list[float] = []

    def fake_a2v(ctx, ref):
        c = ctx.chunk
        codes = torch.tensor(
            [KIND[c.kind] * 1e6 + c.index * 1e3 + c.start + i for i in range(c.length)],
            dtype=torch.float64,
        )
        return codes.view(1, 1, -1, 1, 1).expand_as(ctx.noise_BCThw.double()).float().clone()

    def fake_sr(low, context_frames, ref, segment_index):
        seen.extend(low[0, 0, context_frames:, 0, 0].tolist())
        B, C, T, h, w = low.shape
        return torch.zeros(B, C, T - context_frames, 2 * h, 2 * w)

    monkeypatch_target.setattr(session.a2v, "run", fake_a2v)
    monkeypatch_target.setattr(session.sr, "run", fake_sr)
    return session, seen


@pytest.mark.parametrize("seconds", [0.5, 1.03, 2.0, 3.7])
def test_session_frames_once_in_order_with_exact_count(tiny_engine, monkeypatch, seconds):
    session, seen = _coded_session(tiny_engine, monkeypatch)
    audio = np.zeros(round(seconds * 16000), np.float32)
    batches = []
    for piece in np.array_split(audio, 5):  # streamed in uneven pieces
        session.push_audio(piece)
        batches += session.generate_ready()
    batches += session.finish()
    starts = [b.start for b in batches]
    counts = [len(b.frames) for b in batches]
    assert starts == list(np.cumsum([0] + counts[:-1]))  # contiguous, in order, no repeats
    assert sum(counts) == round(seconds * 25)
    positions = [round(code) % 1000 for code in seen]
    assert positions == list(range(len(positions)))  # each latent frame reaches SR once

    plan = session.plan
    by_pos = {round(c) % 1000: (int(c // 1e6), int(c // 1e3) % 1000) for c in seen}
    for k in range(session.next_n - 1):
        i_chunk = plan.i_chunk(k)
        assert by_pos[i_chunk.start][0] == KIND["N"]  # anchor kept from N_k
        if i_chunk.end - 1 in by_pos:
            assert by_pos[i_chunk.end - 1][0] == KIND["N"]  # anchor kept from N_{k+1}
        for pos in range(*i_chunk.emit):
            assert by_pos[pos] == (KIND["I"], k)  # the seam itself comes from I_k
    order = [f"{c.kind}{c.index}" for c in session.chunk_log]
    expected = ["N0"] + [x for k in range(1, session.next_n) for x in (f"N{k}", f"I{k - 1}")]
    assert order == expected


def test_rolling_memory_is_bounded(tiny_engine):
    """Latents and audio kept by a session do not grow with the stream's length."""
    session = tiny_engine.new_stream(np.full((32, 32, 3), 100, np.uint8))
    sizes = []
    for _ in range(16):  # 8 s: many chunks past the first
        session.push_audio(np.zeros(16000 // 2, np.float32))
        session.generate_ready()
        sizes.append((len(session.latents), session.timeline.retained))
    cfg = tiny_engine.cfg
    r, sch, a = cfg.diffusion.vae.temporal_ratio, cfg.schedule, cfg.diffusion.audio
    window = (sch.chunk_latents + sch.boundary_latents) * r + a.context_frames + a.lookahead_frames
    bound = 16000 // 2 + window * 640  # one push plus one chunk's audio window
    assert all(n_lat <= max(sch.boundary_latents, sch.seam_latents + 1) for n_lat, _ in sizes)
    assert all(kept <= bound for _, kept in sizes)
    assert session.frames_emitted > 160
