"""The procedural face renderer: deterministic, face-like, driven by its params."""

import numpy as np
import pytest

from pipeline.synth.face import FaceIdentity, random_identity, render_frames, render_reference
from pipeline.synth.motion import MotionTrack


def _track(n: int, **arrays) -> MotionTrack:
    return MotionTrack.neutral(n).replace(
        **{k: np.full(n, v, np.float32) for k, v in arrays.items()}
    )


def test_render_is_deterministic_and_shaped():
    ident = random_identity(3)
    track = _track(5, jaw=0.5, head_x=0.01, blink=0.2)
    a = render_frames(ident, track, 128)
    b = render_frames(ident, track, 128)
    assert a.dtype == np.uint8 and a.shape == (5, 128, 128, 3)
    assert np.array_equal(a, b)
    # Batching is an implementation detail: it must not change a pixel.
    assert np.array_equal(a, render_frames(ident, track, 128, batch=2))


def test_random_identity_is_deterministic_and_identities_differ():
    assert random_identity(5) == random_identity(5)
    refs = [render_reference(random_identity(s), 64).astype(np.float32) for s in range(8)]
    for i in range(8):
        for j in range(i + 1, 8):
            assert np.abs(refs[i] - refs[j]).mean() > 8.0, (i, j)


def test_identity_dict_round_trip_and_unknown_field():
    ident = random_identity(9)
    assert FaceIdentity.from_dict(ident.to_dict()) == ident
    with pytest.raises(ValueError, match="unknown FaceIdentity fields"):
        FaceIdentity.from_dict({"nose_colour": 1})


def _mouth_region(img: np.ndarray, ident: FaceIdentity) -> np.ndarray:
    s = img.shape[0]
    cy = int((ident.face_y + ident.mouth_y + 1) / 2 * s)
    return img[cy - s // 16 : cy + s // 8, s // 2 - s // 10 : s // 2 + s // 10].astype(np.float32)


def test_open_jaw_shows_dark_mouth_and_teeth():
    ident = random_identity(1)
    closed = render_frames(ident, _track(1, jaw=0.0, teeth=1.0), 128)[0]
    opened = render_frames(ident, _track(1, jaw=1.0, teeth=1.0), 128)[0]
    mc, mo = _mouth_region(closed, ident), _mouth_region(opened, ident)
    dark = lambda m: (m.mean(axis=-1) < 60).sum()  # noqa: E731
    white = lambda m: ((m.min(axis=-1) > 180) & (np.ptp(m, axis=-1) < 40)).sum()  # noqa: E731
    assert dark(mo) > dark(mc) + 30
    assert white(mo) > white(mc) + 10
    # Only the lower face changes when the mouth opens.
    top = slice(0, int((ident.face_y + ident.eye_y + 1) / 2 * 128))
    assert np.array_equal(closed[top], opened[top])


def test_blink_closes_the_eyes():
    ident = random_identity(2)
    a = render_frames(ident, _track(1, blink=0.0), 256)[0].astype(np.float32)
    b = render_frames(ident, _track(1, blink=1.0), 256)[0].astype(np.float32)
    ey = int((ident.face_y + ident.eye_y + 1) / 2 * 256)
    eyes = slice(ey - 10, ey + 10)
    # Open eyes show white sclera; closed ones do not.
    assert (a[eyes].min(axis=-1) > 200).sum() > 10
    assert (b[eyes].min(axis=-1) > 200).sum() < (a[eyes].min(axis=-1) > 200).sum() / 4


def test_head_motion_moves_the_head_not_the_background():
    ident = random_identity(4)
    a = render_frames(ident, _track(1), 128)[0].astype(np.float32)
    b = render_frames(ident, _track(1, head_x=0.06), 128)[0].astype(np.float32)
    # 0.06 normalised = ~4 px right: the moved frame matches the still one shifted.
    assert np.abs(a[20:90, 30:90] - b[20:90, 34:94]).mean() < np.abs(a - b)[20:90, 30:90].mean() / 3
    assert np.array_equal(a[:, :4], b[:, :4])  # the frame's left edge is background


def test_sizes_share_one_layout():
    ident = random_identity(6)
    small = render_reference(ident, 128).astype(np.float32)
    big = render_reference(ident, 256).astype(np.float32)
    down = big.reshape(128, 2, 128, 2, 3).mean(axis=(1, 3))
    assert np.abs(small - down).mean() < 3.0


def test_too_small_size_is_refused():
    with pytest.raises(ValueError, match="too small"):
        render_frames(random_identity(0), MotionTrack.neutral(1), 16)
