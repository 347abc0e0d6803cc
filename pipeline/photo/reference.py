"""The photo stack's reference, from the file's bytes to a `PreparedPhoto`: one path for all.

`facecast render`, `serve --reference` (and the fleet worker's copy of it) and `POST /photos`
all come here with the bytes they were given. The bytes are checked and decoded
(`pipeline.photo.face.read_photo`); then:

- a reference from the synthetic world (`facecast make-reference`, and the bundled
  `pipeline/assets/reference.png`) names its identity in a PNG text chunk, checked by
  re-rendering it (`pipeline.synth.reference`, whose docstring says why this and not a
  pixel-based fallback). Its geometry is the world's own (`pipeline.synth.face.landmarks`):
  nothing is detected, so every skin tone gets the exact face, eyes and mouth the world
  drew;
- every other photo goes through the face detector and landmarks, and the measurements of
  `pipeline.photo.face.prepare_photo`, with its one-line errors (no face, several, too
  small, cut off);
- a face box drawn by hand (`--face-box`, the upload's `face_box`; original photo pixels)
  takes the detector's place for any photo, a synthetic one included: the user said where
  the face is.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.config import FacecastConfig, PhotoConfig
from pipeline.errors import MediaError
from pipeline.media import png_text
from pipeline.photo.face import (
    FaceBox,
    FaceGeometry,
    PreparedPhoto,
    frame_face,
    prepare_photo,
    read_photo,
    read_photo_file,
)
from pipeline.synth.face import FaceIdentity, landmarks
from pipeline.synth.reference import identity_of

# The face box the warp's proportions were set for is a frontal-face detector's: square,
# from the forehead to below the chin. On the five held-out synthetic faces Haar does find,
# its box is 0.85-1.01x the face outline's height (mean 0.93) and centred on the outline
# within 5 px at 256x256. The synthetic face's box is that mean square, centred on the
# outline, so the jaw opens as far (`photo.jaw_open` x box width) as on a face the detector
# sees, and the same on every skin tone.
_BOX_SIDE_PER_OUTLINE_HEIGHT = 0.93


def prepare_reference(
    data: bytes,
    name: str,
    width: int,
    height: int,
    cfg: PhotoConfig,
    face_box: FaceBox | None = None,
) -> PreparedPhoto:
    """Checked, decoded and framed reference with its face geometry, from the file's bytes;
    `face_box` (original photo pixels) frames it by hand instead of any detection."""
    rgb = read_photo(data, name, cfg)
    if face_box is not None:
        return prepare_photo(rgb, width, height, cfg, face_box)
    identity = identity_of(png_text(data), rgb)
    if identity is not None:
        return prepare_synthetic(rgb, identity, width, height, cfg)
    return prepare_photo(rgb, width, height, cfg)


def load_prepared(
    path: str | Path, cfg: FacecastConfig, face_box: FaceBox | None = None
) -> PreparedPhoto:
    """`prepare_reference` of a file, at the config's video size."""
    if not Path(path).is_file():
        raise MediaError(f"reference image not found: {path}")
    data = read_photo_file(str(path), cfg.photo)
    return prepare_reference(
        data, str(path), cfg.video.width, cfg.video.height, cfg.photo, face_box
    )


def prepare_synthetic(
    rgb: np.ndarray, identity: FaceIdentity, width: int, height: int, cfg: PhotoConfig
) -> PreparedPhoto:
    """A synthetic identity's neutral render `rgb` (square, any side), framed to the video
    like any photo, with the geometry the world drew it with instead of a detector's."""
    side = rgb.shape[0]
    if rgb.shape[:2] != (side, side):
        raise ValueError(f"a synthetic reference is square, got {rgb.shape[1]}x{rgb.shape[0]}")
    marks = landmarks(identity, side)
    ox, oy, ow, oh = marks.outline
    box_side = _BOX_SIDE_PER_OUTLINE_HEIGHT * oh
    face_box = np.array(
        [ox + 0.5 * ow - 0.5 * box_side, oy + 0.5 * oh - 0.5 * box_side, box_side, box_side]
    )
    framing, box = frame_face(rgb.shape, face_box, width, height, cfg)
    eyes = tuple(_box(framing.box(np.array(eye))) for eye in marks.eyes)
    return PreparedPhoto(
        framing.apply(rgb),
        FaceGeometry(
            box=_box(box),
            mouth=framing.point(*marks.mouth),
            mouth_half_width=marks.mouth_half_width * framing.scale,
            eyes=eyes,
            skin=_rgb255(identity.skin),
            lips=_rgb255(identity.lips),
        ),
        _box(face_box),
    )


def _box(box: np.ndarray) -> tuple[float, float, float, float]:
    x, y, w, h = (float(v) for v in box)
    return x, y, w, h


def _rgb255(colour: tuple[float, float, float]) -> tuple[float, float, float]:
    r, g, b = (255.0 * c for c in colour)
    return r, g, b
