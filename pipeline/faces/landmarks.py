"""Faces and their landmarks: MediaPipe's BlazeFace and FaceMesh models, run by LiteRT.

The three model files ship in `pipeline/assets/face_models` (Apache-2.0, taken unchanged
from the `mediapipe` 0.10.21 wheel; the folder's README says where and why): nothing is
downloaded, and they load once per process.

- `find_faces`: BlazeFace, the short-range model (128x128 input, faces that fill a good
  part of the photo) and, where it finds none, the full-range one (192x192, faces down to
  a few percent of the photo). The photo is letterboxed to a square, the anchors' offsets
  decoded, overlapping boxes merged (weighted by score, as MediaPipe does). Each face comes
  with its box and six key points (eyes, nose tip, mouth, ears), in photo pixels.
- `face_mesh`: FaceMesh's 468 landmarks of the face in a region of interest: a square
  around the face, turned so that the eyes lie level (the model was trained on faces put
  upright like that), taken twice: from the box and its angle, then from the first pass's
  own eyes, so a face tilted 35 degrees is read as upright as an upright one.

Only numpy and OpenCV's affine warp touch the pixels; the models see float32 RGB.
Coordinates are photo pixels, x right, y down; angles in radians, positive clockwise on
screen (y down), 0 = eyes level.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from pipeline.errors import FacecastError

MODELS = Path(__file__).resolve().parent.parent / "assets" / "face_models"

# FaceMesh landmark indices (MediaPipe's canonical face mesh). "Right" is the person's
# right, on the image's left.
RIGHT_EYE = (33, 133)  # outer, inner corner
LEFT_EYE = (362, 263)  # inner, outer corner
RIGHT_LIDS = (159, 145)  # upper, lower lid at the eye's middle
LEFT_LIDS = (386, 374)
LIP_SEAM = (13, 14)  # upper and lower lip's inner edge at the middle: where the lips part
MOUTH_CORNERS = (61, 291)
NOSE_TIP = 1
CHIN = 152
FOREHEAD = 10


@dataclass(frozen=True)
class _Detector:
    """One BlazeFace model: input side, anchor centres (n, 2) in 0..1, score threshold."""

    file: str
    side: int
    anchors: np.ndarray
    min_score: float


def _anchors(side: int, strides: tuple[int, ...], per_cell: tuple[int, ...]) -> np.ndarray:
    """SSD anchor centres, row by row, each cell's anchors together (MediaPipe's order;
    every anchor of these models is 1x1, so only the centres matter)."""
    out = []
    for stride, n in zip(strides, per_cell, strict=True):
        cells = side // stride
        ys, xs = np.mgrid[0:cells, 0:cells]
        centres = np.stack([(xs + 0.5) / cells, (ys + 0.5) / cells], -1).reshape(-1, 2)
        out.append(np.repeat(centres, n, axis=0))
    return np.concatenate(out).astype(np.float32)


# Short range: 16x16 cells of 2 anchors (stride 8) and 8x8 of 6 (strides 16, three layers
# of 2 merged); full range: 48x48 cells of one anchor. The thresholds are MediaPipe's
# own (0.5 and 0.6): the bench (bench/face_detect_bench.py) found no false face with them.
SHORT = _Detector("face_detection_short_range.tflite", 128, _anchors(128, (8, 16), (2, 6)), 0.5)
FULL = _Detector("face_detection_full_range_sparse.tflite", 192, _anchors(192, (4,), (1,)), 0.6)
MESH_SIDE = 192
_MERGE_IOU = 0.3  # boxes overlapping more than this are one face


@dataclass(frozen=True)
class Face:
    """A face BlazeFace found: box x, y, w, h; score 0..1; key points (6, 2): the eyes (the
    person's right, then left), nose tip, mouth, right and left ear."""

    box: np.ndarray
    score: float
    keypoints: np.ndarray

    @property
    def roll(self) -> float:
        (rx, ry), (lx, ly) = self.keypoints[0], self.keypoints[1]
        return float(np.arctan2(ly - ry, lx - rx))


_lock = threading.Lock()  # a LiteRT interpreter is not safe across threads
_interpreters: dict[str, Any] = {}  # LiteRT's Interpreter, untyped


def _run(file: str, x_NHWC: np.ndarray) -> list[np.ndarray]:
    """The model's outputs for one input, in the order the model declares them."""
    with _lock:
        it = _interpreters.get(file)
        if it is None:
            it = _interpreters[file] = _load(file)
        inp = it.get_input_details()[0]
        it.set_tensor(inp["index"], x_NHWC.astype(np.float32))
        it.invoke()
        return [it.get_tensor(d["index"]).copy() for d in it.get_output_details()]


def _load(file: str) -> Any:
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        raise FacecastError(
            "the photo stack finds faces with LiteRT: pip install 'ai-edge-litert>=2.3'"
        ) from None
    path = MODELS / file
    if not path.is_file():
        raise FacecastError(f"the face model {path} is missing: reinstall Facecast")
    with native_stderr_silenced():
        it = Interpreter(model_path=str(path), num_threads=1)
        it.allocate_tensors()
    return it


@contextmanager
def native_stderr_silenced() -> Iterator[None]:
    """Hold the process's stderr (file descriptor 2) on /dev/null: LiteRT's C++ prints
    "INFO: Created TensorFlow Lite XNNPACK delegate for CPU." there when an interpreter is
    made, which would be a second line under a command's one-line error. Interpreters are
    made once a process, at start-up (`check_models`) or at the first photo."""
    sys.stderr.flush()
    saved, quiet = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(quiet, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(quiet)


def check_models() -> None:
    """Load the three models now (a server does, before it listens): a missing runtime or
    file is one line at start-up, not an error in the first peer's session."""
    with _lock:
        for file in (SHORT.file, FULL.file, "face_landmark.tflite"):
            if file not in _interpreters:
                _interpreters[file] = _load(file)


def find_faces(rgb: np.ndarray) -> list[Face]:
    """Every face in an RGB photo, most confident first: short range, else full range."""
    for model in (SHORT, FULL):
        faces = _detect(rgb, model)
        if faces:
            return faces
    return []


def _detect(rgb: np.ndarray, model: _Detector) -> list[Face]:
    H, W = rgb.shape[:2]
    side = max(H, W)  # letterboxed: the photo in the middle of a square of black
    scale = model.side / side
    w, h = max(1, round(W * scale)), max(1, round(H * scale))
    small = cv2.resize(rgb, (w, h), interpolation=cv2.INTER_AREA)
    x0, y0 = (model.side - w) // 2, (model.side - h) // 2
    square = np.zeros((model.side, model.side, 3), np.float32)
    square[y0 : y0 + h, x0 : x0 + w] = small / 127.5 - 1.0
    boxes, scores = _run(model.file, square[None])
    raw, logit = boxes[0], scores[0, :, 0]
    score = 1.0 / (1.0 + np.exp(-np.clip(logit.astype(np.float64), -100, 100)))
    keep = np.flatnonzero(score >= model.min_score)
    if len(keep) == 0:
        return []
    a = model.anchors[keep]
    r = raw[keep] / model.side
    centre = r[:, 0:2] + a
    size = r[:, 2:4]
    points = r[:, 4:16].reshape(-1, 6, 2) + a[:, None]
    # back to photo pixels: undo the letterbox's offset and scale
    offset = np.array([x0, y0], np.float32) / model.side

    def to_photo(p: np.ndarray) -> np.ndarray:
        return (p - offset) * model.side / scale

    boxes_xywh = np.concatenate([to_photo(centre - size / 2), size * model.side / scale], -1)
    return _merge(boxes_xywh, score[keep], to_photo(points))


def _merge(boxes: np.ndarray, scores: np.ndarray, points: np.ndarray) -> list[Face]:
    """Overlapping boxes merged into one face, their score-weighted mean (MediaPipe's
    weighted non-maximum suppression), most confident first."""
    order = list(np.argsort(-scores))
    faces = []
    while order:
        best = order[0]
        group = [i for i in order if _iou(boxes[best], boxes[i]) > _MERGE_IOU]
        order = [i for i in order if i not in group]
        wts = scores[group][:, None]
        faces.append(
            Face(
                box=(boxes[group] * wts).sum(0) / wts.sum(),
                score=float(scores[best]),
                keypoints=(points[group] * wts[:, :, None]).sum(0) / wts.sum(),
            )
        )
    return faces


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    iw = max(0.0, min(a[0] + a[2], b[0] + b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[1] + a[3], b[1] + b[3]) - max(a[1], b[1]))
    inter = iw * ih
    return float(inter / max(1e-9, a[2] * a[3] + b[2] * b[3] - inter))


@dataclass(frozen=True)
class Mesh:
    """FaceMesh's landmarks (468, 2) in photo pixels, and how sure it is that a face is
    there (0..1)."""

    points: np.ndarray
    presence: float

    def mean(self, indices: tuple[int, ...]) -> np.ndarray:
        return self.points[list(indices)].mean(axis=0)

    @property
    def eyes(self) -> tuple[np.ndarray, np.ndarray]:
        """The eyes' centres: the person's right (image left), then left."""
        return self.mean(RIGHT_EYE), self.mean(LEFT_EYE)

    @property
    def roll(self) -> float:
        right, left = self.eyes
        return float(np.arctan2(left[1] - right[1], left[0] - right[0]))

    @property
    def lip_seam(self) -> np.ndarray:
        return self.mean(LIP_SEAM)


def face_mesh(rgb: np.ndarray, centre: np.ndarray, side: float, roll: float) -> Mesh:
    """FaceMesh on the square of `side` px around `centre`, turned by `roll`; then again on
    the square its own landmarks give (eyes level, 1.5x the landmarks' extent)."""
    mesh = _mesh_in(rgb, centre, side, roll)
    roll = mesh.roll
    # the landmarks' extent in the face's own frame: its centre and its longer side
    c, s = np.cos(roll), np.sin(roll)
    local = (mesh.points - mesh.points.mean(0)) @ np.array([[c, -s], [s, c]])
    lo, hi = local.min(0), local.max(0)
    mid = (lo + hi) / 2
    centre = mesh.points.mean(0) + turn(mid, roll)
    return _mesh_in(rgb, centre, 1.5 * float((hi - lo).max()), roll)


def turn(v: np.ndarray, angle: float) -> np.ndarray:
    """The 2-D vector `v` turned by `angle` (radians, clockwise on screen: y is down)."""
    c, s = np.cos(angle), np.sin(angle)
    return np.array([c * v[0] - s * v[1], s * v[0] + c * v[1]])


def _mesh_in(rgb: np.ndarray, centre: np.ndarray, side: float, roll: float) -> Mesh:
    # the model's input square (u, v in 0..192) → the photo, turned by `roll` about `centre`;
    # continuous coordinates (a pixel's centre at +0.5) on both sides
    k = side / MESH_SIDE
    A = np.array([[np.cos(roll), -np.sin(roll)], [np.sin(roll), np.cos(roll)]]) * k
    b = np.asarray(centre, np.float64) - A @ np.array([MESH_SIDE / 2, MESH_SIDE / 2])
    # OpenCV indexes pixels by their centres: the same map in its terms
    cv_map = np.concatenate([A, (A @ np.array([0.5, 0.5]) + b - 0.5)[:, None]], axis=1)
    crop = cv2.warpAffine(
        rgb,
        cv_map,
        (MESH_SIDE, MESH_SIDE),
        flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
        borderMode=cv2.BORDER_CONSTANT,
    )
    points, flag = _run("face_landmark.tflite", crop[None].astype(np.float32) / 255.0)
    uv = points.reshape(-1, 3)[:, :2].astype(np.float64)
    presence = 1.0 / (1.0 + np.exp(-float(flag.reshape(-1)[0])))
    return Mesh(uv @ A.T + b, presence)


def preflight(cfg) -> None:
    """The photo family's check before a server listens (`pipeline.families`): this process
    prepares every session's photo, so its face models must load."""
    check_models()
