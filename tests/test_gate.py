"""Quality gate: an identical build passes tier 1, one changed pixel is caught, a
nondeterministic baseline is refused, and tier 2 judges a change by the band's two samples of
reordering noise: its error over all frames, and its worst frame within their spread."""

import json

import numpy as np
import pytest

from facecast.cli import main
from pipeline import gate
from pipeline.errors import FacecastError


@pytest.fixture(scope="module")
def baseline(tiny_engine, tmp_path_factory):
    d = tmp_path_factory.mktemp("gate")
    meta = gate.record_baseline(tiny_engine, d, seconds=1.0)
    return d, meta


def test_identical_run_passes_tier_one(tiny_engine, baseline):
    d, meta = baseline
    report = gate.check(tiny_engine, d)
    assert report.passed and report.tier == 1
    assert report.identical_frames == meta["frames"] == 25


def test_one_changed_pixel_fails_tier_one_and_the_band(baseline):
    d, meta = baseline
    frames = np.load(d / "frames.npy").copy()
    frames[7, 40, 50, 1] ^= 0xFF
    report = gate.compare(meta, np.load(d / "frames.npy"), frames)
    assert not report.passed and report.tier is None
    assert report.identical_frames == len(frames) - 1
    assert "frame 7" in report.message
    # each frame's PSNR in order: the changed one alone below the cap
    assert len(report.psnr_frames) == len(frames)
    assert [i for i, x in enumerate(report.psnr_frames) if x < gate.PSNR_CAP] == [7]
    assert gate.precision_tier(report, 30.0).psnr_frames == report.psnr_frames


def test_each_frame_of_the_band_is_kept_beside_the_candidates(baseline):
    # a stream that feeds its frames back can amplify rounding chunk by chunk: the band's
    # frames, beside the candidate's, tell that from a change's own loss
    d, meta = baseline
    band = meta["band_psnr_frames"]
    assert len(band) == meta["frames"] and min(band) == pytest.approx(
        meta["band_psnr_min"], abs=0.01
    )
    base = np.load(d / "frames.npy")
    report = gate.compare(meta, base, base)
    assert report.band_psnr_frames == band
    assert gate.precision_tier(report, 30.0).band_psnr_frames == band


def test_small_reassociation_like_change_passes_tier_two(baseline):
    d, meta = baseline
    base = np.load(d / "frames.npy")
    changed = base.copy()
    changed.reshape(-1)[::50] ^= 1  # one step on 2% of the values: ~65 dB
    report = gate.compare(
        {**meta, "band_psnr_min": 40.0, "band_psnr_pooled": 45.0, "band_spread_db": 1.0},
        base,
        changed,
    )
    assert report.passed and report.tier == 2


def _with_error(base: np.ndarray, psnr_db: list[float]) -> np.ndarray:
    """`base` (values in 20..235) with frame f moved by 8 grey levels on the share of its
    values that gives it about psnr_db[f]."""
    out = base.copy()
    rng = np.random.default_rng(0)
    for f, db in enumerate(psnr_db):
        share = 255.0**2 / 10 ** (db / 10) / 64
        flat = out[f].reshape(-1)
        hit = rng.random(flat.size) < share
        flat[hit] += 8
    return out


def _noisy_meta(frames: np.ndarray, band_min: float, band_pooled: float, spread: float) -> dict:
    return {
        "hashes": gate.frame_hashes(frames),
        "band_psnr_min": band_min,
        "band_psnr_pooled": band_pooled,
        "band_spread_db": spread,
    }


def test_a_worst_frame_under_the_band_by_less_than_its_spread_passes():
    # FlashHead Pro's compiled bf16 build (H100, 2026-12-05): as noisy as the band over all
    # frames, its worst frame 1 dB under the band's worst, where the band's own samples
    # disagree by ~2 dB on a frame; a worst frame alone rejected it
    base = np.random.default_rng(1).integers(20, 236, (30, 32, 32, 3), dtype=np.uint8)
    frames = _with_error(base, [38.5] * 29 + [30.7])
    meta = _noisy_meta(base, band_min=31.75, band_pooled=37.3, spread=1.9)
    report = gate.compare(meta, base, frames)
    assert report.passed and report.tier == 2, report.message
    assert report.worst_allowance_db == pytest.approx(1.9)
    # the same frames against a band whose samples agree (spread under the tolerance)
    strict = gate.compare({**meta, "band_spread_db": 0.2}, base, frames)
    assert not strict.passed and "frame 29" in strict.message


def test_a_change_noisier_than_the_band_over_all_frames_is_rejected():
    # every frame a little noisier than the band pooled, none far under its worst: what a
    # worst frame alone lets through
    base = np.random.default_rng(2).integers(20, 236, (6, 64, 64, 3), dtype=np.uint8)
    frames = _with_error(base, [33.0] * 6)
    report = gate.compare(_noisy_meta(base, 32.0, 36.0, 1.0), base, frames)
    assert not report.passed and "pooled" in report.message
    assert report.psnr_pooled == pytest.approx(33.0, abs=0.3)


def test_a_baseline_with_one_band_sample_judges_the_worst_frame_alone():
    # recorded before the band had two samples: as the gate judged then
    base = np.random.default_rng(3).integers(20, 236, (4, 64, 64, 3), dtype=np.uint8)
    frames = _with_error(base, [33.0] * 4)
    old = {"hashes": gate.frame_hashes(base), "band_psnr_min": 33.2}
    report = gate.compare(old, base, frames)
    assert report.passed and report.band_psnr_pooled is None
    assert "--record again" in report.message
    assert report.worst_allowance_db == gate.DEFAULT_TOLERANCE_DB


def test_the_band_is_two_reorderings_frame_by_frame_the_noisier(baseline):
    _, meta = baseline
    halves, thirds = meta["band_samples_psnr_frames"]
    assert meta["band_psnr_frames"] == [min(a, b) for a, b in zip(halves, thirds, strict=True)]
    assert meta["band_spread_db"] == pytest.approx(
        gate.band_spread(np.array(halves), np.array(thirds)), abs=0.02
    )
    assert meta["band_psnr_pooled"] >= meta["band_psnr_min"]


def test_the_spread_leaves_out_frames_a_reordering_rendered_identically():
    cap = gate.PSNR_CAP
    assert gate.band_spread(np.array([cap, 50.0, 48.0]), np.array([60.0, 51.5, 47.0])) == 1.5
    assert gate.band_spread(np.array([cap, cap]), np.array([cap, 70.0])) == 0.0


def test_band_comes_from_a_reduction_order_change(baseline):
    _, meta = baseline
    # fp32 on the CPU: splitting each linear's sum moves a few values by one step at most
    assert 60.0 < meta["band_psnr_min"] <= gate.PSNR_CAP


def test_nondeterministic_baseline_is_refused(tiny_engine, tmp_path, monkeypatch):
    real = gate.render_fixed
    calls = []

    def flaky(engine, seconds, seed):
        frames = real(engine, seconds, seed)
        calls.append(1)
        if len(calls) == 2:
            frames[0, 0, 0, 0] ^= 1
        return frames

    monkeypatch.setattr(gate, "render_fixed", flaky)
    with pytest.raises(FacecastError, match="dual baseline"):
        gate.record_baseline(tiny_engine, tmp_path, seconds=0.5)


def test_gate_command_records_then_passes(tmp_path):
    d = tmp_path / "base"
    args = ["gate", "--config", "tiny", "--baseline", str(d), "--seconds", "0.6", "--device", "cpu"]
    report = tmp_path / "r.json"
    assert main(args + ["--json", str(report)]) == 0
    assert json.loads(report.read_text())["tier"] == 1
    assert json.loads((d / "baseline.json").read_text())["frames"] == 15


def test_gate_refuses_fp8_on_a_device_without_it_before_recording(tmp_path, capsys):
    d = tmp_path / "base"
    args = ["gate", "--config", "tiny", "--baseline", str(d), "--device", "cpu"]
    assert main(args + ["--precision", "fp8"]) == 2
    assert "needs an FP8 GPU" in capsys.readouterr().err
    assert not d.exists()  # no minutes spent recording a baseline it cannot use


def test_reassociation_reaches_a_linear_run_on_another_thread():
    """An engine may run its steps on a thread of its own (FlashHead's step batcher): the
    reassociated order reaches it there too, or the band is the baseline itself (100 dB)."""
    import threading

    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(4, 64, generator=g), torch.randn(8, 64, generator=g)
    seen: list[torch.Tensor] = []
    with gate.reassociated():
        thread = threading.Thread(target=lambda: seen.append(F.linear(x, w)))
        thread.start()
        thread.join()
    halves = F.linear(x[:, :32], w[:, :32]) + F.linear(x[:, 32:], w[:, 32:])
    assert torch.equal(seen[0], halves)
    assert F.linear is torch._C._nn.linear  # put back as it was
    with gate.reassociated(3):
        thirds = F.linear(x, w)
    parts = [F.linear(x[:, a:b], w[:, a:b]) for a, b in ((0, 21), (21, 42), (42, 64))]
    assert torch.equal(thirds, parts[0] + parts[1] + parts[2])
