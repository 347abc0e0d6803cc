"""The bundled portraits made hard the way real photos are: turned about the face's centre
(a tilted head), or lit from behind (the face dark and hazy, the rim bright); with the
face's box as a person frames it by hand and where the lips really are.

The truth comes from the upright, evenly lit portrait (its landmarks' seam between the
lips, and its face box), carried through the same rotation: nothing here asks the photo
stack about the hard photo itself. `opening_centre` is where a clip's frames move against
the rest frame most: where the mouth opens, measured without the stack's geometry.

`talk` renders a clip and keeps the motion each frame was drawn with; `posed` is the photo
moved by that motion's head sway alone (the warp's own head map, resampled with Lanczos):
what a frame should look like outside the mouth and eyes, so SSIM against it counts what
else changed, not the intended sway (which alone costs 0.15-0.2 SSIM against the rest
frame on these portraits: a whole-pixel shift of the face, nothing blurred, already does).
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np
import torch

from pipeline.clock import MODEL_RATE
from pipeline.media import ASSETS, load_image
from pipeline.photo.warp import WarpDecoder


@dataclass(frozen=True)
class HardFace:
    rgb: np.ndarray
    box: tuple[float, float, float, float]  # drawn upright around the face, photo pixels
    angle: float  # degrees clockwise the face is turned (a rotated box's ANGLE)
    lips: tuple[float, float]  # the seam between the lips, photo pixels


def portrait(name: str = "grace_hopper.jpg") -> np.ndarray:
    return load_image(ASSETS / "portraits" / name)


def tilted(angle: float, name: str = "grace_hopper.jpg") -> HardFace:
    """The portrait turned `angle` degrees clockwise about its face's centre."""
    from pipeline.faces.finder import find_faces

    rgb = portrait(name)
    face = find_faces(rgb)[0]
    x, y, w, h = face.box
    centre = (x + w / 2, y + h / 2)
    m = cv2.getRotationMatrix2D(centre, -angle, 1.0)  # OpenCV turns counter-clockwise
    turned = cv2.warpAffine(rgb, m, rgb.shape[1::-1], borderMode=cv2.BORDER_REFLECT)
    lips = m @ np.array([*face.mesh.lip_seam, 1.0])
    return HardFace(turned, (x, y, w, h), angle, (float(lips[0]), float(lips[1])))


def backlit(name: str = "grace_hopper.jpg") -> HardFace:
    """The portrait lit from behind: the face at a third of its light and hazy (a veil of
    grey), brightening smoothly to more than full light at the rim of the head."""
    from pipeline.faces.finder import find_faces

    rgb = portrait(name).astype(np.float32)
    face = find_faces(portrait(name))[0]
    x, y, w, h = face.box
    yy, xx = np.mgrid[0 : rgb.shape[0], 0 : rgb.shape[1]]
    r = np.hypot((xx - x - w / 2) / (0.55 * w), (yy - y - h / 2) / (0.65 * h))
    light = 0.3 + 1.0 * np.clip(r, 0, 1) ** 3  # dark in the middle, 1.3 at the rim
    lit = rgb * light[..., None] + 35.0 * (1 - np.clip(r, 0, 1))[..., None]  # the haze
    out = np.clip(lit, 0, 255).astype(np.uint8)
    return HardFace(out, (x, y, w, h), 0.0, tuple(float(v) for v in face.mesh.lip_seam))


def opening_centre(frames: np.ndarray, rest: np.ndarray, box) -> np.ndarray:
    """Where the frames move against the rest frame most, inside the face box (x, y, w, h):
    the centroid of the strongest fifth of the mean luma change, after a blur of 3 % of the
    box. On a talking face that is the opening mouth."""
    x, y, w, h = (float(v) for v in box[:4])
    grey = lambda f: cv2.cvtColor(f, cv2.COLOR_RGB2GRAY).astype(np.float32)  # noqa: E731
    change = np.mean([np.abs(grey(f) - grey(rest)) for f in frames], axis=0)
    change = cv2.GaussianBlur(change, (0, 0), 0.03 * w)
    mask = np.zeros_like(change)
    mask[int(max(0, y)) : int(y + h), int(max(0, x)) : int(x + w)] = 1
    change *= mask
    strong = change >= 0.8 * change.max()
    ys, xs = np.nonzero(strong)
    wts = change[strong]
    return np.array([(xs + 0.5) @ wts / wts.sum(), (ys + 0.5) @ wts / wts.sum()])


class _Recording:
    """A stream's decoder that keeps the motion parameters of every frame it draws."""

    def __init__(self, decoder: WarpDecoder) -> None:
        self.decoder, self.params = decoder, list[np.ndarray]()

    def render(self, params_TP: np.ndarray) -> np.ndarray:
        self.params.append(np.array(params_TP))
        return self.decoder.render(params_TP)


def talk(engine, prepared, audio: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The photo stack's frames of `audio` (pushed a second at a time, seed 0), and the
    (T, len(PARAMS)) motion each was drawn with."""
    stream = engine.new_stream(prepared, seed=0)
    stream.decoder = recording = _Recording(stream.decoder)
    batches = []
    for i in range(0, len(audio), MODEL_RATE):
        stream.push_audio(audio[i : i + MODEL_RATE])
        batches += stream.generate_ready()
    batches += stream.finish()
    frames = np.concatenate([b.frames for b in batches])
    return frames, np.concatenate(recording.params)[: len(frames)]


def posed(prepared, params: np.ndarray) -> np.ndarray:
    """uint8 (T, H, W, 3): the framed photo moved by each frame's head motion alone (no
    mouth, no blink), resampled with Lanczos from where the warp's head map says."""
    decoder = WarpDecoder(prepared.framed, prepared.face, 0.0, torch.device("cpu"))
    xs, ys = decoder.head_map(params)
    lanczos, edge = cv2.INTER_LANCZOS4, cv2.BORDER_REPLICATE
    return np.stack(
        [
            cv2.remap(prepared.framed, x - 0.5, y - 0.5, lanczos, borderMode=edge)
            for x, y in zip(xs, ys, strict=True)
        ]
    )
