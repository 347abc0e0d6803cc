"""The benchmark runs on the tiny config on the CPU and reports every field the issue asks
for (the numbers themselves come from the GPU; see bench/RESULTS.md)."""

import json

import numpy as np
import pytest

from facecast.cli import main
from pipeline.bench import speech_like_audio
from pipeline.diffusion.bench import BenchOptions, run_bench
from pipeline.diffusion.bench_report import append_markdown


def test_speech_like_audio_has_syllables_and_pauses():
    x = speech_like_audio(4.0)
    assert x.dtype == np.float32 and x.shape == (64000,)
    frames = np.abs(x[: 4 * 16000 // 640 * 640].reshape(-1, 640)).mean(1)
    assert (frames < 1e-3 * frames.max() + 0.002).mean() > 0.1  # quiet stretches
    assert frames.max() > 0.05


@pytest.mark.slow  # a measurement: its efficiency bound wants a quiet CPU
def test_bench_on_tiny_reports_every_field(tmp_path):
    res = run_bench(BenchOptions(config="tiny", seconds=2.0, device="cpu", isolated_reps=1))
    assert 0 < res["ttff"]["seconds"] < 30
    assert set(res["ttff"]["by_stage"]) == {"context", "a2v", "sr", "decode"}
    s = res["steady"]
    assert s["fps"] > 0 and s["chunk_wall_p99"] >= s["chunk_wall_p50"] > 0
    assert s["chunk_seconds"] == 0.48  # 6 latents x 2 frames at 25 fps
    st = res["stages"]
    assert all(v > 0 for v in st["isolated_seconds_per_chunk"].values())
    assert 0.3 < st["pipeline_efficiency"] < 1.5
    fl = res["flops"]
    assert all(v > 0 for v in fl["per_chunk_by_stage"].values())
    assert fl["per_chunk_by_stage"]["a2v"] > fl["per_chunk_by_stage"]["context"]
    assert res["memory"]["video_seconds"] >= 2.0
    assert "a2v->sr" in res["switch"]["idle_gap_seconds"]


@pytest.mark.slow  # the bench command end to end
def test_bench_command_writes_json_and_its_own_markdown_section(tmp_path):
    md = tmp_path / "RESULTS.md"
    md.write_text("# Facecast benchmark results\n\n## Kernels\n\nother helper's table\n")
    out = tmp_path / "r.json"
    args = ["bench", "--config", "tiny", "--seconds", "1", "--device", "cpu"]
    assert main(args + ["--json", str(out), "--markdown", str(md), "--isolated-reps", "1"]) == 0
    data = json.loads(out.read_text())
    assert data["command"].startswith("facecast bench") and data["meta"]["config"] == "tiny"
    text = md.read_text()
    assert "other helper's table" in text and "time to first frame" in text
    append_markdown(md, "second block\n")
    assert md.read_text().count("facecast-bench:begin") == 1 and "second block" in md.read_text()


def test_paced_bench_wants_one_real_model_stream(capsys):
    args = ["bench", "--config", "tiny", "--seconds", "1", "--device", "cpu", "--paced"]
    assert main(args) == 2
    assert "--paced times one real model's stream" in capsys.readouterr().err
