"""`facecast render` end to end on the tiny config, and every kind of bad input."""

import os
import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pytest
import yaml

from facecast.cli import main
from pipeline.config import load_config
from pipeline.diffusion.build import build_models
from pipeline.media import write_wav
from pipeline.module import save_checkpoint


def decode(path: Path):
    with av.open(str(path)) as c:
        v = c.streams.video[0]
        rate = v.average_rate
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    with av.open(str(path)) as c:
        samples = sum(f.samples for f in c.decode(audio=0))
        audio_rate = c.streams.audio[0].rate
    return rate, frames, samples / audio_rate


def audio_seconds(path: Path) -> float:
    with av.open(str(path)) as c:
        return sum(f.samples / f.sample_rate for f in c.decode(audio=0))


def test_render_end_to_end(tmp_path, assets):
    out = tmp_path / "out.mp4"
    # espeak writes 22.05 kHz: the render resamples it properly for the model
    code = main(
        [
            "render",
            "--reference",
            str(assets["reference"]),
            "--audio",
            str(assets["speech"]),
            "--out",
            str(out),
            "--config",
            "tiny",
            "--quiet",
        ]
    )
    assert code == 0
    rate, frames, seconds = decode(out)
    expected = round(audio_seconds(assets["speech"]) * 25)
    assert rate == 25
    assert len(frames) == expected
    assert abs(seconds - audio_seconds(assets["speech"])) <= 0.04
    assert frames[0].shape == (128, 128, 3)
    diffs = [np.abs(a.astype(int) - b).mean() for a, b in zip(frames, frames[1:], strict=False)]
    assert max(diffs) > 0.5  # frames change over time
    assert not list(tmp_path.glob(".*partial"))


def test_render_stereo_mp3_at_44k(tmp_path, assets):
    """Any format, rate and channel count: a stereo 44.1 kHz MP3 of 1.5 s."""
    t = np.arange(int(44100 * 1.5)) / 44100
    stereo = np.stack([np.sin(2 * np.pi * 220 * t), np.sin(2 * np.pi * 330 * t)], axis=1) * 0.3
    wav = write_wav(tmp_path / "s.wav", stereo, rate=44100)
    mp3 = tmp_path / "s.mp3"
    with av.open(str(wav)) as src, av.open(str(mp3), "w") as dst:
        s = dst.add_stream("libmp3lame", rate=44100)
        s.layout = "stereo"
        for f in src.decode(audio=0):
            f.pts = None
            dst.mux(s.encode(f))
        dst.mux(s.encode(None))
    out = tmp_path / "o.mp4"
    assert (
        main(
            [
                "render",  # the default config and its bundled portrait
                "--audio",
                str(mp3),
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    _, frames, seconds = decode(out)
    assert abs(len(frames) - round(audio_seconds(mp3) * 25)) == 0
    assert abs(seconds - audio_seconds(mp3)) <= 0.04


def _nan_wav(path: Path) -> Path:
    samples = np.zeros((1, 16000), np.float32)
    samples[0, 500] = np.nan
    with av.open(str(path), "w", format="wav") as c:
        s = c.add_stream("pcm_f32le", rate=16000)
        s.layout = "mono"
        f = av.AudioFrame.from_ndarray(samples, format="flt", layout="mono")
        f.sample_rate = 16000
        c.mux(s.encode(f))
        c.mux(s.encode(None))
    return path


def _mismatched_weights_config(tmp_path: Path) -> Path:
    weights = tmp_path / "weights"
    models = build_models(load_config("tiny", overrides={"a2v.dim": 96}))
    for name, model in models.items():
        save_checkpoint(model, weights / f"{name}.safetensors")
    raw = yaml.safe_load((Path("configs") / "tiny.yaml").read_text())
    raw["runtime"]["weights"] = str(weights)
    path = tmp_path / "mismatch.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


BAD_INPUTS = {
    "missing image": (
        lambda d, a: ["--reference", str(d / "nope.png")],
        "reference image not found",
    ),
    "corrupt image": (
        lambda d, a: ["--reference", _bytes(d / "bad.png", b"\x89PNG garbage")],
        "cannot read reference image",
    ),
    "missing audio": (lambda d, a: ["--audio", str(d / "nope.wav")], "audio file not found"),
    "corrupt audio": (
        lambda d, a: ["--audio", _bytes(d / "bad.wav", b"RIFF\x00\x00junkjunk" * 9)],
        "audio",
    ),
    "empty audio": (
        lambda d, a: ["--audio", str(write_wav(d / "empty.wav", np.zeros(0)))],
        "empty",
    ),
    "nan samples": (lambda d, a: ["--audio", str(_nan_wav(d / "nan.wav"))], "NaN"),
    "unknown config": (lambda d, a: ["--config", "nope"], "unknown config 'nope'"),
    "bad config value": (
        lambda d, a: ["--config", _bytes(d / "b.yaml", b"sampler: {steps: -1}")],
        "sampler.steps",
    ),
    "checkpoint mismatch": (
        lambda d, a: ["--config", str(_mismatched_weights_config(d))],
        "does not match the model",
    ),
}


def _bytes(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_clear_line(case, tmp_path, assets, capsys):
    make_args, message = BAD_INPUTS[case]
    out = tmp_path / "out" / "video.mp4"
    args = {
        "--reference": str(assets["reference"]),
        "--audio": str(assets["speech"]),
        "--config": "tiny",
    }
    extra = make_args(tmp_path, assets)
    args.update(dict(zip(extra[::2], extra[1::2], strict=True)))
    argv = ["render", "--out", str(out), "--quiet"] + [x for kv in args.items() for x in kv]
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("facecast: error:") and message in err, err
    assert len(err.splitlines()) == 1
    assert not out.exists()
    assert not out.parent.exists() or not any(out.parent.iterdir())  # no partial file


@pytest.mark.slow  # runs the command line in a process of its own
def test_cli_user_error_has_no_traceback(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "facecast.cli",
            "render",
            "--audio",
            str(tmp_path / "x.wav"),
            "--out",
            str(tmp_path / "o.mp4"),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().startswith("facecast: error:")


def _peak_rss_kb(argv: list[str]) -> int:
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, proc.stderr.read().decode()
    return usage.ru_maxrss


@pytest.mark.slow
def test_peak_memory_flat_over_duration(tmp_path, assets):
    """A 60 s demo render peaks within 10% of a 6 s render: memory does not grow with
    duration (the photo stack's: tests/test_photo.py)."""
    rng = np.random.default_rng(0)
    peaks = {}
    for seconds in (6, 60):
        t = np.arange(seconds * 16000) / 16000
        speechy = np.sin(2 * np.pi * 180 * t) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t))
        wav = write_wav(
            tmp_path / f"a{seconds}.wav", 0.3 * speechy + 0.01 * rng.standard_normal(t.size)
        )
        peaks[seconds] = _peak_rss_kb(
            [
                sys.executable,
                "-m",
                "facecast.cli",
                "render",
                "--config",
                "demo",
                "--reference",
                str(assets["reference"]),
                "--audio",
                str(wav),
                "--out",
                str(tmp_path / f"o{seconds}.mp4"),
                "--quiet",
            ]
        )
    assert peaks[60] <= 1.10 * peaks[6], peaks
