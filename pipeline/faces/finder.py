"""The faces in a photo, found once for every family that frames one.

BlazeFace finds the faces and FaceMesh confirms each (its face score at least
`MIN_PRESENCE`: it rejects the odd patch of texture BlazeFace scores just over its
threshold; bench/RESULTS.md, "BlazeFace + FaceMesh beside Haar"); each face's square and
roll then come from its landmarks (`box_from_mesh`), so the same face gives the same square
however it is turned. The models run in `pipeline.faces.landmarks`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.faces import landmarks
from pipeline.faces.landmarks import Mesh

_DETECT_SIDE = 800  # faces are searched on the photo scaled to at most this side
_MIN_SIDE_FRAC = 0.06  # the smallest face searched for, as a share of the photo's short side
_BOX_PER_FACE_LENGTH = 1.15
ROI_PER_SIDE = 1.5  # FaceMesh reads a square 1.5x the face box (MediaPipe's margin)
MIN_PRESENCE = 0.5  # FaceMesh's face score: on the bench's faces >= 0.99, faceless <= 0.002


def _detect_scale(shape: tuple[int, ...]) -> tuple[float, int, int]:
    """The scale faces are searched at, and the searched image's width and height."""
    h, w = shape[:2]
    s = min(1.0, _DETECT_SIDE / max(h, w))
    return s, round(w * s), round(h * s)


def min_face_side(shape: tuple[int, ...]) -> float:
    """The smallest face side looked for in a photo of `shape`, in its pixels."""
    s, w, h = _detect_scale(shape)
    return max(20, int(_MIN_SIDE_FRAC * min(w, h))) / s


@dataclass(frozen=True)
class FoundFace:
    """A face and its landmarks: `box` x, y, w, h is the face's own square (upright in the
    face's frame, about its centre, `box_from_mesh`), `roll` its tilt in radians."""

    box: np.ndarray
    roll: float
    mesh: Mesh


def find_faces(rgb: np.ndarray) -> list[FoundFace]:
    """Every face BlazeFace finds in an RGB photo that FaceMesh confirms (it rejects the
    odd patch of texture BlazeFace scores just over its threshold), largest first."""
    found = []
    for face in landmarks.find_faces(rgb):
        centre = face.box[:2] + face.box[2:] / 2
        mesh = landmarks.face_mesh(rgb, centre, ROI_PER_SIDE * max(face.box[2:]), face.roll)
        if mesh.presence >= MIN_PRESENCE:
            found.append(FoundFace(box_from_mesh(mesh), mesh.roll, mesh))
    return sorted(found, key=lambda f: -f.box[2])


def detect_faces(rgb: np.ndarray) -> np.ndarray:
    """The faces of `find_faces` as (n, 4) float boxes x, y, w, h, largest first."""
    return np.array([f.box for f in find_faces(rgb)], np.float64).reshape(-1, 4)


def box_from_mesh(mesh: Mesh) -> np.ndarray:
    """The face's square from its landmarks: 1.15x the forehead-to-chin length, centred 8 %
    of it above their midpoint, along the face's own axis, so it is the same square however
    the face is turned. (The warp's proportions were set on Haar's box; on the bundled
    portraits Haar's box is 1.15x and 0.91x that length, and the synthetic world's 1.24x,
    centred 8-9 % above the midpoint on all three.)"""
    top, chin = mesh.points[landmarks.FOREHEAD], mesh.points[landmarks.CHIN]
    length = float(np.linalg.norm(chin - top))
    centre = (top + chin) / 2 - 0.08 * (chin - top)
    side = _BOX_PER_FACE_LENGTH * length
    return np.array([centre[0] - side / 2, centre[1] - side / 2, side, side])
