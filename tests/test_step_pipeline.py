"""The S2V step pipeline (`pipeline.parallel.step_pipeline`) over CPU processes with gloo:
one sampling step per rank, or two, or all four on one rank beside a decode rank, each rank
with a cache of its steps alone, gives every block's final latents bit for bit as one process
running the 4-step cache does (LiveAvatarStream's loop)."""

from __future__ import annotations

import time

import pytest
import torch

from pipeline.liveavatar.s2v_weights import load_published, random_published_state
from pipeline.models.wan.s2v import S2VConfig, S2VTransformer, euler_sigmas
from pipeline.parallel.launch import ParallelOptions, launch
from pipeline.parallel.step_pipeline import (
    StepLayout,
    StreamStart,
    run_step_pipeline,
    share_start,
)

HW = (8, 16)
BLOCKS = 6  # two roll past the 4-block window
SEED, WEIGHTS_SEED = 7, 3
REF_DISTANCE = 25  # the reference starts sliding at block 2

# ~1 s a launch; a rank left waiting for a message that never comes hangs instead
pytestmark = pytest.mark.timeout(120)


def _model() -> S2VTransformer:
    cfg = S2VConfig.tiny()
    model = S2VTransformer(cfg)
    load_published(model, random_published_state(cfg, WEIGHTS_SEED))
    return model.eval().requires_grad_(False)


def _inputs(cfg: S2VConfig) -> tuple[StreamStart, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(11)
    start = StreamStart(
        prompt_BLC=torch.randn(1, 5, cfg.text_dim, generator=g),
        ref_BC1HW=torch.randn(1, cfg.in_dim, 1, *HW, generator=g),
        motion_BCTHW=torch.randn(1, cfg.in_dim, cfg.motion_latent_frames, *HW, generator=g),
        seed=SEED,
        dtype=torch.float32,
        ref_distance=REF_DISTANCE,
    )
    frames = 4 * cfg.frames_per_block
    feats = [
        torch.randn(1, cfg.audio_layers, cfg.audio_dim, frames, generator=g) for _ in range(BLOCKS)
    ]
    return start, feats


def _single_process(steps: int) -> list[torch.Tensor]:
    """LiveAvatarStream's per-block loop: one process, one cache of `steps` steps."""
    model, cfg = _model(), S2VConfig.tiny()
    start, feats = _inputs(cfg)
    timesteps, sigmas = euler_sigmas(steps, start.shift)
    gen = torch.Generator().manual_seed(start.seed)
    cache = model.new_cache(1, HW, steps, "cpu", torch.float32)
    out = []
    with torch.inference_mode():
        model.prefill(cache, start.prompt_BLC, start.ref_BC1HW, start.motion_BCTHW)
        for f in feats:
            audio = model.encode_audio(f)
            x = torch.randn(1, cfg.out_dim, cfg.frames_per_block, *HW, generator=gen)
            for i in range(steps):
                flow = model.forward_block(
                    x, timesteps[i : i + 1], audio, cache, i, None, REF_DISTANCE
                )
                x = (x.float() + (sigmas[i + 1] - sigmas[i]) * flow.float()).to(x.dtype)
            cache.advance()
            out.append(x)
    return out


def _reference(steps: int) -> list[torch.Tensor]:
    """`_single_process` on one thread, as each (forked) worker runs: the same sums."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _single_process(steps)
    finally:
        torch.set_num_threads(threads)


def _worker(rank: int, opts: ParallelOptions, layout: StepLayout, out_path) -> None:
    cfg = S2VConfig.tiny()
    start, feats = _inputs(cfg) if rank == 0 else (None, [])
    shared = share_start(start, src=0, device="cpu")  # only rank 0 built the inputs
    decoded: list[tuple[int, torch.Tensor]] = []  # the decode rank's callback (a VAE's place)
    on_latents = (lambda b, x: decoded.append((b, x))) if layout.decode_rank else None
    t = time.perf_counter()
    kept = run_step_pipeline(rank, layout, cfg, _model, shared, feats, on_latents)
    seconds = time.perf_counter() - t
    if rank == layout.collector:
        if layout.decode_rank:
            assert not kept and [b for b, _ in decoded] == list(range(BLOCKS)), decoded
            kept = [x for _, x in decoded]
        torch.save({"latents": kept, "seconds": seconds}, out_path)


@pytest.mark.parametrize(
    "layout",
    [
        StepLayout(4, decode_rank=True),
        StepLayout(4, decode_rank=False),
        StepLayout(4, step_ranks=2, decode_rank=False),  # two GPUs, two steps each
        StepLayout(4, step_ranks=1),  # two GPUs: every step on one, the decode on the other
    ],
    ids=str,
)
def test_step_ranks_give_the_single_process_latents(tmp_path, layout):
    out_path = tmp_path / "latents.pt"
    t = time.perf_counter()
    # forked: the workers skip their imports (seconds each on a shared 2-core machine)
    launch(_worker, ParallelOptions(world=layout.world), layout, out_path, start_method="fork")
    launched = time.perf_counter() - t
    got = torch.load(out_path)
    want = _reference(layout.steps)
    print(f"{layout}: {launched:.1f} s launched, {got['seconds']:.2f} s streaming")
    assert len(got["latents"]) == BLOCKS
    for b, (x, y) in enumerate(zip(got["latents"], want, strict=True)):
        assert torch.equal(x, y), f"block {b}: max diff {(x - y).abs().max().item():.3g}"


def _failing_worker(rank: int, opts: ParallelOptions, layout: StepLayout, out_path) -> None:
    cfg = S2VConfig.tiny()
    start, feats = _inputs(cfg) if rank == 0 else (None, [])
    shared = share_start(start, src=0, device="cpu")

    def two_then_broken():  # the engine's audio source failing mid-stream
        yield from feats[:2]
        raise OSError("audio device gone")

    try:
        kept = run_step_pipeline(rank, layout, cfg, _model, shared, two_then_broken())
    except OSError:
        assert rank == 0, "only the block source's rank sees its error"
        return
    if rank == layout.collector:
        torch.save(kept, out_path)


def test_a_failing_block_source_stops_every_rank_after_the_blocks_it_gave(tmp_path):
    layout, out_path = StepLayout(4), tmp_path / "kept.pt"
    # without END sent down the line the other ranks would wait for a block: a timeout
    launch(
        _failing_worker,
        ParallelOptions(world=layout.world),
        layout,
        out_path,
        start_method="fork",
    )
    kept = torch.load(out_path)
    want = _reference(layout.steps)[:2]
    assert len(kept) == 2 and all(torch.equal(x, y) for x, y in zip(kept, want, strict=True))


def test_a_layout_of_one_process_or_an_uneven_split_is_refused_and_the_collector_is_placed():
    with pytest.raises(ValueError, match="2 processes or more"):
        StepLayout(4, step_ranks=1, decode_rank=False)
    with pytest.raises(ValueError, match="split evenly"):
        StepLayout(4, step_ranks=3)
    with_vae, without = StepLayout(4), StepLayout(4, decode_rank=False)
    assert (with_vae.world, with_vae.collector, with_vae.next_rank(3)) == (5, 4, 4)
    assert (without.world, without.collector, without.next_rank(3)) == (4, 0, 0)
    assert [with_vae.next_rank(r) for r in range(3)] == [1, 2, 3]
    pairs = StepLayout(4, step_ranks=2, decode_rank=False)
    assert (pairs.world, pairs.steps_per_rank, pairs.next_rank(0), pairs.next_rank(1)) == (
        2,
        2,
        1,
        0,
    )
    assert pairs.sends_audio(0) and not pairs.sends_audio(1)
    one = StepLayout(4, step_ranks=1)  # the DiT on one GPU, the decode on another
    assert (one.world, one.collector, one.next_rank(0), one.sends_audio(0)) == (2, 1, 1, False)
