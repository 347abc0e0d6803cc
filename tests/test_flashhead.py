"""SoulX-FlashHead from its published layout: parity with the authors' code, the loader's
errors, render and serve through the commands users run.

The parity fixture (`fixtures/flashhead/parity_tiny.safetensors`) holds the authors' own
outputs on random weights at a tiny shape (`bench/parity/flashhead_reference.py`, their code
run from a checkout of theirs, then `flashhead_compare.py --write-fixture`); the weights and
the DiT's inputs are re-made here from the same seeds.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from pipeline.clock import MODEL_RATE, MODEL_SAMPLES_PER_FRAME
from pipeline.errors import CheckpointError, ConfigError
from pipeline.flashhead.color import ColorMatch, lab_stats, srgb_to_lab
from pipeline.flashhead.dit import WanDiTConfig
from pipeline.flashhead.random_release import write_random_release, write_wav2vec
from pipeline.flashhead.weights import random_dit_state, write_release_dit
from pipeline.models.wan.vae import WanVAEConfig, random_checkpoint
from pipeline.startup import EngineOptions, start_engine
from pipeline.stream import FrameBatch

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "flashhead" / "parity_tiny.safetensors"
SPEECH = ROOT / "pipeline" / "assets" / "sample_speech.wav"
PORTRAIT = ROOT / "pipeline" / "assets" / "portraits" / "grace_hopper.jpg"


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """A random release in the published layout, at test sizes (Pro and Lite)."""
    return write_random_release(tmp_path_factory.mktemp("flashhead"), "test", seed=3, lite=True)


def engine_options(release, model="flashhead-pro", size=32, overrides=(), **kw) -> EngineOptions:
    weights, wav2vec = release
    overrides = {"video.width": size, "video.height": size, **dict(overrides)}
    kw = {"device": "cpu", "warmup": False, **kw}
    return EngineOptions(
        model=model, weights=str(weights), wav2vec=str(wav2vec), overrides=overrides, **kw
    )


def facecast(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "facecast", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )


# -- parity with the authors' code ------------------------------------------------------------


@pytest.fixture(scope="module")
def parity_release(tmp_path_factory):
    """The fixture's release re-made from its seeds: the authors' tiny shape."""
    with safe_open(str(FIXTURE), "pt") as f:
        meta = json.loads(f.metadata()["meta"])
    root = tmp_path_factory.mktemp("parity")
    seed = meta["seed"]
    dit = WanDiTConfig(num_layers=meta["dit_layers"], ffn_dim=meta["dit_ffn"])
    write_release_dit(root / "release" / "Model_Pro", dit, random_dit_state(dit, seed))
    (root / "release" / "VAE_Wan").mkdir(parents=True)
    vae = random_checkpoint(WanVAEConfig(base_dim=meta["vae_dim"]), seed + 1)
    torch.save(vae, root / "release" / "VAE_Wan" / "Wan2.1_VAE.pth")
    wav2vec = {k: tuple(v) if isinstance(v, list) else v for k, v in meta["wav2vec"].items()}
    write_wav2vec(root / "wav2vec", wav2vec, seed + 2)
    return (root / "release", root / "wav2vec"), meta, load_file(str(FIXTURE))


@pytest.mark.slow
def test_the_dit_wav2vec2_and_a_three_chunk_render_match_the_authors(parity_release):
    release, meta, ref = parity_release
    engine, _ = start_engine(engine_options(release, size=meta["size"]))
    models = engine.models
    # the DiT forward on the reference run's random inputs (drawn in its order)
    g = torch.Generator().manual_seed(meta["seed"] + 2)
    lat = meta["size"] // 8
    x = torch.randn(1, 16, 9, lat, lat, generator=g)
    y = torch.randn(1, 16, 9, lat, lat, generator=g)
    audio = torch.randn(1, 33, 5, 12, 768, generator=g)
    with torch.inference_mode():
        out = models.dit(x, torch.tensor([937.5]), models.dit.project_audio(audio), y)
    torch.testing.assert_close(out, ref["dit.out"], atol=1e-4, rtol=1e-4)

    speech = ref["audio"].numpy()
    samples = engine.new_frames * MODEL_SAMPLES_PER_FRAME
    window = np.concatenate([np.zeros(8 * MODEL_RATE - samples, np.float32), speech[:samples]])
    feats = models.speech.frames(window, 200)
    torch.testing.assert_close(feats[190:200], ref["w2v.features_190_200"], atol=1e-4, rtol=1e-4)

    stream = engine.new_stream(ref["reference"].numpy(), seed=meta["seed"])
    seen = {}
    sample = engine._sample

    def keep(jobs):
        lat = sample(jobs)
        seen["latents"] = lat[0]
        return lat

    engine._sample = keep  # the latents the VAE decodes, beside the authors'
    try:
        for k in range(meta["chunks"]):
            stream.push_audio(speech[k * samples : (k + 1) * samples])
            pieces = stream.generate_ready()  # Pro: a chunk's frames in pieces, in order
            batch = FrameBatch(pieces[0].start, np.concatenate([p.frames for p in pieces]))
            torch.testing.assert_close(
                seen["latents"], ref[f"chunk{k}.latents"], atol=1e-4, rtol=1e-4
            )
            # the motion latents handed to the next chunk
            torch.testing.assert_close(stream.motion, ref[f"chunk{k}.motion"], atol=1e-4, rtol=1e-4)
            theirs = ref[f"chunk{k}.frames"].numpy().astype(int)
            diff = np.abs(batch.frames.astype(int) - theirs)
            assert batch.start == k * engine.new_frames
            assert diff.max() <= 1 and (diff == 0).mean() > 0.999, (k, diff.max(), diff.mean())
    finally:
        stream.close()


def test_pro_sends_a_chunks_first_new_frames_before_the_rest_and_the_same_frames(release):
    """Decoded in passes (the GPU's default), a chunk leaves in pieces: the first latent
    frame with new video frames alone, then two latent frames a pass; the frames are those
    of one wide pass, and so is the motion handed to the next chunk."""
    audio = (0.2 * np.sin(np.arange(3 * MODEL_RATE) * 0.05)).astype(np.float32)
    runs = []
    for per_pass in (2, 0):
        engine, _ = start_engine(
            engine_options(release, overrides={"flashhead.decode_pass_latents": per_pass})
        )
        stream = engine.new_stream(np.full((48, 40, 3), 120, np.uint8), seed=5)
        stream.push_audio(audio)
        pieces = stream.generate_ready()
        runs.append((pieces, stream.motion.clone()))
        stream.close()
    (passed, motion), (whole, wide_motion) = runs
    assert [len(p.frames) for p in whole] == [28, 28]  # 3 s: two chunks of 28 new frames
    # each chunk: the 4 new frames of its third latent frame (the first two, 5 frames, are
    # the motion carried over), then 8 frames (two latent frames) a pass
    assert [len(p.frames) for p in passed] == [4, 8, 8, 8] * 2
    assert [p.start for p in passed] == sorted(p.start for p in passed)
    a = np.concatenate([p.frames for p in passed]).astype(int)
    b = np.concatenate([p.frames for p in whole]).astype(int)
    assert a.shape == b.shape and np.abs(a - b).max() <= 1
    torch.testing.assert_close(motion, wide_motion, atol=1e-4, rtol=1e-4)


def test_pro_has_the_next_chunks_motion_queued_before_a_chunks_last_frames_leave(release):
    """The motion re-encode is queued before the host waits for a chunk's last decode pass
    (the GPU re-encodes while the host hands those frames on): when a chunk's last piece
    arrives the stream already holds the next chunk's motion, and it is the one the chunk
    leaves it with."""
    engine, _ = start_engine(
        engine_options(release, overrides={"flashhead.decode_pass_latents": 2})
    )
    stream = engine.new_stream(np.full((48, 40, 3), 120, np.uint8), seed=5)
    stream.push_audio((0.2 * np.sin(np.arange(2 * MODEL_RATE) * 0.05)).astype(np.float32))
    motions, last = [stream.motion], None
    for piece in stream.iter_ready():
        last = piece
        motions.append(stream.motion)
    assert last is not None and len(motions) == 1 + 4  # one chunk: 4 + 8 + 8 + 8 frames
    # unchanged while the chunk's first pieces leave, the new motion with its last one
    assert all(m is motions[0] for m in motions[1:4]) and motions[4] is not motions[0]
    assert stream.motion is motions[4]
    stream.close()


def test_start_up_tells_the_batched_warm_up_too(release):
    """An engine that batches its sessions' steps times batches at warm-up (its capacity):
    start-up says so while it runs, after the single steps."""
    phases: list[str] = []
    start_engine(engine_options(release, warmup=True), phases.append)
    assert phases[0] == "loading flashhead-pro" and phases[-2:] == [
        "warm-up: timing a session's steps",
        "warm-up: timing batched steps",
    ], phases


def test_speech_graphs_reach_the_engines_speech_encoder_and_change_no_frame(release):
    """`runtime.speech_graphs`: wav2vec2 through `pipeline.graphs.ShapeGraphs` (CUDA graphs
    on a GPU, tested in tests/test_graphs.py there; the function itself on a CPU)."""
    from pipeline.graphs import ShapeGraphs

    plain = start_engine(engine_options(release))[0]
    graphed = start_engine(engine_options(release, overrides={"runtime.speech_graphs": True}))[0]
    assert isinstance(graphed.models.speech._states, ShapeGraphs)
    assert not isinstance(plain.models.speech._states, ShapeGraphs)
    speech = 0.2 * np.sin(np.arange(2 * plain.new_frames * MODEL_SAMPLES_PER_FRAME) * 0.05)
    frames = []
    for engine in (plain, graphed):
        stream = engine.new_stream(np.full((48, 40, 3), 120, np.uint8), seed=3)
        stream.push_audio(speech.astype(np.float32))
        frames.append(np.concatenate([b.frames for b in stream.generate_ready()]))
        stream.close()
    np.testing.assert_array_equal(frames[0], frames[1])


@pytest.fixture
def emulated_fp8_kernel(monkeypatch) -> dict[str, int]:
    """cuDNN's FP8 attention pretended to run here, computed as Hopper does (e4m3 inputs,
    fp32 sums, O rounded to e4m3 on v's scale); the count of its calls."""
    from pipeline.kernels import fp8_attention as kernels

    calls = {"kernel": 0}

    def kernel(q8, dq, k8, v8, dk, dv):
        calls["kernel"] += 1
        widen = [x.float() * d for x, d in ((q8, dq), (k8, dk), (v8, dv))]
        o = torch.nn.functional.scaled_dot_product_attention(*widen)
        return (o / dv).clamp(-448, 448).to(torch.float8_e4m3fn), dv

    monkeypatch.setattr(kernels, "fp8_refusal", lambda q: None)
    monkeypatch.setattr("pipeline.flashhead.engine.fp8_refusal", lambda q: None)
    monkeypatch.setattr(kernels, "fp8_attention_e4m3", kernel)
    return calls


def _frames(engine, seconds: float = 2.3) -> np.ndarray:
    """Two chunks of a stream from a photo of noise (a flat photo's frames are flat whatever
    the DiT does: the colour correction makes them so)."""
    speech = 0.2 * np.sin(np.arange(int(seconds * MODEL_RATE)) * 0.05)
    photo = np.random.default_rng(0).integers(0, 256, (48, 40, 3), dtype=np.uint8)
    stream = engine.new_stream(photo, seed=3)
    stream.push_audio(speech.astype(np.float32))
    frames = np.concatenate([b.frames for b in stream.generate_ready()])
    stream.close()
    return frames


def test_fp8_attention_where_cudnn_cannot_run_is_the_exact_attention_said_once(release, caplog):
    """`flashhead.attention: fp8` on this CPU: cuDNN's FP8 kernel cannot run, so every block
    keeps the exact SDPA (the same frames as `sdpa`), the reason said once in the log; a
    backend FlashHead does not take is one line naming the key."""
    from pipeline.models.attention import say_fallback

    exact = _frames(
        start_engine(engine_options(release, overrides={"flashhead.attention": "sdpa"}))[0]
    )
    say_fallback.cache_clear()  # said once a process: this test's own line
    with caplog.at_level("WARNING", logger="facecast.attention"):
        engine = start_engine(engine_options(release, overrides={"flashhead.attention": "fp8"}))[0]
        frames = _frames(engine)
    assert not any(b.self_attn.fp8_inputs for b in engine.models.dit.audio_blocks())
    np.testing.assert_array_equal(frames, exact)
    said = [r.getMessage() for r in caplog.records if "falls back" in r.getMessage()]
    assert len(said) == 1 and "'fp8'" in said[0], said
    with pytest.raises(ConfigError, match="flashhead.attention"):
        start_engine(engine_options(release, overrides={"flashhead.attention": "int8"}))


def test_fp8_attention_quantises_in_the_block_and_keeps_the_frames_close(
    release, monkeypatch, emulated_fp8_kernel, caplog
):
    """Where the kernel runs (emulated), each block hands it q, k and v it quantised itself and
    widens O itself: one kernel call a block a sampling step, the frames within a few grey
    levels of the exact ones (not identical: FP8 rounds). A shape the kernel declines goes
    to the exact SDPA, the frames then identical. `fp8_outputs` takes each block's two
    attention output projections into --precision fp8 as well; left `auto` (the default),
    the attention turns to FP8 when the linears do."""
    from pipeline.kernels import fp8_attention as kernels
    from pipeline.models.attention import say_fallback

    sdpa = engine_options(release, overrides={"flashhead.attention": "sdpa"})
    exact = _frames(start_engine(sdpa)[0])
    engine = start_engine(engine_options(release, overrides={"flashhead.attention": "fp8"}))[0]
    blocks = engine.models.dit.audio_blocks()
    assert all(b.self_attn.fp8_inputs for b in blocks)
    frames = _frames(engine)
    chunks = len(frames) // engine.new_frames
    assert emulated_fp8_kernel["kernel"] == chunks * engine.cfg.flashhead.steps * len(blocks)
    diff = np.abs(frames.astype(int) - exact.astype(int))
    assert 0 < diff.mean() < 1 and diff.max() < 48, (diff.mean(), diff.max())

    monkeypatch.setattr(kernels, "fp8_attention_e4m3", lambda *args: "cuDNN declined")
    say_fallback.cache_clear()
    np.testing.assert_array_equal(_frames(engine), exact)

    plain = engine_options(release, overrides={"flashhead.fp8_outputs": False})
    outputs = engine_options(release, overrides={"flashhead.fp8_outputs": True})
    assert len(start_engine(plain)[0].fp8_targets("static")) == 4 * len(blocks)
    assert len(start_engine(outputs)[0].fp8_targets("static")) == 6 * len(blocks)

    # `auto`: the FP8 attention comes with FP8 linears, not before them
    from pipeline.precision import apply_fp8

    auto, report = start_engine(engine_options(release))  # `auto` is the default
    assert not any(b.self_attn.fp8_inputs for b in auto.models.dit.audio_blocks())
    assert report.to_dict()["self_attention"] == "sdpa"  # what ran, in the bench's JSON
    with caplog.at_level(logging.INFO, logger="facecast.flashhead"):
        apply_fp8(auto, "static", emulate=True)
    assert all(b.self_attn.fp8_inputs for b in auto.models.dit.audio_blocks())
    assert "self-attention: cuDNN's FP8 kernel" in caplog.text
    assert auto.kernels == {"self_attention": "fp8"}

    # where the kernel cannot run, `auto` stays exact and the log says why (the speed it costs)
    caplog.clear()
    missing = "cudnn-frontend is not installed (pip install 'nvidia-cudnn-frontend==1.16.0')"
    monkeypatch.setattr("pipeline.flashhead.engine.fp8_refusal", lambda q: missing)
    bare = start_engine(engine_options(release))[0]
    with caplog.at_level(logging.INFO, logger="facecast.flashhead"):
        apply_fp8(bare, "static", emulate=True)
    assert not any(b.self_attn.fp8_inputs for b in bare.models.dit.audio_blocks())
    assert f"self-attention: exact SDPA ({missing})" in caplog.text


@pytest.mark.slow  # two tiny engines compiled on the CPU
@pytest.mark.parametrize("outputs", [False, True])
def test_compiled_fp8_pro_makes_the_eager_fp8_frames(release, outputs):
    """`--compile --precision fp8` as on the GPU (the FP8 GEMM emulated by the CPU's own
    kernels, which take their operands as strictly as the GPU's): the compiled blocks make
    the eager FP8 engine's frames, within a grey level. The first block's tokens arrive as
    a transposed view; once the compiled norm kept those strides, the FP8 GEMM refused them
    on the H200."""
    from pipeline.precision import apply_fp8

    overrides = {"flashhead.attention": "sdpa", "flashhead.fp8_outputs": outputs}
    engine = start_engine(engine_options(release, overrides=overrides))[0]
    assert apply_fp8(engine, "static", emulate=True) == (6 if outputs else 4) * len(
        engine.models.dit.audio_blocks()
    )
    eager = _frames(engine, 1.5)
    engine.compile()
    compiled = _frames(engine, 1.5)
    diff = np.abs(eager.astype(int) - compiled.astype(int))
    assert diff.max() <= 1, (diff.mean(), diff.max())


def test_fp8_attention_gives_each_stream_of_a_batch_what_it_gets_alone(
    release, emulated_fp8_kernel
):
    """Batched sessions under the FP8 attention: each stream's q, k and v have scales of
    their own, so a loud stream beside a quiet one changes nothing of the quiet one's
    output (one scale over the batch would round the quiet one coarser)."""
    engine = start_engine(engine_options(release, overrides={"flashhead.attention": "fp8"}))[0]
    dit = engine.models.dit
    attention = dit.audio_blocks()[0].self_attn
    assert attention.fp8_inputs
    rope = dit.rope((3, 2, 2), engine.device)
    x = torch.randn(2, 12, dit.cfg.dim, generator=torch.Generator().manual_seed(0))
    x[1] *= 40  # a loud stream beside a quiet one
    with torch.no_grad():
        both = attention(x, rope)
        alone = torch.cat([attention(x[i : i + 1], rope) for i in range(2)])
    assert torch.equal(both, alone)


@pytest.mark.parametrize("model", ["flashhead-pro", "flashhead-lite"])
def test_two_streams_batched_make_each_ones_frames_as_alone(release, model):
    """Two sessions whose steps wait together run as one batch (the DiT, the decode and
    the motion over both), and each gets the frames it would get alone: its own noise,
    colour and motion, whatever the other's photo and speech."""
    import threading

    engine, _ = start_engine(engine_options(release, model=model))
    photos = [np.full((48, 40, 3), 120, np.uint8), np.full((40, 48, 3), (30, 160, 90), np.uint8)]
    t = np.arange(int(2.4 * MODEL_RATE))
    speech = [(0.2 * np.sin(t * f)).astype(np.float32) for f in (0.05, 0.013)]

    per_chunk = engine.new_frames * MODEL_SAMPLES_PER_FRAME
    chunks = len(speech[0]) // per_chunk

    def step(stream, audio, c: int, out: list) -> None:
        stream.push_audio(audio[c * per_chunk : (c + 1) * per_chunk])
        out += [b.frames for b in stream.generate_ready()]

    alone: list[list] = [[], []]
    for i in range(2):
        stream = engine.new_stream(photos[i], seed=11 + i)
        for c in range(chunks):
            step(stream, speech[i], c, alone[i])
        stream.close()
    streams = [engine.new_stream(photos[i], seed=11 + i) for i in range(2)]
    together: list[list] = [[], []]
    batches = engine.batcher.batches
    # the second starts a step later: its first step (one latent frame of motion, the
    # reference's) meets the first's second step (two, its own last frames)
    for c in range(chunks + 1):
        jobs = [(i, c - i) for i in range(2) if 0 <= c - i < chunks]
        with engine.batcher.gathering():  # the steps wait, then run together
            threads = [
                threading.Thread(target=step, args=(streams[i], speech[i], n, together[i]))
                for i, n in jobs
            ]
            for th in threads:
                th.start()
            deadline = time.monotonic() + 30
            while engine.batcher.waiting < len(jobs) and time.monotonic() < deadline:
                time.sleep(0.01)
        for th in threads:
            th.join(120)
    assert chunks >= 2 and engine.batcher.batches - batches == chunks + 1
    for i in range(2):
        a, b = np.concatenate(alone[i]).astype(int), np.concatenate(together[i]).astype(int)
        assert a.shape == b.shape == (chunks * engine.new_frames, 32, 32, 3)
        diff = np.abs(a - b)
        assert diff.max() <= 1 and (diff == 0).mean() > 0.999, (i, diff.max(), diff.mean())
    alone = [np.concatenate(a) for a in alone]
    assert np.abs(alone[0].astype(int) - alone[1].astype(int)).mean() > 10  # not one video


# -- the loader: one line naming the file --------------------------------------------------------


def test_a_missing_or_damaged_release_is_one_line_naming_the_file(release, tmp_path):
    weights, wav2vec = release
    with pytest.raises(CheckpointError, match="weights folder not found"):
        start_engine(engine_options((tmp_path / "nowhere", wav2vec)))
    broken = tmp_path / "broken"
    subprocess.run(["cp", "-r", str(weights), str(broken)], check=True)
    model = broken / "Model_Pro" / "diffusion_pytorch_model.safetensors"
    data = model.read_bytes()
    model.write_bytes(data[: len(data) // 2])  # an interrupted download
    with pytest.raises(CheckpointError) as err:
        start_engine(engine_options((broken, wav2vec)))
    assert str(model) in str(err.value) and "truncated" in str(err.value)
    assert "\n" not in str(err.value)


def _edit_dit(release, tmp_path, edit) -> Path:
    weights, _ = release
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(weights), str(copy)], check=True)
    path = copy / "Model_Pro" / "diffusion_pytorch_model.safetensors"
    state = load_file(str(path))
    edit(state)
    save_file(state, str(path))
    return copy


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s.update(stray=torch.zeros(3)), "key 'stray' does not map"),
        (lambda s: s.pop("blocks.0.ffn.0.weight"), "missing key 'blocks.0.ffn.0.weight'"),
        (
            lambda s: s.update({"head.head.weight": torch.zeros(3, 3)}),
            "'head.head.weight' has shape",
        ),
        (
            lambda s: s.update(
                {"blocks.0.self_attn.q.weight": torch.zeros(32, 32, dtype=torch.int32)}
            ),
            "not floating point",
        ),
    ],
)
def test_a_checkpoint_that_does_not_match_names_the_key(release, tmp_path, edit, message):
    copy = _edit_dit(release, tmp_path, edit)
    with pytest.raises(CheckpointError, match=message) as err:
        start_engine(engine_options((copy, release[1])))
    assert "diffusion_pytorch_model" in str(err.value) or "Model_Pro" in str(err.value)


def test_a_bad_config_json_and_a_missing_wav2vec_folder_are_one_line(release, tmp_path):
    weights, wav2vec = release
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(weights), str(copy)], check=True)
    config = copy / "Model_Pro" / "config.json"
    raw = json.loads(config.read_text())
    raw["num_heads"] = "twelve"
    config.write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match=r"config.json: 'num_heads' must be a positive"):
        start_engine(engine_options((copy, wav2vec)))
    with pytest.raises(CheckpointError, match=r"config.json: file not found \(--wav2vec wants"):
        start_engine(engine_options((weights, tmp_path)))
    with pytest.raises(ConfigError, match="needs --weights and --wav2vec"):
        start_engine(EngineOptions(model="flashhead-pro", device="cpu"))


def served_engine(release, batch_streams: int = 2):
    """A tiny Pro engine in this process, warmed up: its batches timed, its capacity known."""
    weights, wav2vec = release
    options = EngineOptions(
        model="flashhead-pro",
        weights=str(weights),
        wav2vec=str(wav2vec),
        device="cpu",
        overrides={"video.width": 16, "video.height": 16, "flashhead.batch_streams": batch_streams},
    )
    engine, _ = start_engine(options)
    return engine


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_the_server_admits_the_sessions_its_engine_measured_it_carries(release, tmp_path):
    """No --max-sessions: as many sessions as the warm-up measured fit at real time (a
    batch of that many steps within 85% of the play time it makes); the next gets 503."""
    import asyncio

    import aiohttp
    from support.realtime import make_speech_wav, running_server

    from facecast_client import FacecastClient, PcmSource
    from pipeline.warmup import capacity

    engine = await asyncio.to_thread(served_engine, release)
    fits = engine.capacity
    assert fits == capacity(engine.step_seconds, engine.chunk_seconds) and 1 <= fits <= 2
    assert "steady_x2" in engine.step_seconds  # the warm-up timed a batch of two
    speech = make_speech_wav(tmp_path / "s.wav", [0.3, "One two three.", 0.3])
    async with running_server(engine) as (url, _), aiohttp.ClientSession() as http:
        health = await (await http.get(f"{url}/healthz")).json()
        assert health["capacity"] == health["max_sessions"] == health["free"] == fits
        clients = [FacecastClient(url, PcmSource.from_wav(speech.path)) for _ in range(fits)]
        for client in clients:
            await client.connect()
        health = await (await http.get(f"{url}/healthz")).json()
        assert health["free"] == 0 and health["sessions"] == fits
        extra = FacecastClient(url, PcmSource.from_wav(speech.path))
        with pytest.raises(ConnectionError, match="503.*full"):
            await extra.connect()
        await extra.close()
        for client in clients:
            await client.close()


def test_a_stalled_stream_holds_no_batch_back(release):
    """Two streams on one batching engine; one stops getting audio (its client froze) with
    its worker idle: no batch waits for it, the other's steps run alone and on time, and
    the stalled one goes on where it stopped when its audio comes back."""
    import threading

    engine, _ = start_engine(engine_options(release))
    per_chunk = engine.new_frames * MODEL_SAMPLES_PER_FRAME
    speech = (0.2 * np.sin(np.arange(6 * per_chunk) * 0.05)).astype(np.float32)
    steady, stalls = (
        engine.new_stream(np.full((48, 40, 3), v, np.uint8), seed=v) for v in (90, 150)
    )
    stalls.push_audio(speech[:per_chunk])
    assert len(np.concatenate([b.frames for b in stalls.generate_ready()])) == engine.new_frames
    batches, jobs = engine.batcher.batches, engine.batcher.jobs
    made: list[int] = []

    def live() -> None:  # the steady call: a chunk of audio, then its step, five times
        for c in range(5):
            steady.push_audio(speech[c * per_chunk : (c + 1) * per_chunk])
            made.append(sum(len(b.frames) for b in steady.generate_ready()))

    worker = threading.Thread(target=live)
    worker.start()
    worker.join(120)
    assert made == [engine.new_frames] * 5  # every step ran, none waited for the other
    assert engine.batcher.batches - batches == engine.batcher.jobs - jobs == 5  # each alone
    stalls.push_audio(speech[per_chunk : 2 * per_chunk])  # it comes back
    assert stalls.generate_ready()[0].start == engine.new_frames


@pytest.mark.slow  # an engine started in a spawned process
@pytest.mark.timeout(300)
def test_an_engine_in_its_own_process_batches_its_sessions_steps(release):
    """`serve --engine-process` keeps the engine's Python off the media loop's GIL. Its
    sessions' calls cross one pipe, numbered, and run in the child on a thread a session:
    a call never waits for another session's whole call, two sessions' steps meet in the
    engine's batcher, and each stream's frames are what it makes in the server's process,
    in the same pieces."""
    import threading
    import time

    from pipeline.stream import ready_pieces
    from realtime.engine_process import EngineProcess

    # the decode in passes of 2 latent frames, as on a GPU: a step's frames in pieces
    options = engine_options(release, overrides={"flashhead.decode_pass_latents": 2})
    engine, _ = start_engine(options)
    per_chunk = engine.new_frames * MODEL_SAMPLES_PER_FRAME
    speech = (0.2 * np.sin(np.arange(4 * per_chunk) * 0.05)).astype(np.float32)
    refs = {seed: np.full((48, 40, 3), seed, np.uint8) for seed in (90, 150, 210)}
    chunks = {90: 3, 150: 1, 210: 1}  # the first call has three steps to make, the others one

    def frames_of(batches) -> np.ndarray:
        return np.concatenate([b.frames for b in batches])

    alone = {}
    for seed, ref in refs.items():
        stream = engine.new_stream(ref, seed=seed)
        stream.push_audio(speech[: chunks[seed] * per_chunk])
        alone[seed] = frames_of(stream.generate_ready())
        stream.close()

    hosted = EngineProcess(options)
    try:
        assert hosted.batches_steps  # so the server lets its sessions' steps in at once
        streams = {seed: hosted.new_stream(ref, seed=seed) for seed, ref in refs.items()}
        for seed, stream in streams.items():
            stream.push_audio(speech[: chunks[seed] * per_chunk])
        batches, jobs = hosted.batching()
        made, finished = {}, []

        def generate(seed: int) -> None:
            made[seed] = frames_of(streams[seed].generate_ready())
            finished.append(seed)

        calls = [threading.Thread(target=generate, args=(seed,)) for seed in refs]
        calls[0].start()
        time.sleep(0.02)  # its first step under way: the other two calls wait for it together
        for call in calls[1:]:
            call.start()
        for call in calls:
            call.join(120)
        assert finished[-1] == 90  # the one-step calls did not wait out the three-step one
        for seed in refs:
            np.testing.assert_array_equal(made[seed], alone[seed])
        batches_now, jobs_now = hosted.batching()
        assert jobs_now - jobs == 5 and batches_now - batches <= 4  # two steps met in a batch
        # a step's frames come back in the pieces the stream makes them in (Pro: the first
        # decode pass before the rest), as `ready_pieces` gives them in the server's process
        here = engine.new_stream(refs[150], seed=150)
        here.push_audio(speech[: 2 * per_chunk])
        pieces_here = [p for p in ready_pieces(here) if p.start >= engine.new_frames]
        here.close()
        streams[150].push_audio(speech[per_chunk : 2 * per_chunk])
        pieces_there = list(ready_pieces(streams[150]))
        assert len(pieces_there) > 1 and streams[150].samples_needed() > 0
        assert [p.start for p in pieces_there] == [p.start for p in pieces_here]
        for there, want in zip(pieces_there, pieces_here, strict=True):
            np.testing.assert_array_equal(there.frames, want.frames)
        for stream in streams.values():
            stream.close()
    finally:
        hosted.close()


@pytest.mark.slow  # runs the command line in a process of its own
def test_the_command_line_says_what_is_wrong_in_one_line_and_writes_nothing(release, tmp_path):
    weights, wav2vec = release
    out = tmp_path / "talk.mp4"
    run = facecast(
        "render", "--model", "flashhead-pro", "--weights", str(tmp_path / "nowhere"),
        "--wav2vec", str(wav2vec), "--audio", str(SPEECH), "--out", str(out), "--device", "cpu",
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and "weights folder not found" in run.stderr
    assert not out.exists()
    run = facecast("render", "--model", "flashhead-pro", "--audio", str(SPEECH), "--out", str(out))
    assert run.returncode == 2 and "needs --weights" in run.stderr
    assert not out.exists()


# -- the stream -----------------------------------------------------------------------------


def test_a_stream_makes_every_frame_once_in_order_whatever_the_pushes(release):
    engine, _ = start_engine(engine_options(release))
    audio = (0.2 * np.sin(np.arange(int(2.5 * MODEL_RATE)) * 0.05)).astype(np.float32)
    runs = []
    for pieces in ([len(audio)], [1000, 17000, 23333, len(audio)]):
        stream = engine.new_stream(np.full((48, 40, 3), 120, np.uint8), seed=7)
        frames, last = [], 0
        for end in pieces:
            stream.push_audio(audio[last:end])
            last = end
            frames += stream.generate_ready()
        frames += stream.finish()
        starts = [b.start for b in frames]
        assert starts == sorted(starts) and starts[0] == 0
        video = np.concatenate([b.frames for b in frames])
        assert len(video) == round(
            len(audio) / MODEL_SAMPLES_PER_FRAME
        )  # 2.5 s: every frame once, no more
        runs.append(video)
        stream.close()
    np.testing.assert_array_equal(runs[0], runs[1])  # the same seed, any split: the same


@pytest.mark.slow
def test_memory_stays_flat_over_a_minute_of_audio(release):
    engine, _ = start_engine(engine_options(release, size=16))
    stream = engine.new_stream(np.full((16, 16, 3), 90, np.uint8), seed=1)
    chunk = engine.new_frames * MODEL_SAMPLES_PER_FRAME
    retained, held = [], []
    for k in range(60 * 25 // engine.new_frames):
        stream.push_audio(np.random.default_rng(k).normal(0, 0.1, chunk).astype(np.float32))
        stream.generate_ready()
        retained.append(stream.timeline.retained)
        held.append(sum(t.numel() for t in (stream.ref_lat, stream.motion)))
    # the audio kept is the wav2vec2 window (8 s), whatever the duration; tensors the same
    assert max(retained) <= 8 * MODEL_RATE and retained[-1] == retained[10]
    assert len(set(held)) == 1


# -- colour correction ------------------------------------------------------------------


def test_colour_correction_moves_each_frame_to_the_references_colours():
    g = torch.Generator().manual_seed(0)
    reference = torch.rand(1, 3, 24, 24, generator=g) * 0.6 + 0.2  # in [0, 1]
    frames = (reference[:, :, None] * 0.5 + 0.4).repeat(1, 1, 3, 1, 1)  # washed out, brighter
    to_pm1 = lambda x: x * 2 - 1  # noqa: E731
    corrected = ColorMatch(to_pm1(reference), 1.0)(to_pm1(frames))
    lab = lambda x: srgb_to_lab(((x + 1) / 2).permute(0, 2, 3, 4, 1))  # noqa: E731
    ref_mean, ref_std = lab_stats(lab(to_pm1(reference)[:, :, None]))
    got_mean, got_std = lab_stats(lab(corrected))
    before_mean, _ = lab_stats(lab(to_pm1(frames)))
    assert (got_mean - ref_mean).abs().max() < 1.0  # Lab units; it started ~25 away
    assert (before_mean - ref_mean).abs().max() > 10
    assert (got_std / ref_std - 1).abs().max() < 0.05
    half = ColorMatch(to_pm1(reference), 0.5)(to_pm1(frames))
    assert torch.allclose(half, (to_pm1(frames) + corrected) / 2, atol=1e-5)


# -- the commands users run ---------------------------------------------------------------


@pytest.mark.slow
def test_render_a_random_release_of_pro_and_lite_through_the_command_line(release, tmp_path):
    weights, wav2vec = release
    for model in ("flashhead-pro", "flashhead-lite"):
        out = tmp_path / f"{model}.mp4"
        run = facecast(
            "render", "--model", model, "--weights", str(weights), "--wav2vec", str(wav2vec),
            "--reference", str(PORTRAIT), "--audio", str(SPEECH), "--out", str(out),
            "--device", "cpu", "--set", "video.width=64", "--set", "video.height=64", "--quiet",
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-2000:]
        with av.open(str(out)) as c:
            frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
        seconds = 6.72  # the sample's length
        assert abs(len(frames) - round(seconds * 25)) <= 1, len(frames)
        assert frames[0].shape == (64, 64, 3)
        assert np.std(np.stack(frames).astype(float), axis=0).mean() > 1.0  # it moves
        # scored as users score it: the model's chunk seams (28 frames Pro, 24 Lite) and its
        # VAE's phase, against the photo framed as the model framed it
        scored = tmp_path / f"{model}.json"
        run = facecast(
            "eval", "--model", model, "--photo", str(PORTRAIT), "--video", str(out),
            "--audio", str(SPEECH), "--json", str(scored),
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-2000:]
        scores = json.loads(scored.read_text())
        chunk = 28 if model == "flashhead-pro" else 24
        assert scores["n_seams"] == (len(frames) - 1) // chunk, scores
        assert scores["seam_ratio"] > 0 and np.isfinite(scores["seam_ratio_global"]), scores
        assert "seams" in run.stdout and scores["n_frames"] == len(frames)


@pytest.mark.slow
def test_a_tilted_photo_in_its_turned_box_is_rendered_and_scored_upright(release, tmp_path):
    """The portrait turned 35° about its face, framed with --face-box X,Y,W,H,35: render
    makes the clip (random weights: only the framing is real), and eval --model scores it
    inside the box carried into the square the model saw, where the face stands upright
    (its landmarks' roll within 5°; the photo's face is at 32°)."""
    from support.hard_faces import tilted

    from pipeline.flashhead.framing import square_box
    from pipeline.media import write_png, write_wav
    from pipeline.train.evaluate import held_out_speech

    weights, wav2vec = release
    hard = tilted(35)
    photo = write_png(tmp_path / "tilted.png", hard.rgb)
    wav = write_wav(tmp_path / "speech.wav", held_out_speech(2.0))
    box = ",".join(f"{v:.1f}" for v in (*hard.box, 35.0))
    out, scored, size = tmp_path / "talk.mp4", tmp_path / "scores.json", 128
    run = facecast(
        "render", "--model", "flashhead-lite", "--weights", str(weights), "--wav2vec",
        str(wav2vec), "--reference", str(photo), "--face-box", box, "--audio", str(wav),
        "--out", str(out), "--device", "cpu", "--set", f"video.width={size}",
        "--set", f"video.height={size}", "--quiet",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    run = facecast(
        "eval", "--model", "flashhead-lite", "--photo", str(photo), "--face-box", box,
        "--video", str(out), "--audio", str(wav), "--json", str(scored),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    scores = json.loads(scored.read_text())
    assert scores["face_box_by_hand"] and "framed by hand" in run.stdout, run.stdout
    assert abs(scores["face_roll_deg"]) < 5, scores
    carried = square_box(hard.rgb.shape, (*hard.box, 35.0), 2.0, size)
    centre = lambda b: np.array([b[0] + b[2] / 2, b[1] + b[3] / 2])  # noqa: E731
    assert np.linalg.norm(centre(scores["face_box"]) - centre(carried)) < 0.05 * carried[2]


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_serve_a_random_release_to_an_aiortc_client_for_30_seconds(release, tmp_path):
    import asyncio

    import aiohttp
    from support.realtime import make_speech_wav, served

    from facecast_client import FacecastClient, PcmSource

    weights, wav2vec = release
    speech = make_speech_wav(tmp_path / "speech.wav", [0.5, "Hello, I am a real model now.", 1.0])
    async with served(
        "--device", "cpu", "--model", "flashhead-pro", "--weights", str(weights),
        "--wav2vec", str(wav2vec), "--reference", str(PORTRAIT),
        "--set", "video.width=16", "--set", "video.height=16", ready_timeout=180,
    ) as url:  # fmt: skip
        client = FacecastClient(url, PcmSource.from_wav(speech.path, loop=True))
        await client.connect()
        await asyncio.sleep(30)
        async with aiohttp.ClientSession() as http:
            listed = (await (await http.get(f"{url}/sessions")).json())["sessions"]
        await client.close()
        stats = next(s for s in listed if s["id"] == client.session_id)
        assert stats["frames_sent"] >= 25 * 30 - 75, stats
        assert stats["fresh_share"] >= 0.98, stats


def test_serve_refuses_a_faceless_reference_before_it_listens(
    release, tmp_path, monkeypatch, capsys
):
    """`serve --model flashhead-pro --reference P`: a photo with no face found stops start-up
    in one line that says how to frame it by hand, not every peer's session after."""
    from PIL import Image

    import realtime.server
    from facecast.cli import main

    def serve_anyway(*args, **kwargs):
        raise AssertionError("serve went on to listen")

    monkeypatch.setattr(realtime.server, "serve", serve_anyway)
    weights, wav2vec = release
    blank = tmp_path / "wall.png"
    Image.fromarray(np.full((240, 320, 3), 128, np.uint8)).save(blank)
    code = main([
        "serve", "--model", "flashhead-pro", "--weights", str(weights), "--wav2vec", str(wav2vec),
        "--device", "cpu", "--port", "0", "--reference", str(blank),
    ])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "no face found" in err[0] and "--face-box" in err[0], err


@pytest.mark.slow  # runs the command line in a process of its own
def test_serve_refuses_a_broken_release_before_it_listens(release, tmp_path):
    weights, wav2vec = release
    broken = tmp_path / "broken"
    subprocess.run(["cp", "-r", str(weights), str(broken)], check=True)
    model = broken / "Model_Pro" / "diffusion_pytorch_model.safetensors"
    model.write_bytes(model.read_bytes()[:-1000])
    run = facecast(
        "serve", "--model", "flashhead-pro", "--weights", str(broken), "--wav2vec", str(wav2vec),
        "--device", "cpu", "--port", "0", timeout=120,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr[-500:]
    assert len(run.stderr.strip().splitlines()) == 1 and str(model) in run.stderr


def test_a_second_stream_of_the_same_photo_reuses_its_reference_latents(release):
    """Pro encodes a reference once per picture (33 still frames through the Wan VAE, a
    call's first step waited for it): a second stream of the same photo makes the same
    frames without encoding it again; another photo is encoded."""
    engine, _ = start_engine(engine_options(release))
    vae = engine.models.vae
    encodes: list[tuple] = []
    encode = vae.encode

    def counting(video, *args, **kwargs):
        encodes.append(tuple(video.shape))
        return encode(video, *args, **kwargs)

    vae.encode = counting
    audio = (0.2 * np.sin(np.arange(int(1.5 * MODEL_RATE)) * 0.05)).astype(np.float32)
    photo = np.full((48, 40, 3), 120, np.uint8)
    runs = []
    for _ in range(2):
        encodes.clear()
        stream = engine.new_stream(photo, seed=3)
        references = [s for s in encodes if s[2] == engine.cfg.flashhead.chunk_frames]
        stream.push_audio(audio)
        runs.append((len(references), np.concatenate([b.frames for b in stream.generate_ready()])))
        stream.close()
    (first_encodes, first), (second_encodes, second) = runs
    assert (first_encodes, second_encodes) == (1, 0)
    assert np.array_equal(first, second)
    encodes.clear()
    engine.new_stream(np.full((48, 40, 3), 60, np.uint8), seed=3).close()
    assert [s for s in encodes if s[2] == engine.cfg.flashhead.chunk_frames]


def test_compiling_encodes_a_kept_reference_again_through_the_compiled_encoder(release):
    """FP8's calibration encodes the warm-up picture before `compile`: the latents kept
    then came from the eager encoder, and reusing them kept the warm-up from ever
    compiling the reference encode (the first new picture paid 3.5 s in its call on the
    H200). After `compile` a picture seen before is encoded again."""
    engine, _ = start_engine(engine_options(release))
    vae = engine.models.vae
    encodes: list[tuple] = []
    encode = vae.encode

    def counting(video, *args, **kwargs):
        encodes.append(tuple(video.shape))
        return encode(video, *args, **kwargs)

    vae.encode = counting
    photo = np.full((48, 40, 3), 90, np.uint8)
    chunk = engine.cfg.flashhead.chunk_frames
    engine.new_stream(photo, seed=1).close()
    engine.new_stream(photo, seed=2).close()
    assert [s[2] for s in encodes].count(chunk) == 1  # kept for the second stream
    engine.compile()
    encodes.clear()
    engine.new_stream(photo, seed=3).close()
    assert [s[2] for s in encodes].count(chunk) == 1


def test_the_sessions_bench_runs_streams_together_as_one_batch_each(release):
    """`facecast bench --sessions N`: N streams at once, their steps batched by the engine,
    each with all its frames; the aggregate is what they made together over the run."""
    from pipeline.stream_bench import bench_sessions, sessions_summary

    res = bench_sessions(engine_options(release, model="flashhead-lite"), 2.0, 3, "bench")
    per = res["sessions"]
    assert res["batched"] and len(per) == 3 and res["meta"]["sessions"] == 3
    assert len({r["frames"] for r in per}) == 1 and per[0]["frames"] >= 2 * 24
    wall = max(r["seconds"] for r in per)
    assert res["aggregate_fps"] == pytest.approx(sum(r["frames"] for r in per) / wall)
    assert "3 sessions (batched)" in sessions_summary(res)


def test_the_paced_bench_starts_each_step_when_a_microphone_would_have_its_audio(release):
    """`facecast bench --paced`: step 0 at once, each later one no sooner than its audio's
    last sample would come in real time (a served live call's steps, the GPU idle between)."""
    from pipeline.clock import FPS
    from pipeline.stream_bench import bench_stream, stream_summary

    opts = engine_options(release, model="flashhead-lite")
    res = bench_stream(opts, 3.5, "bench", paced=True)
    starts, chunk = res["steps_started_s"], res["steady"]["frames_per_step"] / FPS
    assert res["meta"]["paced"] and len(starts) == len(res["steps"]) >= 3
    # each step's audio is a chunk more than the last one's: it comes a chunk later
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert all(gap >= chunk - 0.01 for gap in gaps), (gaps, chunk)
    assert "steps paced as a live call's" in stream_summary(res)


def test_the_gate_says_which_self_attention_its_verdict_is_on(release, tmp_path, capsys):
    """`facecast gate` on a real model's layout: the report names the kernels the engine
    under test chose (FlashHead: its self-attention), so a verdict is never read as one on
    kernels that did not run."""
    from facecast.cli import main

    weights, wav2vec = release
    report = tmp_path / "gate.json"
    args = [
        "gate", "--model", "flashhead-lite", "--weights", str(weights), "--wav2vec", str(wav2vec),
        "--baseline", str(tmp_path / "base"), "--seconds", "1", "--device", "cpu",
        "--set", "video.width=32", "--set", "video.height=32", "--json", str(report),
    ]  # fmt: skip
    assert main(args) == 0
    verdict = json.loads(report.read_text())
    assert verdict["tier"] == 1  # the same eager engine: every frame identical
    assert verdict["kernels"] == {"self_attention": "sdpa"}  # bf16 keeps the exact SDPA
    assert "self_attention sdpa" in capsys.readouterr().out
