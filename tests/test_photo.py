"""The photo stack (issue 16): a real portrait talks, keeps its likeness and follows speech;
bad photos fail in one line; streaming equals batch; memory does not grow."""

from __future__ import annotations

import numpy as np
import pytest
from support.photos import PORTRAIT, write_bad_photos

from facecast.cli import main
from pipeline.config import load_config
from pipeline.eval.photo import run_photo_eval
from pipeline.media import iter_audio, load_reference, write_wav
from pipeline.photo.face import prepare_photo
from pipeline.startup import load_engine
from pipeline.train.evaluate import held_out_speech


@pytest.fixture(scope="module")
def photo_engine():
    return load_engine(load_config("photo"), "cpu")


@pytest.fixture(scope="module")
def speech10(tmp_path_factory):
    """10 s of held-out espeak-ng speech (sentences and pauses), as the issue measures."""
    return write_wav(tmp_path_factory.mktemp("speech") / "speech10.wav", held_out_speech(10.0))


def stream(engine, photo, audio: np.ndarray, cuts: list[int]) -> np.ndarray:
    session = engine.new_stream(photo, seed=3)
    frames = []
    for a, b in zip([0, *cuts], [*cuts, len(audio)], strict=True):
        session.push_audio(audio[a:b])
        frames += [batch.frames for batch in session.generate_ready()]
    frames += [batch.frames for batch in session.finish()]
    session.close()
    return np.concatenate(frames)


def test_real_portrait_talks_and_keeps_its_likeness(tmp_path, speech10):
    """`facecast render` of a real public-domain portrait, scored as the issue does:
    SSIM outside the mouth box >= 0.6, mouth motion vs speech r >= 0.5, face found."""
    out = tmp_path / "hopper.mp4"
    args = ["render", "--reference", str(PORTRAIT), "--audio", str(speech10), "--out", str(out)]
    assert main([*args, "--quiet", "--threads", "1"]) == 0
    audio = np.concatenate([b.model for b in iter_audio(speech10)])
    scores = run_photo_eval(out, PORTRAIT, audio)
    assert scores.n_frames == 250
    assert scores.ssim_outside_mouth >= 0.6, scores
    assert scores.mouth_speech_r >= 0.5, scores
    assert scores.face_detected == 1.0, scores


def test_mouth_is_closed_in_silence_and_moves_in_speech(photo_engine, speech10):
    """Idle motion in silence (blinks, sway) but no talking; the mouth opens in speech."""
    photo = load_reference(PORTRAIT, photo_engine.cfg)
    prepared = prepare_photo(photo, 256, 256, photo_engine.cfg.photo)
    silence = np.zeros(16000 * 4, np.float32)
    frames = stream(photo_engine, prepared, silence, [])
    x0, y0, x1, y1 = (int(v) for v in _mouth_box(prepared.face.box))
    rest = prepared.framed[y0:y1, x0:x1].astype(np.float32)
    quiet = np.abs(frames[:, y0:y1, x0:x1].astype(np.float32) - rest).mean()
    assert np.abs(np.diff(frames.astype(np.float32), axis=0)).mean() > 0.05  # never frozen
    audio = np.concatenate([b.model for b in iter_audio(speech10)])
    talking = stream(photo_engine, prepared, audio, [])
    moving = np.abs(talking[:, y0:y1, x0:x1].astype(np.float32) - rest).mean(axis=(1, 2, 3))
    assert np.percentile(moving, 90) > 4 * quiet, (quiet, np.percentile(moving, 90))


def _mouth_box(box):
    x, y, w, h = box
    return x + 0.2 * w, y + 0.6 * h, x + 0.8 * w, y + h


def test_streaming_equals_batch_for_any_split(photo_engine):
    """The same frames whether the audio comes at once or in odd pieces."""
    rng = np.random.default_rng(0)
    audio = held_out_speech(3.0, seed=7)
    photo = load_reference(PORTRAIT, photo_engine.cfg)
    whole = stream(photo_engine, photo, audio, [])
    assert len(whole) == 75
    for _ in range(2):
        cuts = sorted(rng.choice(np.arange(1, len(audio)), size=7, replace=False).tolist())
        assert np.array_equal(stream(photo_engine, photo, audio, cuts), whole)


@pytest.fixture(scope="module")
def bad_photos(tmp_path_factory):
    return write_bad_photos(tmp_path_factory.mktemp("bad"))


@pytest.mark.parametrize(
    "case",
    [
        "faceless",
        "tiny face",
        "two faces",
        "truncated",
        "corrupt",
        "not an image",
        "too many pixels",
        "too many bytes",
    ],
)
def test_bad_photo_is_one_clear_line_and_no_file(case, bad_photos, speech10, tmp_path, capsys):
    path, message = bad_photos[case]
    out = tmp_path / "o.mp4"
    code = main(["render", "--reference", str(path), "--audio", str(speech10), "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and message in err, err
    assert not out.exists() and not list(tmp_path.iterdir())


def test_serve_refuses_a_faceless_reference_at_start(bad_photos, capsys):
    path, message = bad_photos["faceless"]
    assert main(["serve", "--device", "cpu", "--reference", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_a_missing_face_runtime_stops_start_up_in_one_line(monkeypatch, capsys, speech10, tmp_path):
    """Without LiteRT (the runtime of the face models) serve and render say what to install
    at start-up (exit 2, one line) instead of failing inside every session."""
    import sys

    import pipeline.faces.landmarks as landmarks
    import realtime.server

    def serve_anyway(*args, **kwargs):
        raise AssertionError("serve went on to listen")

    monkeypatch.setitem(sys.modules, "ai_edge_litert.interpreter", None)  # import fails
    monkeypatch.setattr(landmarks, "_interpreters", {})
    monkeypatch.setattr(realtime.server, "serve", serve_anyway)
    assert main(["serve", "--device", "cpu", "--config", "photo", "--port", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'ai-edge-litert>=2.3'" in err[0], err
    # render: the photo is read before the engine starts, and the same line stops it
    out = tmp_path / "o.mp4"
    args = ["render", "--reference", str(PORTRAIT), "--audio", str(speech10), "--out", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'ai-edge-litert>=2.3'" in err[0], err
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("config", ["photo"])
def test_photo_memory_flat_over_60s(config, tmp_path):
    """A 60 s photo render peaks within 10% of a 6 s one (see test_render for demo)."""
    import sys

    from tests.test_render import _peak_rss_kb

    peaks = {}
    for seconds in (6, 60):
        wav = write_wav(tmp_path / f"a{seconds}.wav", np.tile(held_out_speech(6.0), seconds // 6))
        argv = [sys.executable, "-m", "facecast.cli", "render", "--config", config]
        argv += ["--audio", str(wav), "--out", str(tmp_path / f"o{seconds}.mp4"), "--quiet"]
        peaks[seconds] = _peak_rss_kb(argv)
    assert peaks[60] <= 1.10 * peaks[6], peaks


def test_shipped_motion_weights_are_small_and_trained():
    """The photo stack's weights ship in the package (no download), load strictly, and
    are the trained ones (their summary records the held-out fit)."""
    import json

    from pipeline.module import PACKAGE_WEIGHTS

    folder = PACKAGE_WEIGHTS / "photo"
    assert sum(p.stat().st_size for p in folder.iterdir()) <= 20 * 2**20
    summary = json.loads((folder / "train_summary.json").read_text())
    assert summary["held_out_pearson_r"]["jaw"] >= 0.95, summary
    engine = load_engine(load_config("photo"))  # strict keys and shapes
    assert (
        sum(p.numel() for p in engine.modules["motion"].model.parameters()) == summary["parameters"]
    )
