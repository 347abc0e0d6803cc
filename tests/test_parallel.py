"""One session over several processes (gloo on the CPU): Ulysses sequence parallelism with
head groups and FSDP2 weight sharding give the single-process outputs."""

import json

import numpy as np
import pytest
import torch
import torch.distributed as dist

from pipeline.config import load_config
from pipeline.diffusion.build import build_models
from pipeline.diffusion.engine import Engine
from pipeline.parallel.launch import ParallelOptions, launch, parallelize_engine
from pipeline.parallel.ulysses import SequenceParallelStack, UlyssesAttention

OVERRIDES = {"a2v.heads": 8, "sr.heads": 8, "sr.dim": 64}


def _inputs(cfg):
    g = torch.Generator().manual_seed(0)
    C = cfg.diffusion.vae.latent_channels
    x = torch.randn(1, C, 4, 8, 8, generator=g)
    known = torch.randn(1, C, 4, 8, 8, generator=g)
    mask = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    audio = torch.randn(
        1, 4 * cfg.diffusion.vae.temporal_ratio, cfg.diffusion.audio.out_dim, generator=g
    )
    ref_low, ref_full = (
        torch.randn(1, C, 1, 8, 8, generator=g),
        torch.randn(1, C, 1, 16, 16, generator=g),
    )
    return (x, torch.tensor([0.7]), known, mask, audio, ref_low), (
        x,
        torch.randn(1, C, 4, 16, 16, generator=g),
        ref_full,
    )


def _session_frames(engine) -> np.ndarray:
    s = engine.new_stream(np.full((96, 96, 3), 120, np.uint8), seed=3)
    t = np.arange(int(16000 * 1.3)) / 16000
    s.push_audio((0.3 * np.sin(2 * np.pi * 200 * t) * (t % 0.4 < 0.2)).astype(np.float32))
    return np.concatenate([b.frames for b in s.finish()])


def _worker(rank, opts, out_dir, compare_groups):
    cfg = load_config("tiny", overrides=OVERRIDES)
    a2v_in, sr_in = _inputs(cfg)
    single = build_models(cfg)
    with torch.inference_mode():
        want = {"a2v": single["a2v"].eval()(*a2v_in), "sr": single["sr"].eval()(*sr_in)}
    want_frames = _session_frames(Engine.load(cfg))

    engine = Engine.load(cfg)
    parallelize_engine(engine, opts)
    a2v, sr = engine.modules["a2v"].model, engine.modules["sr"].model
    assert isinstance(a2v.transformer, SequenceParallelStack)
    assert isinstance(sr.transformer.stack.blocks[0].attn.attend, UlyssesAttention)
    with torch.inference_mode():
        got = {"a2v": a2v(*a2v_in), "sr": sr(*sr_in)}
    frames = _session_frames(engine)
    result = {k: (got[k] - want[k]).abs().max().item() for k in got}
    result["frames_max_abs"] = int(np.abs(frames.astype(int) - want_frames).max())
    result["frames_equal_shape"] = frames.shape == want_frames.shape

    if compare_groups:
        # the same attention, one all-to-all per attention vs. pipelined head groups
        g = torch.Generator().manual_seed(rank)
        q, k, v = (torch.randn(1, 8, 24, 8, generator=g) for _ in range(3))
        inner = a2v.transformer.stack.blocks[0].attn.attend.inner
        ungrouped = UlyssesAttention(inner, dist.group.WORLD, 1)(q, k, v)
        grouped = UlyssesAttention(inner, dist.group.WORLD, 2)(q, k, v)
        result["groups_max_abs"] = (grouped - ungrouped).abs().max().item()
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))


@pytest.mark.slow
@pytest.mark.parametrize("world,groups", [(2, 2), (4, 2)])
def test_sharded_session_equals_single_process(tmp_path, world, groups):
    launch(_worker, ParallelOptions(world=world, head_groups=groups), tmp_path, groups > 1)
    for rank in range(world):
        r = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert r["a2v"] <= 1e-4 and r["sr"] <= 1e-4, r
        assert r["frames_equal_shape"] and r["frames_max_abs"] <= 1, r
        if groups > 1:
            assert r["groups_max_abs"] <= 1e-6, r
