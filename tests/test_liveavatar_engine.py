"""LiveAvatar through the commands users run: a random release in the published layout
(Wan2.2-S2V-14B's folder and the Live-Avatar LoRA, toy sizes) streams block by block,
renders, is scored and served; a broken download is one line.

The transformer's and the files' parity with the authors' code are in
`test_liveavatar_model.py` and `test_liveavatar_release.py`.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pytest

from pipeline.clock import MODEL_RATE, MODEL_SAMPLES_PER_FRAME
from pipeline.errors import CheckpointError, ConfigError
from pipeline.liveavatar.random_release import write
from pipeline.startup import EngineOptions, start_engine

ROOT = Path(__file__).resolve().parent.parent
SPEECH = ROOT / "pipeline" / "assets" / "sample_speech.wav"
PORTRAIT = ROOT / "pipeline" / "assets" / "portraits" / "grace_hopper.jpg"
SIZE = 64  # the smallest LiveAvatar size: latents a multiple of 8 (FramePack's 4x after 2x2)
BLOCK = 12  # video frames a block adds


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> tuple[Path, Path]:
    return write(tmp_path_factory.mktemp("liveavatar"), "test", seed=5)


def options(release: tuple[Path, Path], **overrides) -> EngineOptions:
    """The test release at the smallest size on the CPU, with `--set` overrides."""
    weights, lora = release
    return EngineOptions(
        model="liveavatar",
        weights=str(weights),
        lora=str(lora),
        device="cpu",
        warmup=False,
        overrides={"video.width": SIZE, "video.height": SIZE, **overrides},
    )


@pytest.fixture(scope="module")
def engine(release):
    return start_engine(options(release))[0]


def facecast(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "facecast", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def speechy(seconds: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * MODEL_RATE)) / MODEL_RATE
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 3 * t)
    return (0.2 * envelope * rng.standard_normal(t.size)).astype(np.float32)


@pytest.mark.slow  # two streams of four blocks: over a minute on a 2-core CPU
def test_a_stream_makes_every_frame_once_in_order_whatever_the_pushes(engine):
    audio = speechy(1.6)
    runs = []
    for pieces in ([len(audio)], [3000, 9001, 17000, len(audio)]):
        stream = engine.new_stream(np.full((80, 60, 3), 120, np.uint8), seed=7)
        frames, last = [], 0
        for end in pieces:
            stream.push_audio(audio[last:end])
            last = end
            frames += stream.generate_ready()
        frames += stream.finish()
        assert [b.start for b in frames] == [BLOCK * k for k in range(len(frames))]
        video = np.concatenate([b.frames for b in frames])
        assert video.shape == (round(len(audio) / MODEL_SAMPLES_PER_FRAME), SIZE, SIZE, 3)
        runs.append(video)
        stream.close()
    np.testing.assert_array_equal(runs[0], runs[1])  # the same seed, any split: the same
    assert runs[0].std() > 1.0  # random weights make noise, but not a constant


def test_a_block_waits_for_its_audio_and_a_little_past_it(engine):
    stream = engine.new_stream(np.full((SIZE, SIZE, 3), 90, np.uint8), seed=1)
    lookahead = engine.cfg.liveavatar.audio_lookahead_frames
    need = (BLOCK + lookahead) * MODEL_SAMPLES_PER_FRAME
    assert stream.samples_needed() == need
    stream.push_audio(speechy(1.0)[: need - 1])
    assert stream.generate_ready() == []
    stream.push_audio(np.zeros(1, np.float32))
    assert [b.start for b in stream.generate_ready()] == [0]
    step = engine.stream_step(1)
    assert step.audio_frames == 2 * BLOCK + lookahead and step.first_frame == BLOCK
    stream.close()


def test_prompts_are_encoded_once_and_kept(engine):
    default = engine.prompt_features(engine.cfg.liveavatar.prompt)
    assert engine.prompt_features(engine.cfg.liveavatar.prompt) is default  # cached at load
    other = engine.prompt_features("A woman reads the news in a bright studio.")
    assert other is engine.prompt_features("A woman reads the news in a bright studio.")
    assert other.shape[-1] == default.shape[-1] and not (
        other.shape == default.shape and bool((other == default).all())
    )
    assert engine.models.prompts.device.type == "cpu"  # back in host memory after


@pytest.mark.slow  # two streams
def test_a_sessions_prompt_changes_its_video(engine):
    audio = speechy(BLOCK / 25 + 0.1)
    videos = []
    for prompt in (None, "A sailor on a windy deck, shouting over the storm."):
        stream = engine.new_stream(np.full((SIZE, SIZE, 3), 90, np.uint8), seed=3, prompt=prompt)
        stream.push_audio(audio)
        videos.append(np.concatenate([b.frames for b in stream.generate_ready()]))
        stream.close()
    assert videos[0].shape == videos[1].shape == (BLOCK, SIZE, SIZE, 3)
    assert np.abs(videos[0].astype(int) - videos[1]).mean() > 0.5  # the same seed, other words


@pytest.mark.slow
def test_memory_stays_flat_as_the_cache_rolls(engine):
    stream = engine.new_stream(np.full((SIZE, SIZE, 3), 90, np.uint8), seed=2)
    cache = stream.cache
    pointers = (cache.k.data_ptr(), cache.v.data_ptr(), cache.nbytes())
    retained = []
    for k in range(16):  # four times round the 12-latent-frame window
        stream.push_audio(speechy(BLOCK / 25, seed=k))
        stream.generate_ready()
        retained.append(stream.timeline.retained)
        assert (stream.cache.k.data_ptr(), stream.cache.v.data_ptr(), stream.cache.nbytes()) == (
            pointers
        )
    window = engine.cfg.liveavatar.audio_window_seconds * MODEL_RATE
    assert max(retained) <= window + BLOCK * MODEL_SAMPLES_PER_FRAME
    assert retained[-1] == retained[-5]
    stream.close()
    assert stream.cache is None and stream.decoder is None  # the 51 GB a real one holds, freed


@pytest.mark.slow  # torch.compile on a CPU: about a minute
def test_compiled_layers_make_the_eager_frames_and_no_block_recompiles(release, engine):
    import torch._dynamo

    weights, lora = release
    opts = EngineOptions(
        model="liveavatar", weights=str(weights), lora=str(lora), device="cpu", warmup=False,
        compile=True, overrides={"video.width": SIZE, "video.height": SIZE},
    )  # fmt: skip
    torch._dynamo.reset()
    compiled, report = start_engine(opts)
    assert report.prepare["compiled_blocks"] == len(compiled.models.transformer.layers())
    graphs = torch._dynamo.utils.counters["stats"]
    videos, after_two = [], 0
    for eng in (engine, compiled):
        stream = eng.new_stream(np.full((SIZE, SIZE, 3), 90, np.uint8), seed=4)
        frames = []
        for k in range(6):  # past the 4 slots of the 12-latent-frame window
            stream.push_audio(speechy(BLOCK / 25, seed=k))
            frames += stream.generate_ready()
            if eng is compiled and k == 1:
                after_two = graphs["unique_graphs"]
        videos.append(np.concatenate([b.frames for b in frames]).astype(np.int16))
        stream.close()
    assert after_two > 0 and graphs["unique_graphs"] == after_two  # later blocks reuse them
    eager, fused = videos
    assert eager.shape == fused.shape and eager.shape[0] >= 5 * BLOCK
    # fused kernels round differently in fp32: pixels at most a level or two apart
    assert np.abs(eager - fused).max() <= 2 and np.abs(eager - fused).mean() < 0.05


@pytest.mark.slow
def test_render_and_score_a_random_release_through_the_command_line(release, tmp_path):
    weights, lora = release
    out, scored = tmp_path / "talk.mp4", tmp_path / "scores.json"
    run = facecast(
        "render", "--model", "liveavatar", "--weights", str(weights), "--lora", str(lora),
        "--reference", str(PORTRAIT), "--audio", str(SPEECH), "--out", str(out),
        "--prompt", "An elderly woman in uniform speaks calmly.",
        "--device", "cpu", "--set", f"video.width={SIZE}", "--set", f"video.height={SIZE}",
        "--quiet",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    with av.open(str(out)) as c:
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    assert abs(len(frames) - round(6.72 * 25)) <= 1 and frames[0].shape == (SIZE, SIZE, 3)
    assert np.std(np.stack(frames).astype(float), axis=0).mean() > 1.0  # it moves
    run = facecast(
        "eval", "--model", "liveavatar", "--photo", str(PORTRAIT), "--video", str(out),
        "--audio", str(SPEECH), "--json", str(scored),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    scores = json.loads(scored.read_text())
    assert scores["n_seams"] == (len(frames) - 1) // BLOCK, scores  # a seam every block


@pytest.mark.slow
def test_a_tilted_photo_in_its_turned_box_is_rendered_and_scored_upright(release, tmp_path):
    """The portrait turned 35° about its face, framed with --face-box X,Y,W,H,35: render
    makes the clip (random weights: only the framing is real), and eval --model scores it
    inside the box carried into the crop the model saw, where the face stands upright."""
    from support.hard_faces import tilted

    from pipeline.media import write_png, write_wav

    weights, lora = release
    hard = tilted(35)
    photo = write_png(tmp_path / "tilted.png", hard.rgb)
    wav = write_wav(tmp_path / "speech.wav", speechy(1.0))
    box = ",".join(f"{v:.1f}" for v in (*hard.box, 35.0))
    out, scored = tmp_path / "talk.mp4", tmp_path / "scores.json"
    run = facecast(
        "render", "--model", "liveavatar", "--weights", str(weights), "--lora", str(lora),
        "--reference", str(photo), "--face-box", box, "--audio", str(wav), "--out", str(out),
        "--prompt", "An elderly woman in uniform speaks calmly.", "--device", "cpu",
        "--set", f"video.width={SIZE}", "--set", f"video.height={SIZE}", "--quiet",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    run = facecast(
        "eval", "--model", "liveavatar", "--photo", str(photo), "--face-box", box,
        "--video", str(out), "--audio", str(wav), "--json", str(scored),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    scores = json.loads(scored.read_text())
    assert scores["face_box_by_hand"] and abs(scores["face_roll_deg"]) < 5, scores


@pytest.mark.slow  # runs the command line in a process of its own
def test_missing_lora_or_prompt_without_the_model_is_one_line(release, tmp_path):
    weights, lora = release
    with pytest.raises(ConfigError, match="--model liveavatar needs --lora"):
        EngineOptions(model="liveavatar", weights=str(weights)).validate()
    with pytest.raises(ConfigError, match="--lora goes with --model liveavatar"):
        EngineOptions(
            model="flashhead-pro", weights=str(weights), wav2vec=str(weights), lora=str(lora)
        ).validate()
    out = tmp_path / "talk.mp4"
    run = facecast(
        "render", "--prompt", "hello", "--audio", str(SPEECH), "--out", str(out), timeout=120
    )
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "--prompt go with --model NAME" in run.stderr and not out.exists()


@pytest.mark.slow  # runs the command line in a process of its own
def test_an_incomplete_download_is_one_line_naming_the_file(release, tmp_path):
    """Each missing part is named at start-up (in-process here); through `render`, the
    same line, exit 2 and no output file."""
    weights, lora = release
    broken = tmp_path / "release"
    subprocess.run(["cp", "-r", str(weights), str(broken)], check=True)
    opts = EngineOptions(model="liveavatar", weights=str(broken), lora=str(lora), device="cpu")
    for part in ("config.json", "models_t5_umt5-xxl-enc-bf16.pth", "Wan2.1_VAE.pth"):
        kept = tmp_path / part
        (broken / part).rename(kept)
        with pytest.raises(CheckpointError, match=f"{part}: not found in the release folder"):
            start_engine(opts)
        kept.rename(broken / part)
    (broken / "Wan2.1_VAE.pth").unlink()
    out = tmp_path / "talk.mp4"
    run = facecast(
        "render", "--model", "liveavatar", "--weights", str(broken), "--lora", str(lora),
        "--reference", str(PORTRAIT), "--audio", str(SPEECH), "--out", str(out),
        "--device", "cpu", timeout=120,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr[-500:]
    assert len(run.stderr.strip().splitlines()) == 1 and "Wan2.1_VAE.pth" in run.stderr
    assert not out.exists()


@pytest.mark.slow  # runs the command line in a process of its own
def test_serve_refuses_a_broken_release_before_it_listens(release, tmp_path):
    weights, lora = release
    broken = tmp_path / "broken"
    subprocess.run(["cp", "-r", str(weights), str(broken)], check=True)
    shard = next(broken.glob("diffusion_pytorch_model*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:-100])
    run = facecast(
        "serve", "--model", "liveavatar", "--weights", str(broken), "--lora", str(lora),
        "--device", "cpu", "--port", "0", timeout=120,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr[-500:]
    assert len(run.stderr.strip().splitlines()) == 1 and str(shard) in run.stderr


@pytest.mark.slow
@pytest.mark.timeout(400)
async def test_serve_a_random_release_to_an_aiortc_client_for_30_seconds(release, tmp_path):
    """Slower than real time on a CPU: every frame it makes reaches the client, in sync
    (the playout shows a slow engine's frames rather than dropping them as late)."""
    import aiohttp
    from support.realtime import make_speech_wav, served

    from facecast_client import FacecastClient, PcmSource

    weights, lora = release
    speech = make_speech_wav(tmp_path / "speech.wav", [0.5, "Hello, I am a big model.", 1.0])
    async with served(
        "--device", "cpu", "--model", "liveavatar", "--weights", str(weights), "--lora",
        str(lora), "--reference", str(PORTRAIT), "--set", f"video.width={SIZE}",
        "--set", f"video.height={SIZE}",
    ) as url:  # fmt: skip
        prompt = {"prompt": "An old sailor tells a story."}  # this session's own words
        client = FacecastClient(
            url, PcmSource.from_wav(speech.path, loop=True), offer_options=prompt
        )
        await client.connect()
        await asyncio.sleep(30)
        async with aiohttp.ClientSession() as http:
            listed = (await (await http.get(f"{url}/sessions")).json())["sessions"]
        await client.close()
        stats = next(s for s in listed if s["id"] == client.session_id)
        print({k: v for k, v in stats.items() if k.startswith(("frames", "fresh", "step", "ttff", "playout"))}, file=sys.stderr)  # fmt: skip
        made = stats["frames_generated"]
        assert made >= 5 * BLOCK, stats  # it ran, block after block
        # what it makes is shown, not dropped as late: nearly all (a real model's block
        # times vary on a shared 2-core runner; the scripted slow engine of
        # test_realtime_playout, with exact times, holds 95 %)
        assert stats["frames_dropped"] <= 0.1 * made, stats
        assert stats["frames_fresh"] >= 0.9 * (made - stats["frames_queued"]), stats
        assert stats["ttff_ms"] is not None, stats


def test_a_block_decoded_beside_the_next_blocks_dit_gives_the_serial_frames(engine):
    """With the next block's audio already here, block k decodes on a side stream while
    block k+1's DiT runs (on a CPU, in place), and block k+1 then waits for block k+2's
    audio (or the end) to finish beside it: the frames and their order are the serial
    path's, to the bit."""
    spf = MODEL_SAMPLES_PER_FRAME
    audio = speechy(1.2, seed=3)[: engine.stream_step(1).audio_frames * spf]
    runs = []
    for read_ahead in (1, 0):
        stream = engine.new_stream(np.full((SIZE, SIZE, 3), 150, np.uint8), seed=4)
        stream.read_ahead = read_ahead
        assert stream.samples_wanted() == engine.stream_step(read_ahead).audio_frames * spf
        stream.push_audio(audio)
        ready = stream.generate_ready()
        if read_ahead:  # block 1 was started in block 0's step; it waits for block 2's audio
            assert [b.start for b in ready] == [0] and stream.started_ahead(1)
            assert stream.samples_needed() == engine.stream_step(2).audio_frames * spf - len(audio)
        else:
            assert [b.start for b in ready] == [0, BLOCK] and not stream.started_ahead(2)
        batches = ready + stream.finish()
        assert [b.start for b in batches] == [0, BLOCK, 2 * BLOCK]
        runs.append(np.concatenate([b.frames for b in batches]))
        stream.close()
    np.testing.assert_array_equal(runs[0], runs[1])


def test_fp8_on_the_output_projections_too_streams_close_to_the_exact_frames(release, engine):
    """`liveavatar.fp8_outputs` (the default): --precision fp8 takes each layer's two
    attention output projections as well (emulated FP8 on the CPU, the same e4m3 products),
    and the stream still gives the exact engine's picture, within FP8's rounding; set false,
    they stay in the model's dtype."""
    from pipeline.precision import Fp8Linear, apply_fp8

    fp8 = start_engine(options(release))[0]
    layers = fp8.models.transformer.layers()
    swapped = apply_fp8(fp8, "static", emulate=True)
    assert swapped == 6 * len(layers)  # q/k/v, cross q, the FFN's two, and the two outputs
    assert all(isinstance(layer.self_attn.o, Fp8Linear) for layer in layers)
    assert all(isinstance(layer.cross_attn.o, Fp8Linear) for layer in layers)
    without = start_engine(options(release, **{"liveavatar.fp8_outputs": False}))[0]
    assert len(without.fp8_targets("static")) == 4 * len(layers)
    audio = speechy(0.6, seed=2)
    frames = []
    for e in (engine, fp8):
        stream = e.new_stream(np.full((SIZE, SIZE, 3), 150, np.uint8), seed=4)
        stream.push_audio(audio)
        frames.append(np.concatenate([b.frames for b in stream.finish()]))
        stream.close()
    assert frames[0].shape == frames[1].shape and len(frames[0]) >= BLOCK
    diff = np.abs(frames[0].astype(np.int16) - frames[1]).mean()
    assert 0 < diff < 8.0, diff  # grey levels: FP8 perturbs the picture, it does not break it


def test_auto_attention_is_fp8_over_an_fp8_cache_beside_fp8_linears_where_cudnn_can_run():
    """`liveavatar.attention` and `kv_cache` left `auto`: cuDNN's FP8 attention over an e4m3
    cache where the linears run in FP8 and the kernel can run here; the exact SDPA over a
    cache in the model's dtype otherwise (no FP8 precision, or a GPU or install where the
    kernel cannot run, where an FP8 cache would only be widened for every call). A value
    that is set stays as it is."""
    from pipeline.liveavatar.config import LiveAvatarConfig, self_attention

    auto = LiveAvatarConfig()
    assert self_attention(auto, fp8_linears=True, refusal=None) == ("fp8", "fp8")
    assert self_attention(auto, fp8_linears=False, refusal=None) == ("sdpa", "model")
    assert self_attention(auto, fp8_linears=True, refusal="not Hopper") == ("sdpa", "model")
    fp8_only = LiveAvatarConfig(attention="fp8")
    assert self_attention(fp8_only, fp8_linears=False, refusal=None) == ("fp8", "fp8")
    assert self_attention(fp8_only, fp8_linears=False, refusal="a CPU") == ("fp8", "model")
    kept = LiveAvatarConfig(attention="sdpa", kv_cache="fp8")
    assert self_attention(kept, fp8_linears=True, refusal=None) == ("sdpa", "fp8")


def test_fp8_linears_bring_the_fp8_attention_where_the_kernel_runs(release, monkeypatch):
    """--precision fp8 on an engine left `auto`: on this CPU cuDNN's FP8 kernel cannot run,
    so the layers keep the exact attention and the streams a full-precision cache; where it
    can run (pretended here), every layer's self-attention turns to it, its queries
    quantised in the layer, and a new stream's cache holds e4m3 (a quarter of fp32's
    bytes)."""
    import pipeline.liveavatar.engine as engine_module
    from pipeline.precision import apply_fp8

    fp8 = start_engine(options(release))[0]
    reference = np.full((SIZE, SIZE, 3), 150, np.uint8)

    def placed() -> tuple[set[str], set[bool], int]:
        layers = fp8.models.transformer.layers()
        stream = fp8.new_stream(reference, seed=1)
        assert stream.cache is not None
        kv_bytes = stream.cache.nbytes_kv()
        stream.close()
        return (
            {layer.self_attn.attend.backend for layer in layers},
            {layer.self_attn.fp8_queries for layer in layers},
            kv_bytes,
        )

    exact = placed()
    apply_fp8(fp8, "static", emulate=True)
    assert placed() == exact
    assert exact[:2] == ({"sdpa"}, {False})
    monkeypatch.setattr(engine_module, "fp8_refusal", lambda q: None)
    fp8.precision_applied()
    backends, fused, kv_bytes = placed()
    assert (backends, fused) == ({"fp8"}, {True})
    assert kv_bytes * 4 == exact[2]


@pytest.mark.parametrize("backend", ["cudnn", "fp8"])
def test_a_cudnn_self_attention_where_it_cannot_run_streams_the_exact_frames_saying_so(
    release, engine, caplog, backend
):
    """`liveavatar.attention: cudnn` (cuDNN's fastest bf16 engine) or `fp8` (its FP8 kernels)
    puts every layer's self-attention there; on this CPU they cannot run, so the stream is
    the exact one, frame for frame, and the log says why once. A name that is not a backend
    is one line at load."""
    import logging

    from pipeline.models.attention import say_fallback

    with pytest.raises(ConfigError, match="liveavatar.attention"):
        start_engine(options(release, **{"liveavatar.attention": "flash"}))
    say_fallback.cache_clear()
    fp8 = start_engine(options(release, **{"liveavatar.attention": backend}))[0]
    assert {layer.self_attn.attend.backend for layer in fp8.models.transformer.layers()} == {
        backend
    }
    audio = speechy(0.6, seed=6)
    frames = []
    with caplog.at_level(logging.WARNING, logger="facecast.attention"):
        for e in (engine, fp8):
            stream = e.new_stream(np.full((SIZE, SIZE, 3), 150, np.uint8), seed=4)
            stream.push_audio(audio)
            frames.append(np.concatenate([b.frames for b in stream.finish()]))
            stream.close()
    np.testing.assert_array_equal(frames[0], frames[1])
    lines = [r.getMessage() for r in caplog.records if r.name == "facecast.attention"]
    assert len(lines) == 1 and f"'{backend}' falls back" in lines[0], lines


def test_the_configured_compile_mode_reaches_every_layers_graphs(release, monkeypatch):
    """`liveavatar.compile_mode` (autotuned GEMMs) is the mode each layer's two halves are
    compiled with; a mode torch.compile lacks is one line at load, and so are the CUDA-graph
    modes, with the reason (the layers share graphs that CUDA graphs would overwrite)."""
    import pipeline.liveavatar.engine as engine_module

    with pytest.raises(ConfigError, match="liveavatar.compile_mode"):
        start_engine(options(release, **{"liveavatar.compile_mode": "fastest"}))
    for graphs in ("reduce-overhead", "max-autotune"):
        with pytest.raises(ConfigError, match="CUDA graphs over the layers"):
            start_engine(options(release, **{"liveavatar.compile_mode": graphs}))
    modes = []

    def recording_compile(fn, mode=None, **kw):
        modes.append(mode)
        return fn

    monkeypatch.setattr(engine_module.torch, "compile", recording_compile)
    autotune = "max-autotune-no-cudagraphs"
    eng = start_engine(options(release, **{"liveavatar.compile_mode": autotune}))[0]
    layers = eng.compile()
    assert layers == len(eng.models.transformer.layers())
    assert modes == [autotune] * 2 * layers  # the VAE's decoder: on a GPU only


def test_an_fp8_kv_cache_streams_close_to_the_exact_frames_in_a_quarter_of_the_bytes(
    release, engine
):
    """`liveavatar.kv_cache: fp8` keeps the stream's cached keys and values in e4m3: the
    step buffers take a quarter of fp32's bytes (half of bf16's on a GPU), and the picture is
    the exact engine's within the rounding. Another value is one line at load."""
    with pytest.raises(ConfigError, match="liveavatar.kv_cache"):
        start_engine(options(release, **{"liveavatar.kv_cache": "int4"}))
    fp8 = start_engine(options(release, **{"liveavatar.kv_cache": "fp8"}))[0]
    audio = speechy(0.6, seed=3)
    frames, kv_bytes = [], []
    for e in (engine, fp8):
        stream = e.new_stream(np.full((SIZE, SIZE, 3), 150, np.uint8), seed=4)
        assert stream.cache is not None  # allocated with the stream, for its whole length
        kv_bytes.append(stream.cache.nbytes_kv())
        stream.push_audio(audio)
        frames.append(np.concatenate([b.frames for b in stream.finish()]))
        stream.close()
    assert kv_bytes[1] * 4 == kv_bytes[0]
    assert frames[0].shape == frames[1].shape and len(frames[0]) >= BLOCK
    diff = np.abs(frames[0].astype(np.int16) - frames[1]).mean()
    assert 0 < diff < 1.0, diff  # grey levels (0.06 here)
