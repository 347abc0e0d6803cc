"""The reference photo: checked, its one face found, framed to the video, measured.

A photo is checked before anything is decoded (bytes, type by its magic bytes, pixel
count from the header), then decoded with PyAV. Faces are found with the frontal-face Haar
cascades that OpenCV 4.x wheels ship (`cv2.data.haarcascades`; no download): the default
one, and where it finds none the alt2 one on the shadow-lifted, then equalised image. The
photo is scaled to cover the video size and centre-cropped (the face box is mapped through
the same transform, so detection runs once, on the full photo); where the centred crop
would cut the face, the crop slides just enough to hold it. Every failure is a
`PhotoError` with one line that says what to change.

Where the detector misses the face (it misses dark skin more often: bench/RESULTS.md, "The
face detector by skin tone") or picks the wrong one, the user frames it by hand: a face box
X,Y,W,H in the original photo's pixels (`parse_face_box`, `check_face_box`: the one home of
its rules, for the CLI, the HTTP routes and the page's payload), used instead of detection.

The geometry the warp needs (`FaceGeometry`) is measured on the framed photo: the lip line
(the darkest row between the closed lips), the mouth's half width, and the eyes (the eye
cascade inside the face's upper half, else the usual proportions of a frontal face).
"""

from __future__ import annotations

import argparse
import io
from dataclasses import dataclass

import av
import cv2
import numpy as np

from pipeline.config import PhotoConfig
from pipeline.errors import FacecastError, PhotoError

# PNG, JPEG and WebP, by their first bytes: what the page's upload accepts.
_MAGIC = {b"\x89PNG\r\n\x1a\n": "image/png", b"\xff\xd8\xff": "image/jpeg"}
IMAGE_TYPES = ("image/png", "image/jpeg", "image/webp")
_DETECT_SIDE = 800  # faces are searched on the photo scaled to at most this side
_SECOND_FACE = 0.25  # another face at least this share of the largest one's area counts
_MIN_SIDE_FRAC = 0.06  # the smallest face searched for, as a share of the photo's short side
_BOX_ASPECT = 2.0  # a face box is about square: neither side more than twice the other


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


_CASCADES: dict[str, cv2.CascadeClassifier] = {}


FACE_CASCADE = "haarcascade_frontalface_default.xml"


def cascade(name: str) -> cv2.CascadeClassifier:
    """One of OpenCV's shipped Haar cascades, loaded once per process."""
    if name not in _CASCADES:
        # OpenCV 5 moved the cascade classifier out of the main module and its wheels ship
        # no cascades: say so, once, instead of an AttributeError inside a session
        haarcascades: str | None
        try:
            from cv2.data import haarcascades
        except ImportError:
            haarcascades = None
        if not hasattr(cv2, "CascadeClassifier") or haarcascades is None:
            raise FacecastError(
                f"the installed OpenCV {cv2.__version__} has no Haar face detector: the photo "
                "stack needs opencv-python-headless>=4.8,<5 (pip install 'opencv-python-headless<5')"
            )
        clf = cv2.CascadeClassifier(haarcascades + name)
        if clf.empty():
            raise FacecastError(
                f"OpenCV's {name} is missing: opencv-python-headless>=4.8,<5 ships it"
            )
        _CASCADES[name] = clf
    return _CASCADES[name]


def _detect_scale(shape: tuple[int, ...]) -> tuple[float, int, int]:
    """The scale faces are searched at, and the searched image's width and height."""
    h, w = shape[:2]
    s = min(1.0, _DETECT_SIDE / max(h, w))
    return s, round(w * s), round(h * s)


def _min_detect_side(width: int, height: int, min_side_frac: float = _MIN_SIDE_FRAC) -> int:
    return max(20, int(min_side_frac * min(width, height)))


def min_face_side(shape: tuple[int, ...]) -> float:
    """The smallest face side the detector looks for in a photo of `shape`, in its pixels;
    a hand-drawn face box must be at least this big too."""
    s, w, h = _detect_scale(shape)
    return _min_detect_side(w, h) / s


def detect_faces(rgb: np.ndarray, min_side_frac: float = _MIN_SIDE_FRAC) -> np.ndarray:
    """Frontal faces in an RGB image, (n, 4) float boxes x, y, w, h in its pixels,
    largest first."""
    s, w, h = _detect_scale(rgb.shape)
    grey = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)
    if s < 1.0:
        grey = cv2.resize(grey, (w, h), interpolation=cv2.INTER_AREA)
    # no histogram equalisation on the first look: on the astronaut it turned the shuttle
    # into a face
    side = _min_detect_side(w, h, min_side_frac)
    found = _cascade_boxes(FACE_CASCADE, grey, side)
    # Haar misses dark skin far more often. Only where the first look finds nothing, two
    # more, with OpenCV's alt2 frontal cascade: the shadows lifted (gamma 0.5), then that
    # image locally equalised (CLAHE). On 80 synthetic faces per skin-tone group, lighting
    # and backdrop varied (bench/face_detect_bench.py), the darkest group goes from 19 found
    # (the gamma look with the default cascade) to 39, and 133 faceless images (backdrops,
    # faceless parts of the bundled portraits) show no face that the first look alone did
    # not already show. Faces the first look finds are unchanged.
    for prepare in (_lift_shadows, _equalise_lifted):
        if len(found):
            break
        found = _cascade_boxes(_SECOND_LOOK_CASCADE, prepare(grey), side)
    boxes = np.asarray(found, np.float64).reshape(-1, 4) / s
    return boxes[np.argsort(-boxes[:, 2] * boxes[:, 3])]


_SECOND_LOOK_CASCADE = "haarcascade_frontalface_alt2.xml"
_LIFT_SHADOWS = (255 * np.sqrt(np.arange(256) / 255)).astype(np.uint8)


def _lift_shadows(grey: np.ndarray) -> np.ndarray:
    return cv2.LUT(grey, _LIFT_SHADOWS)


def _equalise_lifted(grey: np.ndarray) -> np.ndarray:
    clahe = cv2.createCLAHE(clipLimit=2.0, tileGridSize=(4, 4))
    return clahe.apply(_lift_shadows(grey))


def _cascade_boxes(name: str, grey: np.ndarray, side: int) -> np.ndarray:
    return np.asarray(
        cascade(name).detectMultiScale(grey, scaleFactor=1.08, minNeighbors=6, minSize=(side, side))
    )


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
    """Where things are on the framed photo, in its pixels (floats)."""

    box: tuple[float, float, float, float]  # face box x, y, w, h
    mouth: tuple[float, float]  # centre of the lip line
    mouth_half_width: float
    eyes: tuple[tuple[float, float, float, float], ...]  # eye boxes x, y, w, h
    skin: tuple[float, float, float]  # median RGB of the cheeks, 0..255
    lips: tuple[float, float, float]  # median RGB just below the lip line


@dataclass(frozen=True)
class PreparedPhoto:
    framed: np.ndarray  # uint8 (H, W, 3): the rest frame, what the video shows in silence
    face: FaceGeometry
    # the face box in the original photo's pixels (x, y, w, h): what the page shows the
    # user to adjust, in the coordinates a hand-drawn box is given in
    photo_box: tuple[float, float, float, float] | None = None


FaceBox = tuple[float, float, float, float]  # x, y, w, h in the original photo's pixels

FACE_BOX_HELP = (
    "X,Y,W,H: the face's box in the original photo's pixels (left, top, width, height; "
    "forehead to chin, about square), used instead of the face detector"
)


def parse_face_box(value: object) -> FaceBox:
    """A face box from "X,Y,W,H" (the CLI's flag, the upload's query) or a list of four
    numbers (an offer's JSON); a `PhotoError` ("box") if it is not four finite numbers with
    a positive width and height. Where it lies in the photo is `check_face_box`'s."""
    if isinstance(value, str):
        parts: list = value.replace(" ", "").split(",")
    elif isinstance(value, (list, tuple)):
        parts = list(value)
    else:
        parts = []
    numbers = []
    for part in parts:
        if isinstance(part, bool):
            break
        try:
            numbers.append(float(part))
        except (TypeError, ValueError):
            break
    if len(parts) != 4 or len(numbers) != 4 or not all(np.isfinite(numbers)):
        raise PhotoError(
            f"face box {_shown(value)} is not four numbers X,Y,W,H (the face's left, top, width "
            "and height in the photo's pixels, e.g. 120,80,200,200)",
            "box",
        )
    x, y, w, h = numbers
    if w <= 0 or h <= 0:
        raise PhotoError(f"face box {_shown(value)}: its width and height must be > 0", "box")
    return x, y, w, h


def face_box_arg(text: str) -> FaceBox:
    """`--face-box X,Y,W,H` as an argparse type: a bad one is argparse's one-line error."""
    try:
        return parse_face_box(text)
    except PhotoError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def check_face_box(box: FaceBox, shape: tuple[int, ...]) -> np.ndarray:
    """The box as an array, if it lies inside a photo of `shape`, is at least as big as the
    faces the detector looks for, and is about square; else a `PhotoError` ("box")."""
    x, y, w, h = box
    H, W = shape[:2]
    if x < 0 or y < 0 or x + w > W or y + h > H:
        raise PhotoError(
            f"face box {_fmt(box)} reaches outside the {W}x{H} photo: give it in the "
            "original photo's pixels, inside 0..width and 0..height",
            "box",
        )
    side = min_face_side(shape)
    if min(w, h) < side:
        raise PhotoError(
            f"face box {_fmt(box)} is smaller than {side:.0f} px, the smallest face looked "
            f"for in a {W}x{H} photo: draw it around the whole face, forehead to chin",
            "box",
        )
    if max(w, h) > _BOX_ASPECT * min(w, h):
        raise PhotoError(
            f"face box {_fmt(box)} is {w:.0f}x{h:.0f}: a face box is about square "
            "(forehead to chin, ear to ear)",
            "box",
        )
    return np.array([x, y, w, h], np.float64)


def _shown(value: object) -> str:
    text = repr(value)  # a request's value: kept short in the one-line answer
    return text if len(text) <= 60 else text[:57] + "..."


def _fmt(box: FaceBox) -> str:
    return ",".join(f"{v:g}" for v in box)


def prepare_photo(
    rgb: np.ndarray, width: int, height: int, cfg: PhotoConfig, face_box: FaceBox | None = None
) -> PreparedPhoto:
    """Find the one face (or take the hand-drawn `face_box`, photo pixels), frame the photo
    around it, measure the geometry inside the box."""
    if face_box is not None:
        checked = check_face_box(face_box, rgb.shape)
        framing, box = frame_face(rgb.shape, checked, width, height, cfg)
        framed = framing.apply(rgb)
        return PreparedPhoto(framed, measure_face(framed, box), _as_box(checked))
    faces = detect_faces(rgb)
    if len(faces) == 0:
        raise PhotoError(
            "no face found in the photo: use a sharp, well-lit, frontal photo of one face "
            "(a synthetic face from `facecast make-reference` works as the PNG it writes, "
            "unchanged), or frame the face by hand with a face box X,Y,W,H",
            "face",
        )
    areas = faces[:, 2] * faces[:, 3]
    if (areas >= _SECOND_FACE * areas[0]).sum() > 1:
        raise PhotoError(
            f"the photo shows {int((areas >= _SECOND_FACE * areas[0]).sum())} faces: "
            "crop it to the one person who should talk, or give that face's box X,Y,W,H",
            "face",
        )
    framing, box = frame_face(rgb.shape, faces[0], width, height, cfg)
    framed = framing.apply(rgb)
    return PreparedPhoto(framed, measure_face(framed, box), _as_box(faces[0]))


def _as_box(box: np.ndarray) -> FaceBox:
    x, y, w, h = (float(v) for v in box)
    return x, y, w, h


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


def measure_face(framed: np.ndarray, box: np.ndarray) -> FaceGeometry:
    x, y, w, h = (float(v) for v in box)
    H, W = framed.shape[:2]
    grey = cv2.GaussianBlur(cv2.cvtColor(framed, cv2.COLOR_RGB2GRAY).astype(np.float32), (0, 0), 1)
    mx = x + 0.5 * w
    cheeks = [
        framed[int(y + 0.55 * h) : int(y + 0.65 * h), int(x + cx * w) : int(x + (cx + 0.1) * w)]
        for cx in (0.2, 0.7)
    ]
    skin = np.median(np.concatenate([c.reshape(-1, 3) for c in cheeks if c.size]), axis=0)
    my = _lip_line(framed, grey, (x, y, w, h), skin)
    eyes = _find_eyes(framed, (x, y, w, h))
    # the lips: the reddest quarter of the pixels around the lip line
    patch = framed[
        int(max(0, my - 0.08 * h)) : int(my + 0.1 * h), int(mx - 0.1 * w) : int(mx + 0.1 * w)
    ].reshape(-1, 3)
    if len(patch) >= 4:
        red = patch[:, 0].astype(np.float32) / (patch[:, 1].astype(np.float32) + 8)
        lips = np.median(patch[red >= np.percentile(red, 75)], axis=0)
    else:
        lips = skin * 0.8
    return FaceGeometry(
        box=(x, y, w, h),
        mouth=(mx, my),
        mouth_half_width=0.19 * w,
        eyes=eyes,
        skin=_rgb(skin),
        lips=_rgb(lips),
    )


def _rgb(x: np.ndarray) -> tuple[float, float, float]:
    return float(x[0]), float(x[1]), float(x[2])


def _lip_line(framed: np.ndarray, grey: np.ndarray, box, skin: np.ndarray) -> float:
    """The row where the lips meet, from the profile of how far each row of a narrow band
    down the middle of the lower face is from the skin colour: the first strong peak
    below the eyes is the nose's shadow, the strongest one after it the lips (their seam,
    or the edge of the teeth in a smile). Falls back to where frontal faces have it."""
    x, y, w, h = box
    H, W = grey.shape
    mx, prior = x + 0.5 * w, y + 0.79 * h
    c0, c1 = int(max(0, mx - 0.12 * w)), int(min(W, mx + 0.12 * w))
    r0, r1 = int(max(0, y + 0.55 * h)), int(min(H, y + 1.0 * h))
    if r1 - r0 < 8 or c1 - c0 < 2:
        return prior
    band = framed[r0:r1, c0:c1].astype(np.float32)
    d = np.linalg.norm(band - skin[None, None], axis=-1).mean(axis=1)
    d = np.convolve(np.pad(d, 1, mode="edge"), np.ones(3) / 3, mode="valid")
    rows = np.arange(r0, r1) + 0.5
    thr = np.median(d) + 0.4 * (d.max() - np.median(d))
    peaks = [
        i for i in range(1, len(d) - 1) if d[i] >= thr and d[i] >= d[i - 1] and d[i] >= d[i + 1]
    ]
    nose = next((i for i in peaks if rows[i] < y + 0.74 * h), None)
    lo, hi = (
        (rows[nose] + 0.08 * h, rows[nose] + 0.3 * h)
        if nose is not None
        else (y + 0.68 * h, y + 0.92 * h)
    )
    sel = np.flatnonzero((rows >= lo) & (rows <= hi))
    if len(sel) == 0:
        return prior
    best = _lips_in(d, sel, peaks, h)
    if best is None:
        # nothing in the window but the chin (its shading, or its edge): the peak taken
        # for the nose's shadow was the lips, of a face whose nose casts little shadow, in
        # a box drawn by hand (its mouth sits higher in the box than in the detector's)
        return float(rows[nose]) if nose is not None else prior
    return float(rows[best])


def _lips_in(d: np.ndarray, sel: np.ndarray, peaks: list[int], h: float) -> int | None:
    """The lips' row in the window `sel` of the profile `d`: its strongest row, unless that
    is the chin. The lips have skin (the chin) just below them; the chin's shading or its
    edge against the neck has not. None: nothing in the window but the chin."""
    near, far = max(1, round(0.03 * h)), max(2, round(0.12 * h))
    skin = np.median(d)

    def skin_below(i: int) -> bool:
        return i + far < len(d) and bool(d[i + near : i + far + 1].min() <= skin)

    best = int(sel[np.argmax(d[sel])])
    if skin_below(best):
        return best
    lips = [i for i in peaks if sel[0] <= i <= sel[-1] and skin_below(i)]
    return max(lips, key=lambda i: d[i]) if lips else None


def _find_eyes(framed: np.ndarray, box: tuple[float, float, float, float]):
    x, y, w, h = box
    x0, y0 = int(max(0, x)), int(max(0, y + 0.15 * h))
    upper = framed[y0 : int(y + 0.55 * h), x0 : int(x + w)]
    found = []
    if upper.size:
        grey = cv2.equalizeHist(cv2.cvtColor(upper, cv2.COLOR_RGB2GRAY))
        side = max(8, int(0.12 * w))
        hits = cascade("haarcascade_eye.xml").detectMultiScale(
            grey, scaleFactor=1.05, minNeighbors=5, minSize=(side, side)
        )
        found = [(ex + x0, ey + y0, ew, eh) for ex, ey, ew, eh in np.asarray(hits).reshape(-1, 4)]
    left = [e for e in found if e[0] + e[2] / 2 < x + 0.5 * w]
    right = [e for e in found if e[0] + e[2] / 2 >= x + 0.5 * w]
    eyes = []
    for side_hits, cx in ((left, 0.3), (right, 0.7)):
        if side_hits:
            ex, ey, ew, eh = max(side_hits, key=lambda e: e[2])
            # the cascade's box holds brow to cheek: the eye itself is its middle part
            eyes.append((ex + 0.15 * ew, ey + 0.3 * eh, 0.7 * ew, 0.4 * eh))
        else:
            eyes.append((x + (cx - 0.1) * w, y + 0.36 * h, 0.2 * w, 0.09 * w))
    return tuple(tuple(float(v) for v in e) for e in eyes)
