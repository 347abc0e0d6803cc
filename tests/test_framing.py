"""The real models' framing of a reference photo (`pipeline.flashhead.framing`,
`pipeline.liveavatar.framing`): a tilted face, framed by a rotated box or found with its
roll, is turned upright before the crop, so the model sees the same face it would see in
the upright photo; an upright face is cropped exactly as before (issue 33, item 2).

The tilted photos are the bundled portrait turned ±35° about its face (`support.hard_faces`);
the comparison is in the face's region of the crops, tiny crops on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from support.hard_faces import portrait, tilted

from pipeline.faces.finder import find_faces
from pipeline.faces.framing import cover_and_crop, found_face_box
from pipeline.flashhead.framing import crop_square, face_square, square_box
from pipeline.liveavatar.framing import frame_reference, framed_box

RATIO, SIDE = 2.0, 64  # FlashHead's face_ratio; a tiny square
WIDTH, HEIGHT = 48, 88  # LiveAvatar's 384x704, an eighth


def _authors_square(rgb, box, face_ratio, size):
    """The square as Facecast cut it before faces were turned upright (and as the authors
    cut theirs): `face_ratio` box widths wide, 55 % above the box's centre, clipped to the
    photo, resized, then scaled to cover (a no-op at that size)."""
    h, w = rgb.shape[:2]
    x, y, bw, bh = box[:4]
    cx, cy, side = x + bw / 2, y + bh / 2, bw * face_ratio
    left, top = int(max(0, cx - 0.5 * side)), int(max(0, cy - 0.55 * side))
    right, bottom = int(min(w, cx + 0.5 * side)), int(min(h, cy + 0.45 * side))
    crop = Image.fromarray(rgb).crop((left, top, right, bottom)).resize((size, size))
    return cover_and_crop(np.asarray(crop), size, size)


def _face_region(a, b, box) -> tuple[float, float]:
    """Mean absolute difference (0..255) and correlation of two crops inside the face box
    x, y, w, h (their pixels), shrunk to its middle 80 %."""
    x, y, w, h = box
    rows = slice(int(y + 0.1 * h), int(np.ceil(y + 0.9 * h)))
    cols = slice(int(x + 0.1 * w), int(np.ceil(x + 0.9 * w)))
    a, b = a[rows, cols].astype(float), b[rows, cols].astype(float)
    return float(np.abs(a - b).mean()), float(np.corrcoef(a.ravel(), b.ravel())[0, 1])


@pytest.mark.parametrize("angle", [35.0, -35.0])
def test_a_tilted_face_in_its_turned_box_gets_the_upright_faces_square(angle):
    """FlashHead's square of the portrait turned 35° about its face, framed by the box
    turned as the face is, is the upright portrait's square (a level or two apart in the
    face: two resamplings); the same box drawn upright frames a tilted face (far apart)."""
    upright, hard = portrait(), tilted(angle)
    want = crop_square(upright, hard.box, RATIO, SIDE)
    got = crop_square(hard.rgb, (*hard.box, angle), RATIO, SIDE)
    face = square_box(upright.shape, hard.box, RATIO, SIDE)
    diff, r = _face_region(got, want, face)
    assert diff < 3.0 and r > 0.995, (diff, r)
    diff, r = _face_region(crop_square(hard.rgb, hard.box, RATIO, SIDE), want, face)
    assert diff > 20 and r < 0.8, (diff, r)  # what the model saw before: a tilted face


@pytest.mark.parametrize("angle", [35.0, -35.0])
def test_a_found_tilted_face_is_turned_upright_by_its_landmarks_roll(angle):
    """Without a box, the face found in the tilted portrait is turned by its roll from the
    landmarks: its square matches the upright portrait's (within the roll read, a degree
    or two)."""
    upright, hard = portrait(), tilted(angle)
    box = found_face_box(hard.rgb)
    assert box is not None and abs(box[4] - (angle - 2.7)) < 3, box  # the portrait's own -2.7
    face = square_box(upright.shape, hard.box, RATIO, SIDE)
    diff, r = _face_region(
        face_square(hard.rgb, RATIO, SIDE), face_square(upright, RATIO, SIDE), face
    )
    assert diff < 12 and r > 0.97, (diff, r)


def test_an_upright_face_is_cropped_exactly_as_before():
    """A box of four numbers, a box turned less than 5° and the found face of the bundled
    portrait (its roll -2.7°) give the authors' square, byte for byte; LiveAvatar's framing
    of it is the plain cover-and-crop."""
    rgb = portrait()
    found = found_face_box(rgb)
    assert found is not None and abs(found[4]) < 5
    before = _authors_square(rgb, found, RATIO, SIDE)
    assert np.array_equal(face_square(rgb, RATIO, SIDE), before)
    assert np.array_equal(crop_square(rgb, found[:4], RATIO, SIDE), before)
    assert np.array_equal(crop_square(rgb, (*found[:4], 4.0), RATIO, SIDE), before)
    box = (120.0, 80.0, 260.0, 260.0)  # any upright box
    assert np.array_equal(
        crop_square(rgb, box, RATIO, SIDE), _authors_square(rgb, box, RATIO, SIDE)
    )
    assert np.array_equal(frame_reference(rgb, WIDTH, HEIGHT), cover_and_crop(rgb, WIDTH, HEIGHT))
    assert np.array_equal(
        frame_reference(rgb, WIDTH, HEIGHT, box), cover_and_crop(rgb, WIDTH, HEIGHT)
    )


@pytest.mark.parametrize("angle", [35.0, -35.0])
def test_liveavatar_turns_a_tilted_face_upright_before_its_crop(angle):
    """LiveAvatar's cover-and-crop of the tilted portrait, by the turned box or by the found
    face's roll, is the upright portrait's in the face."""
    upright, hard = portrait(), tilted(angle)
    want = frame_reference(upright, WIDTH, HEIGHT)
    face = framed_box(upright.shape, hard.box, WIDTH, HEIGHT)
    diff, r = _face_region(frame_reference(hard.rgb, WIDTH, HEIGHT, (*hard.box, angle)), want, face)
    assert diff < 3.0 and r > 0.995, (diff, r)
    diff, r = _face_region(frame_reference(hard.rgb, WIDTH, HEIGHT), want, face)
    assert diff < 12 and r > 0.97, (diff, r)
    diff, r = _face_region(frame_reference(hard.rgb, WIDTH, HEIGHT, hard.box), want, face)
    assert diff > 20 and r < 0.8, (diff, r)


@pytest.mark.parametrize("angle", [0.0, 35.0, -35.0])
def test_the_box_is_carried_into_the_framed_image(angle):
    """The hand-drawn box carried into the framed images (what `facecast eval --model`
    scores inside) is centred on the face the detector finds there (within 2 % of its
    side), as big (within 10 %: the detector's own spread across scales), and that face
    stands upright (within 5°)."""
    hard = tilted(angle)
    box = (*hard.box, angle)
    size = 256
    for framed, carried in (
        (crop_square(hard.rgb, box, RATIO, size), square_box(hard.rgb.shape, box, RATIO, size)),
        (frame_reference(hard.rgb, 192, 352, box), framed_box(hard.rgb.shape, box, 192, 352)),
    ):
        found = find_faces(framed)[0]
        centre = lambda b: np.array([b[0] + b[2] / 2, b[1] + b[3] / 2])  # noqa: E731
        assert np.linalg.norm(centre(found.box) - centre(carried)) < 0.02 * found.box[2]
        assert abs(carried[2] / found.box[2] - 1) < 0.10  # the box drawn was the found face's
        assert abs(np.degrees(found.roll)) < 5
