"""The reference photo: checked, its one face found, framed to the video, measured.

A photo is checked before anything is decoded (bytes, type by its magic bytes, pixel
count from the header), then decoded with PyAV. Its faces are found by the shared finder
(`pipeline.faces.finder`: BlazeFace, each face confirmed by FaceMesh). The photo is scaled
to cover the video size and centre-cropped (the face box is mapped through the same
transform, so detection runs once, on the full photo); where the centred crop would cut
the face, the crop slides just enough to hold it. Every failure is a `PhotoError` with one
line that says what to change.

Where the detector misses the face or picks the wrong one, the user frames it by hand
(`pipeline.faces.face_box`: the face box X,Y,W,H[,ANGLE] and its rules), used instead of
detection. A detected face goes the same way as a box drawn around it, so the same box
gives the same result whoever drew it.

The geometry the warp needs (`FaceGeometry`) comes from FaceMesh's landmarks read inside
the box: the face's own square and roll (`box_from_mesh`, the eye line), the seam between
the lips, the eyes. Where FaceMesh sees no face in a hand-drawn box, a frontal face's
proportions in the box, turned by the box's angle, stand in.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import av
import cv2
import numpy as np

from pipeline.config import PhotoConfig
from pipeline.errors import PhotoError
from pipeline.faces import landmarks
from pipeline.faces.face_box import MAX_ROLL_DEG, FaceBox, box_angle, check_face_box
from pipeline.faces.finder import MIN_PRESENCE, ROI_PER_SIDE, box_from_mesh, find_faces
from pipeline.faces.landmarks import Mesh, turn

# PNG, JPEG and WebP, by their first bytes: what the page's upload accepts.
_MAGIC = {b"\x89PNG\r\n\x1a\n": "image/png", b"\xff\xd8\xff": "image/jpeg"}
IMAGE_TYPES = ("image/png", "image/jpeg", "image/webp")
_SECOND_FACE = 0.25  # another face at least this share of the largest one's area counts


def sniff_type(data: bytes) -> str | None:
    """The image type from the magic bytes, or None when it is not PNG, JPEG or WebP."""
    for magic, kind in _MAGIC.items():
        if data.startswith(magic):
            return kind
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def read_photo(data: bytes, name: str, cfg: PhotoConfig) -> np.ndarray:
    """Checked bytes of a PNG/JPEG/WebP → uint8 (H, W, 3) RGB."""
    if len(data) > cfg.max_image_bytes:
        raise PhotoError(
            f"photo {name} is {len(data) / 2**20:.1f} MiB; the limit is "
            f"{cfg.max_image_bytes / 2**20:.0f} MiB: save a smaller JPEG",
            "size",
        )
    kind = sniff_type(data)
    if kind is None:
        raise PhotoError(f"photo {name} is not a PNG, JPEG or WebP image", "type")
    # FFmpeg decodes a cut-off JPEG or PNG into a half-grey picture: catch it by its end
    tail = data[-64:].rstrip(b"\0")
    if (kind == "image/jpeg" and not tail.endswith(b"\xff\xd9")) or (
        kind == "image/png" and b"IEND" not in tail[-12:]
    ):
        raise PhotoError(f"photo {name} is truncated (the file ends early)", "corrupt")
    try:
        with av.open(io.BytesIO(data)) as container:
            if not container.streams.video:
                raise PhotoError(f"photo {name} holds no image", "corrupt")
            stream = container.streams.video[0]
            w, h = stream.codec_context.width, stream.codec_context.height
            if w * h > cfg.max_image_pixels:
                raise PhotoError(
                    f"photo {name} is {w}x{h} pixels; the limit is "
                    f"{cfg.max_image_pixels / 1e6:.0f} megapixels: scale it down",
                    "size",
                )
            # strict: FFmpeg would otherwise conceal damage and hand back a smeared picture
            stream.codec_context.options = {"err_detect": "explode"}
            rgb = next(container.decode(video=0)).to_ndarray(format="rgb24")
    except PhotoError:
        raise
    except (av.FFmpegError, StopIteration, ValueError, OSError) as exc:
        raise PhotoError(f"photo {name} is corrupt or truncated: {exc}", "corrupt") from None
    if rgb.size == 0 or min(rgb.shape[:2]) < 16:
        raise PhotoError(f"photo {name} is too small to hold a face", "size")
    return rgb


def load_photo(path: str, cfg: PhotoConfig) -> np.ndarray:
    """A photo file → uint8 (H, W, 3) RGB, with the checks of `read_photo`."""
    return read_photo(read_photo_file(path, cfg), str(path), cfg)


def read_photo_file(path: str, cfg: PhotoConfig) -> bytes:
    """A photo file's bytes, one past the size limit at most (`read_photo` refuses those)."""
    try:
        with open(path, "rb") as f:
            return f.read(cfg.max_image_bytes + 1)
    except OSError as exc:
        raise PhotoError(f"cannot read photo {path}: {exc.strerror or exc}", "corrupt") from None


_PROFILE = 0.2  # the nose tip this close (share of the face's width) to a cheek: a profile


@dataclass(frozen=True)
class Framing:
    """Photo pixels → video pixels: scale, then crop at (left, top)."""

    scale: float
    left: int
    top: int
    width: int
    height: int

    def apply(self, rgb: np.ndarray) -> np.ndarray:
        h, w = rgb.shape[:2]
        nw, nh = max(self.width, round(w * self.scale)), max(self.height, round(h * self.scale))
        interp = cv2.INTER_AREA if self.scale < 1 else cv2.INTER_CUBIC
        big = cv2.resize(rgb, (nw, nh), interpolation=interp)
        return np.ascontiguousarray(
            big[self.top : self.top + self.height, self.left : self.left + self.width]
        )

    def box(self, box: np.ndarray) -> np.ndarray:
        x, y, w, h = np.asarray(box, np.float64) * self.scale
        return np.array([x - self.left, y - self.top, w, h])

    def point(self, x: float, y: float) -> tuple[float, float]:
        return x * self.scale - self.left, y * self.scale - self.top


def centre_framing(shape: tuple[int, ...], width: int, height: int) -> Framing:
    """Scale to cover width x height, centre-crop (the issue's framing)."""
    h, w = shape[:2]
    s = max(width / w, height / h)
    nw, nh = max(width, round(w * s)), max(height, round(h * s))
    return Framing(s, (nw - width) // 2, (nh - height) // 2, width, height)


def frame_photo(rgb: np.ndarray, width: int, height: int) -> np.ndarray:
    """The photo as the video shows it at rest: scaled to cover, centre-cropped."""
    return centre_framing(rgb.shape, width, height).apply(rgb)


@dataclass(frozen=True)
class FaceGeometry:
    """Where things are on the framed photo, in its pixels (floats). `box` is the face's
    own square, upright in the face's frame; `roll` turns that frame (radians, clockwise on
    screen): the warp places the mouth, jaw and blinks in it."""

    box: tuple[float, float, float, float]  # face box x, y, w, h
    mouth: tuple[float, float]  # centre of the lip line
    mouth_half_width: float
    eyes: tuple[tuple[float, float, float, float], ...]  # eye boxes x, y, w, h (face frame)
    skin: tuple[float, float, float]  # median RGB of the cheeks, 0..255
    lips: tuple[float, float, float]  # median RGB just below the lip line
    roll: float = 0.0


@dataclass(frozen=True)
class PreparedPhoto:
    framed: np.ndarray  # uint8 (H, W, 3): the rest frame, what the video shows in silence
    face: FaceGeometry
    # the face box in the original photo's pixels (x, y, w, h, and the angle in degrees
    # where it is turned): what the page shows the user to adjust, in the coordinates a
    # hand-drawn box is given in
    photo_box: FaceBox | None = None
    framing: Framing | None = None  # original photo pixels → the framed photo's


NO_FACE = (
    "no face found in the photo: use a sharp, well-lit, frontal photo of one face (a "
    "synthetic face from `facecast make-reference` works as the PNG it writes, unchanged), "
    "or frame the face by hand: --face-box X,Y,W,H[,ANGLE] on the command line, "
    "?face_box=X,Y,W,H[,ANGLE] on POST /photos, or drag a box around it on the page."
)


def prepare_photo(
    rgb: np.ndarray, width: int, height: int, cfg: PhotoConfig, face_box: FaceBox | None = None
) -> PreparedPhoto:
    """Find the one face (or take the hand-drawn `face_box`, photo pixels), read its
    landmarks, frame the photo around it, and measure the geometry."""
    if face_box is not None:
        check_face_box(face_box, rgb.shape, (width, height), cfg.min_face_px)
    else:
        faces = find_faces(rgb)
        if len(faces) == 0:
            raise PhotoError(NO_FACE, "face")
        sides = np.array([f.box[2] for f in faces])
        if (sides**2 >= _SECOND_FACE * sides[0] ** 2).sum() > 1:
            raise PhotoError(
                f"the photo shows {int((sides**2 >= _SECOND_FACE * sides[0] ** 2).sum())} "
                "faces: crop it to the one person who should talk, or give that face's box "
                "(--face-box X,Y,W,H, or ?face_box= on POST /photos)",
                "face",
            )
        # the detector's face goes the same way as a box drawn around it: the same result
        # for the same box, whoever gave it
        x, y, w, h = (float(v) for v in faces[0].box)
        face_box = (x, y, w, h, float(np.degrees(faces[0].roll)))
    mesh = _mesh_in_box(rgb, face_box)
    if mesh is None:  # no face the landmarks can read: a frontal face's proportions in the box
        box, roll = np.array(face_box[:4], np.float64), box_angle(face_box)
    else:
        box, roll = box_from_mesh(mesh), mesh.roll
        _check_pose(mesh)
    framing, framed_box = frame_face(rgb.shape, box, width, height, cfg)
    framed = framing.apply(rgb)
    geometry = measure_face(framed, framed_box, roll, mesh, framing)
    return PreparedPhoto(framed, geometry, _rounded(face_box), framing)


def _mesh_in_box(rgb: np.ndarray, box: FaceBox) -> Mesh | None:
    """FaceMesh on the square around the box, turned as the box is; refined on its own eyes
    (a second pass: a face tilted 35 degrees in an upright box is read upright). None where
    it sees no face."""
    x, y, w, h = box[:4]
    centre = np.array([x + w / 2, y + h / 2])
    mesh = landmarks.face_mesh(rgb, centre, ROI_PER_SIDE * max(w, h), box_angle(box))
    if abs(mesh.roll - box_angle(box)) > np.radians(10):  # far off: once more from its eyes
        mesh = landmarks.face_mesh(rgb, mesh.points.mean(0), ROI_PER_SIDE * max(w, h), mesh.roll)
    if mesh.presence < MIN_PRESENCE:
        # turned too far for FaceMesh to read from the box's angle (60 degrees in an upright
        # box): BlazeFace's eyes give the turn of the face whose centre is in the box
        for face in landmarks.find_faces(rgb):
            fx, fy = face.box[:2] + face.box[2:] / 2
            if x <= fx <= x + w and y <= fy <= y + h:
                side = ROI_PER_SIDE * max(face.box[2:])
                mesh = landmarks.face_mesh(rgb, np.array([fx, fy]), side, face.roll)
                break
    return mesh if mesh.presence >= MIN_PRESENCE else None


def _check_pose(mesh: Mesh) -> None:
    """A face the warp cannot move well: tilted past 45 degrees, or turned to a profile."""
    roll = float(np.degrees(mesh.roll))
    if abs(roll) > MAX_ROLL_DEG:
        raise PhotoError(
            f"the face is tilted {abs(roll):.0f} degrees; the photo stack animates faces tilted "
            f"up to {MAX_ROLL_DEG:g}: rotate the photo nearer upright first",
            "face",
        )
    # where the nose tip lies between the cheeks, along the eye line: 0.5 when frontal
    right, left = mesh.points[234], mesh.points[454]
    axis = left - right
    t = float((mesh.points[landmarks.NOSE_TIP] - right) @ axis / max(1e-6, axis @ axis))
    if not _PROFILE <= t <= 1 - _PROFILE:
        raise PhotoError(
            "the face is turned to a profile: the photo stack animates faces that look at "
            "the camera (both eyes and both mouth corners in view)",
            "face",
        )


def _rounded(box: FaceBox) -> FaceBox:
    """A box as the page and the API show it: a box of four when it is hardly turned."""
    if len(box) == 5 and abs(box[4]) < 1.0:
        return tuple(float(v) for v in box[:4])
    return tuple(float(v) for v in box)


def frame_face(
    shape: tuple[int, ...], face_box: np.ndarray, width: int, height: int, cfg: PhotoConfig
) -> tuple[Framing, np.ndarray]:
    """The framing of a photo of `shape` whose face box (x, y, w, h, photo pixels) is
    `face_box`: centre-cropped, slid to hold the face; and the face box in video pixels.
    A face too small or cut off by the frame is a `PhotoError`."""
    framing = centre_framing(shape, width, height)
    framing = _slide_to_fit(framing, framing.box(face_box), shape)
    box = framing.box(face_box)
    if box[2] < cfg.min_face_px:
        raise PhotoError(
            f"the face is {box[2]:.0f} px wide in the {width}x{height} video (at least "
            f"{cfg.min_face_px} needed): crop the photo closer around the face",
            "face",
        )
    x, y, w, h = box
    if x < -0.05 * w or y < -0.05 * h or x + 1.05 * w > width or y + 1.05 * h > height:
        raise PhotoError(
            f"the face does not fit in the {width}x{height} frame: crop the photo so the "
            "face has some room around it",
            "face",
        )
    return framing, box


def _slide_to_fit(framing: Framing, box: np.ndarray, shape: tuple[int, ...]) -> Framing:
    """Move the crop (not the scale) the least that keeps the face box plus a margin in."""
    x, y, w, h = box
    full_w = max(framing.width, round(shape[1] * framing.scale))
    full_h = max(framing.height, round(shape[0] * framing.scale))
    left, top = framing.left, framing.top
    need = [(x - 0.15 * w, x + 1.15 * w, framing.width, full_w, "x")]
    need.append((y - 0.25 * h, y + 1.25 * h, framing.height, full_h, "y"))
    for lo, hi, size, full, axis in need:
        if hi - lo > size:  # the margin cannot fit: centre the face instead
            shift = (lo + hi - size) / 2
        else:
            shift = min(0.0, lo) + max(0.0, hi - size)
        if axis == "x":
            left = int(np.clip(round(left + shift), 0, full - size))
        else:
            top = int(np.clip(round(top + shift), 0, full - size))
    return Framing(framing.scale, left, top, framing.width, framing.height)


def measure_face(
    framed: np.ndarray,
    box: np.ndarray,
    roll: float = 0.0,
    mesh: Mesh | None = None,
    framing: Framing | None = None,
) -> FaceGeometry:
    """The face's geometry on the framed photo: from the landmarks (`mesh`, photo pixels,
    mapped by `framing`) where there are some, else from a frontal face's proportions in
    the face box turned by `roll`. The lip line is the landmarks' seam between the lips,
    so no shading (a backlit face, a dark room) moves it."""
    x, y, w, h = (float(v) for v in box)
    centre = np.array([x + w / 2, y + h / 2])

    def at(u: float, v: float) -> np.ndarray:  # a point of the face box, face frame → pixels
        return centre + turn(np.array([(u - 0.5) * w, (v - 0.5) * h]), roll)

    if mesh is not None and framing is not None:
        points = mesh.points * framing.scale - np.array([framing.left, framing.top])
        mouth = points[list(landmarks.LIP_SEAM)].mean(0)
        eye_centres = [
            points[list(idx)].mean(0) for idx in (landmarks.RIGHT_EYE, landmarks.LEFT_EYE)
        ]
        eye_w = [
            float(np.linalg.norm(points[i] - points[j]))
            for i, j in (landmarks.RIGHT_EYE, landmarks.LEFT_EYE)
        ]
    else:
        mouth = at(0.5, 0.79)
        eye_centres = [at(0.3, 0.405), at(0.7, 0.405)]
        eye_w = [0.2 * w / 1.2, 0.2 * w / 1.2]
    # the eye box the blink slides over: 1.2x the corner-to-corner width, 0.45x as tall
    eyes = tuple(
        _as_tuple4((c[0] - 0.6 * ew, c[1] - 0.27 * ew, 1.2 * ew, 0.54 * ew))
        for c, ew in zip(eye_centres, eye_w, strict=True)
    )
    skin = np.median(
        np.concatenate([_patch(framed, at(u, 0.6), 0.05 * w) for u in (0.25, 0.75)]), axis=0
    )
    # the lips: the reddest quarter of the pixels around the lip line
    patch = _patch(framed, mouth + turn(np.array([0.0, 0.01 * h]), roll), 0.09 * w)
    if len(patch) >= 4:
        red = patch[:, 0].astype(np.float32) / (patch[:, 1].astype(np.float32) + 8)
        lips = np.median(patch[red >= np.percentile(red, 75)], axis=0)
    else:
        lips = skin * 0.8
    return FaceGeometry(
        box=(x, y, w, h),
        mouth=(float(mouth[0]), float(mouth[1])),
        mouth_half_width=0.19 * w,
        eyes=eyes,
        skin=_rgb(skin),
        lips=_rgb(lips),
        roll=float(roll),
    )


def _patch(rgb: np.ndarray, centre: np.ndarray, half: float) -> np.ndarray:
    """The (n, 3) pixels of the square of half side `half` around `centre` (clipped)."""
    H, W = rgb.shape[:2]
    x0, y0 = int(np.clip(centre[0] - half, 0, W)), int(np.clip(centre[1] - half, 0, H))
    x1, y1 = int(np.clip(centre[0] + half + 1, 0, W)), int(np.clip(centre[1] + half + 1, 0, H))
    return rgb[y0:y1, x0:x1].reshape(-1, 3)


def _as_tuple4(v) -> tuple[float, float, float, float]:
    a, b, c, d = (float(t) for t in v)
    return a, b, c, d


def _rgb(x: np.ndarray) -> tuple[float, float, float]:
    return float(x[0]), float(x[1]), float(x[2])
