"""The photo stack on the synthetic world (issue 16): a reference from `facecast make-reference`
animates with the world's own face geometry on every skin tone, lip-syncs against the
world's ground truth, and leaves the bottom-left corner alone; a picture whose identity
chunk is not true of it is treated like any photo, so a faceless one is still refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
from support.photos import write_bad_photos

from facecast.cli import main
from pipeline.config import load_config
from pipeline.eval.metrics import corner_error
from pipeline.media import load_image, png_text, write_png, write_wav
from pipeline.photo.reference import prepare_reference, prepare_synthetic
from pipeline.startup import load_engine
from pipeline.synth.dataset import identity_for
from pipeline.synth.face import landmarks, random_identity, render_reference
from pipeline.synth.reference import identity_of, identity_text
from pipeline.train.evaluate import EVAL_SEED, generate, held_out_speech, score

SIZE = 256
# held-out identities (`pipeline.train.evaluate --identity N`) of each skin-tone group
GROUPS = {"light": 2, "medium": 6, "dark": 1}
DARK_SEED = 4  # `facecast make-reference --seed 4`: a dark face the Haar detector missed


def skin_group(identity) -> str:
    lum = float(np.mean(identity.skin))
    return "dark" if lum < 0.35 else "light" if lum >= 0.65 else "medium"


@pytest.fixture(scope="module")
def photo_engine():
    return load_engine(load_config("photo"), "cpu")


@pytest.mark.parametrize("group", GROUPS)
def test_every_skin_tone_lip_syncs_and_leaves_the_corner_alone(photo_engine, group):
    """3 s of held-out speech through the photo stack, scored with the ground-truth metric
    (`pipeline.train.evaluate.score`): r >= 0.8 (the issue's bar; the eight held-out people
    score 0.87-0.92 on this clip); the bottom-left 8x16 pixels are the reference's."""
    identity = identity_for(EVAL_SEED, GROUPS[group])
    assert skin_group(identity) == group
    reference = render_reference(identity, SIZE)
    audio = held_out_speech(3.0)
    cfg = photo_engine.cfg
    prepared = prepare_synthetic(reference, identity, SIZE, SIZE, cfg.photo)
    frames, seams, *_ = generate(photo_engine, prepared, audio)
    scores = score(frames, reference, audio, seams)
    assert len(frames) == 75
    assert scores["lip_sync_r"] >= 0.8, scores
    assert scores["opening_std"] > 2e-4, scores  # the mouth visibly opens, on dark skin too
    corner, elsewhere = corner_error(frames, reference)
    assert corner == 0.0 and elsewhere > 0.2, (corner, elsewhere)


@pytest.mark.parametrize("group", GROUPS)
def test_geometry_is_where_the_world_painted_the_face(group):
    """The landmarks fall on the painted features: the closed lips' seam (the darkest row)
    at the mouth centre, lips just below it and skin beside the mouth, eye whites in each
    eye box, all inside the face outline."""
    identity = identity_for(EVAL_SEED, GROUPS[group])
    rgb = render_reference(identity, SIZE).astype(np.float32) / 255
    marks = landmarks(identity, SIZE)
    mx, my = (int(v) for v in marks.mouth)
    column = rgb[my - 4 : my + 5, mx].mean(axis=1)
    assert abs(int(np.argmin(column)) - 4) <= 1, column
    lips, skin = np.array(identity.lips), np.array(identity.skin)

    def nearer(pixel, a, b) -> bool:
        return bool(np.abs(pixel - a).sum() < np.abs(pixel - b).sum())

    assert nearer(rgb[my + 2, mx], lips, skin)
    assert nearer(rgb[my, int(mx + 1.5 * marks.mouth_half_width)], skin, lips)
    for x, y, w, h in marks.eyes:
        eye = rgb[int(y) : int(y + h), int(x) : int(x + w)].reshape(-1, 3)
        assert (eye.min(axis=1) > 0.9).mean() > 0.1  # sclera (the iris fills the middle)
    ox, oy, ow, oh = marks.outline
    assert ox < marks.eyes[0][0] and marks.eyes[1][0] + marks.eyes[1][2] < ox + ow
    assert oy < marks.eyes[0][1] < my < oy + oh


def test_make_reference_png_renders_with_the_default_photo_stack(tmp_path, capsys):
    """`facecast make-reference` → `facecast render` (default config: photo) works on a
    dark face (one Haar did not find); the same picture re-encoded without its text is a
    plain photo again, and BlazeFace finds that face too. `facecast eval --photo` scores
    the video against it."""
    ref, out = tmp_path / "dark.png", tmp_path / "dark.mp4"
    assert main(["make-reference", "--seed", str(DARK_SEED), "--out", str(ref)]) == 0
    wav = write_wav(tmp_path / "a.wav", held_out_speech(2.0))
    args = ["render", "--reference", str(ref), "--audio", str(wav), "--quiet", "--threads", "1"]
    assert main([*args, "--out", str(out)]) == 0
    assert out.stat().st_size > 0
    # `facecast eval --photo` scores it too, with the face box its geometry gives
    scored = tmp_path / "scores.json"
    evaluate = ["eval", "--photo", str(ref), "--video", str(out), "--audio", str(wav)]
    assert main([*evaluate, "--json", str(scored)]) == 0
    scores = json.loads(scored.read_text())
    assert scores["n_frames"] == 50 and scores["ssim_outside_mouth"] >= 0.9, scores
    assert scores["mouth_speech_r_best"] >= 0.5, scores
    plain = write_png(tmp_path / "plain.png", load_image(ref))  # the pixels, no chunk
    assert main([*args, "--reference", str(plain), "--out", str(tmp_path / "plain.mp4")]) == 0


def test_an_identity_chunk_that_is_not_true_of_the_picture_is_ignored(tmp_path, capsys):
    """A faceless real photo carrying some identity's chunk is still refused with the one
    clear line; an edited synthetic picture falls back to the detector too."""
    identity = random_identity(DARK_SEED)
    text = identity_text(identity)
    faceless = write_bad_photos(tmp_path)["faceless"][0]
    wall = write_png(tmp_path / "wall.png", load_image(faceless), text=text)
    wav = write_wav(tmp_path / "a.wav", held_out_speech(1.0))
    out = tmp_path / "o.mp4"
    code = main(["render", "--reference", str(wall), "--audio", str(wav), "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "no face found" in err[0], err
    assert not out.exists()
    picture = render_reference(identity, SIZE)
    assert identity_of(text, picture) == identity
    edited = picture.copy()
    edited[100:110, 100:110] = 255  # a pasted patch: no longer that identity's render
    assert identity_of(text, edited) is None
    assert identity_of({"facecast-identity": "{not json"}, picture) is None
    assert identity_of({"facecast-identity": '{"hair_style": 99}'}, picture) is None


async def test_an_uploaded_synthetic_png_gets_the_worlds_geometry(tmp_path):
    """`POST /photos` prepares uploads through the same path (`realtime.photos.prepare`)."""
    from realtime.photos import prepare

    identity = random_identity(DARK_SEED)
    path = write_png(tmp_path / "r.png", render_reference(identity, 512), identity_text(identity))
    data = path.read_bytes()
    assert png_text(data) == identity_text(identity)
    cfg = load_config("photo")
    prepared = await prepare(cfg, data, "r.png")
    assert prepared.framed.shape == (SIZE, SIZE, 3)
    mouth = landmarks(identity, 512).mouth
    assert np.allclose(prepared.face.mouth, (mouth[0] / 2, mouth[1] / 2))  # 512 → 256
    direct = prepare_reference(data, "r.png", SIZE, SIZE, cfg.photo)
    assert direct.face == prepared.face and np.array_equal(direct.framed, prepared.framed)


def test_png_text_skips_a_damaged_chunk(tmp_path):
    data = write_png(tmp_path / "t.png", np.zeros((4, 4, 3), np.uint8), {"k": "v"}).read_bytes()
    assert png_text(data) == {"k": "v"}
    at = data.index(b"tEXt") + 4
    broken = data[:at] + b"x" + data[at + 1 :]  # the CRC no longer matches
    assert png_text(broken) == {}
    assert png_text(data[: at + 1]) == {}  # cut off inside the chunk


def test_a_dark_face_without_its_chunk_is_found():
    """Haar missed dark skin more often (half of the bench's darkest faces); BlazeFace finds
    held-out identity 7 (dark) as a plain picture, and its landmarks put the face box on
    the outline and the mouth where the world painted it; the faceless picture is still
    refused (test_photo's bad photos)."""
    from pipeline.faces.finder import detect_faces
    from pipeline.photo.face import prepare_photo

    identity = identity_for(EVAL_SEED, 7)
    assert skin_group(identity) == "dark"
    rgb = render_reference(identity, SIZE)
    faces = detect_faces(rgb)
    assert len(faces) == 1
    x, y, w, h = faces[0]
    ox, oy, ow, oh = landmarks(identity, SIZE).outline
    assert abs((x + w / 2) - (ox + ow / 2)) < 0.1 * w and 0.75 * oh < h < 1.1 * oh
    prepared = prepare_photo(rgb, SIZE, SIZE, load_config("photo").photo)
    mx, my = prepared.face.mouth
    assert abs(mx - landmarks(identity, SIZE).mouth[0]) < 3
    assert abs(my - landmarks(identity, SIZE).mouth[1]) < 3
