"""Offload manager on the CPU: the same code path as on the GPU (plain host buffers, no
streams). Outputs with offload on and off are identical; a small budget really streams."""

import numpy as np
import pytest
import torch

from pipeline.config import load_config
from pipeline.diffusion.build import build_models
from pipeline.diffusion.engine import Engine
from pipeline.gate import render_fixed
from pipeline.offload import OffloadConfig, OffloadManager, materialize_blockwise
from pipeline.placement import Placement

DEEP = {"a2v.depth": 4, "sr.depth": 3}


@pytest.fixture(scope="module")
def resident_frames():
    return render_fixed(Engine.load(load_config("tiny", overrides=DEEP), "cpu"), seconds=1.0)


def block_bytes(engine) -> int:
    return max(b.nbytes for s in engine.offloader.stacks.values() for b in s)


def test_offload_gives_identical_frames_while_streaming(resident_frames):
    engine = Engine.load(
        load_config("tiny", overrides=DEEP), "cpu", Placement(offload=OffloadConfig(prefetch=1))
    )
    # room for 2.5 of the largest blocks: every DiT pass must evict and reload
    engine.offloader._budget = int(2.5 * block_bytes(engine))
    frames = render_fixed(engine, seconds=1.0)
    assert np.array_equal(frames, resident_frames)
    stats = engine.offloader.stats
    assert stats.evictions > 10 and stats.loads > 4 + 3
    assert engine.offloader.resident_bytes() <= engine.offloader.budget + block_bytes(engine)


def test_offload_with_room_for_everything_loads_each_block_once(resident_frames):
    engine = Engine.load(
        load_config("tiny", overrides=DEEP), "cpu", Placement(offload=OffloadConfig(budget_gb=1.0))
    )
    frames = render_fixed(engine, seconds=1.0)
    assert np.array_equal(frames, resident_frames)
    assert engine.offloader.stats.loads == 4 + 3
    assert engine.offloader.stats.evictions == 0


def test_weights_live_in_host_buffers_between_uses():
    engine = Engine.load(
        load_config("tiny", overrides=DEEP), "cpu", Placement(offload=OffloadConfig())
    )
    manager = engine.offloader
    block = manager.stacks["a2v"][0]
    weight = engine.modules["a2v"].model.transformer.blocks[0].attn.qkv.weight
    # not loaded yet: the parameter is a view of the block's one flat host buffer
    assert weight.data.untyped_storage().data_ptr() == block.host.untyped_storage().data_ptr()
    manager.before_block("a2v", 0)
    assert weight.data.untyped_storage().data_ptr() == block.device_buf.untyped_storage().data_ptr()
    manager.release_stack("a2v")
    assert block.device_buf is None and manager.resident_bytes() == 0


def test_other_models_blocks_are_evicted_first():
    torch.manual_seed(0)
    stacks = {name: torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3)) for name in "ab"}
    manager = OffloadManager("cpu", OffloadConfig(prefetch=0))
    for name, blocks in stacks.items():
        manager.attach(name, blocks)
    manager._budget = 4 * manager.stacks["a"][0].nbytes
    for i in range(3):
        manager.before_block("a", i)
    manager.before_block("b", 0)
    manager.before_block("b", 1)  # needs room: a's least recently used block (0) goes
    assert ("a", 0) not in manager.resident and ("a", 2) in manager.resident


def test_blockwise_build_matches_shapes_and_runs():
    cfg = load_config("tiny", overrides=DEEP)
    meta = build_models(cfg, "meta", only=("sr",))["sr"]
    manager = OffloadManager("cpu", OffloadConfig())
    model = materialize_blockwise(meta, torch.device("cpu"), torch.float32, 5, manager, "sr")
    assert len(manager.stacks["sr"]) == 3
    low = torch.randn(1, 8, 2, 8, 8)
    out = model(low, torch.randn(1, 8, 2, 16, 16), torch.randn(1, 8, 1, 16, 16))
    assert out.shape == (1, 8, 2, 16, 16) and torch.isfinite(out).all()
