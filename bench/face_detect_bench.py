"""The photo stack's face detector by skin tone, and the hand-drawn box where it misses.

Part 1, detection (Haar as before issue 33, beside BlazeFace + FaceMesh now): synthetic faces (`pipeline.synth.face.random_identity`: skin tone, key
light direction, backdrop hue and brightness all drawn per identity) rendered as plain
photos (the neutral frame's pixels, no identity chunk, so nothing but the detector knows
where the face is), the same number in each skin-tone group, each at two exposures (as rendered, and x0.7: a dim room). A face counts
as found when the detector's largest box overlaps the world's face box (the square the
photo stack uses for a synthetic reference, `pipeline.photo.reference`) with IoU > 0.3.
Faceless images (each identity's backdrop and shoulders without the head, the tests'
gradient wall, and faceless parts of the two bundled portraits) count any box as a false
face. Skin-tone groups by the skin's mean RGB:
dark < 0.35 <= medium < 0.65 <= light (as tests/test_photo_synth.py groups them).

Part 2, `--lip-sync` (instead of part 1): every held-out identity (`pipeline.train.evaluate`) the shipped
detector misses as a plain photo is animated through a hand-drawn box (the square a person
drags around the face outline, forehead to chin, and two sloppier ones) and through its PNG
geometry, 12 s of held-out speech each, scored against the world's ground-truth mouth.

    python bench/face_detect_bench.py [--per-group 40] [--lip-sync] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass

import cv2
import numpy as np

from pipeline.faces import finder
from pipeline.photo import face as F
from pipeline.synth.face import _static_layers, landmarks, random_identity, render_reference

SIZE = 256
GROUPS = ("dark", "medium", "light")
EXPOSURES = (1.0, 0.7)


def skin_group(identity) -> str:
    lum = float(np.mean(identity.skin))
    return "dark" if lum < 0.35 else "light" if lum >= 0.65 else "medium"


def world_box(identity, size: int = SIZE) -> np.ndarray:
    """The face box the photo stack gives a synthetic face: 0.93x the outline's height,
    square, centred on the outline (`pipeline.photo.reference`)."""
    ox, oy, ow, oh = landmarks(identity, size).outline
    side = 0.93 * oh
    return np.array([ox + ow / 2 - side / 2, oy + oh / 2 - side / 2, side, side])


def iou(a, b) -> float:
    ax, ay, aw, ah = a
    bx, by, bw, bh = b
    iw = max(0.0, min(ax + aw, bx + bw) - max(ax, bx))
    ih = max(0.0, min(ay + ah, by + bh) - max(ay, by))
    return iw * ih / (aw * ah + bw * bh - iw * ih)


# ---------------------------------------------------------------------------
# Detectors: RGB image -> (n, 4) boxes, largest first. Haar's, as the photo stack had them
# before issue 33 (OpenCV's shipped cascades), for comparison; BlazeFace's, as it has them.

_DETECT_SIDE, _MIN_SIDE_FRAC = 800, 0.06
_CASCADES: dict[str, cv2.CascadeClassifier] = {}


def cascade(name: str) -> cv2.CascadeClassifier:
    if name not in _CASCADES:
        from cv2.data import haarcascades

        _CASCADES[name] = cv2.CascadeClassifier(haarcascades + name)
    return _CASCADES[name]


def _search(rgb: np.ndarray) -> tuple[np.ndarray, int, float]:
    h, w = rgb.shape[:2]
    s = min(1.0, _DETECT_SIDE / max(h, w))
    grey = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)
    if s < 1.0:
        grey = cv2.resize(grey, (round(w * s), round(h * s)), interpolation=cv2.INTER_AREA)
    return grey, max(20, int(_MIN_SIDE_FRAC * min(grey.shape))), s


def _boxes(found, s: float) -> np.ndarray:
    boxes = np.asarray(found, np.float64).reshape(-1, 4) / s
    return boxes[np.argsort(-boxes[:, 2] * boxes[:, 3])]


def _cascade(name: str, grey: np.ndarray, side: int) -> np.ndarray:
    return cascade(name).detectMultiScale(
        grey, scaleFactor=1.08, minNeighbors=6, minSize=(side, side)
    )


FACE_CASCADE = "haarcascade_frontalface_default.xml"
ALT2 = "haarcascade_frontalface_alt2.xml"


def haar_one_look(rgb: np.ndarray) -> np.ndarray:
    """The frontal cascade alone (the photo stack of issue 16)."""
    grey, side, s = _search(rgb)
    return _boxes(_cascade(FACE_CASCADE, grey, side), s)


def _gamma(g: float) -> np.ndarray:
    return (255 * (np.arange(256) / 255) ** g).astype(np.uint8)


def haar_three_looks(rgb: np.ndarray) -> np.ndarray:
    """The default cascade; where it finds none, alt2 on the shadows lifted (gamma 0.5),
    then on that image locally equalised (CLAHE): the photo stack before issue 33."""
    grey, side, s = _search(rgb)
    found = _cascade(FACE_CASCADE, grey, side)
    lifted = cv2.LUT(grey, _gamma(0.5))
    clahe = cv2.createCLAHE(clipLimit=2.0, tileGridSize=(4, 4))
    for prepared in (lifted, clahe.apply(lifted)):
        if len(found):
            break
        found = _cascade(ALT2, prepared, side)
    return _boxes(found, s)


def blazeface_alone(rgb: np.ndarray) -> np.ndarray:
    """BlazeFace (short range, else full range), no landmark check."""
    from pipeline.faces import landmarks

    faces = landmarks.find_faces(rgb)
    return np.array([f.box for f in faces], np.float64).reshape(-1, 4)


DETECTORS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Haar, one look (issue 16)": haar_one_look,
    "Haar; alt2 on gamma 0.5; alt2 on CLAHE of it (before issue 33)": haar_three_looks,
    "BlazeFace alone": blazeface_alone,
    "BlazeFace, each face confirmed by FaceMesh (now, `detect_faces`)": finder.detect_faces,
}


@dataclass
class Tally:
    found: dict[str, int]
    total: dict[str, int]
    false_faces: int = 0
    faceless: int = 0
    seconds: float = 0.0


def identities(per_group: int):
    """The first `per_group` identities of each skin-tone group, seeds from 10,000 on."""
    count = dict.fromkeys(GROUPS, 0)
    seed = 10_000
    while min(count.values()) < per_group:
        identity = random_identity(seed)
        seed += 1
        if count[skin_group(identity)] < per_group:
            count[skin_group(identity)] += 1
            yield identity


def faces(per_group: int):
    """(group, image, world box) for `per_group` identities of each group, every exposure."""
    for identity in identities(per_group):
        rgb = render_reference(identity, SIZE)
        for gain in EXPOSURES:
            img = np.clip(rgb.astype(np.float32) * gain + 0.5, 0, 255).astype(np.uint8)
            yield skin_group(identity), img, world_box(identity)


# Parts of the bundled portraits with no face in them (x0, y0, x1, y1): real textures,
# a uniform, a flag and a spacecraft model, where a detector that sees more also invents more.
PORTRAIT_CROPS = {
    "grace_hopper.jpg": ((0, 0, 150, 600), (385, 0, 512, 600), (0, 340, 512, 600)),
    "astronaut.jpg": ((0, 0, 170, 512), (280, 0, 512, 512), (0, 170, 512, 512)),
}


def faceless(per_group: int):
    """Each identity's backdrop and shoulders without the head, the tests' gradient wall,
    and faceless parts of the bundled portraits (as they are, and at twice the size)."""
    from pipeline.media import ASSETS, load_image

    for identity in identities(per_group):
        yield np.clip(_static_layers(identity, SIZE) * 255 + 0.5, 0, 255).astype(np.uint8)
    yy, xx = np.mgrid[0:300, 0:400]
    yield np.stack([yy * 0.5, xx * 0.4, 200 - yy * 0.3], -1).astype(np.uint8)
    for name, crops in PORTRAIT_CROPS.items():
        rgb = load_image(ASSETS / "portraits" / name)
        for x0, y0, x1, y1 in crops:
            crop = np.ascontiguousarray(rgb[y0:y1, x0:x1])
            yield crop
            yield cv2.resize(crop, None, fx=2, fy=2, interpolation=cv2.INTER_CUBIC)


def measure(n: int) -> dict[str, Tally]:
    face_set = list(faces(n))
    empty = list(faceless(n))
    out = {}
    for name, detect in DETECTORS.items():
        t = Tally({g: 0 for g in GROUPS}, {g: 0 for g in GROUPS})
        start = time.perf_counter()
        for group, img, box in face_set:
            hits = detect(img)
            t.total[group] += 1
            t.found[group] += int(len(hits) > 0 and iou(hits[0], box) > 0.3)
        for img in empty:
            t.faceless += 1
            t.false_faces += int(len(detect(img)) > 0)
        t.seconds = time.perf_counter() - start
        out[name] = t
    return out


def detection_table(tallies: dict[str, Tally]) -> str:
    first = next(iter(tallies.values()))
    head = " | ".join(f"{g} (n={first.total[g]})" for g in GROUPS)
    lines = [
        f"| detector | {head} | faceless images with a face found (n={first.faceless}) |",
        "| --- |" + " --- |" * (len(GROUPS) + 1),
    ]
    for name, t in tallies.items():
        cells = " | ".join(
            f"{t.found[g]}/{t.total[g]} ({100 * t.found[g] / max(1, t.total[g]):.0f} %)"
            for g in GROUPS
        )
        lines.append(f"| {name} | {cells} | {t.false_faces} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Part 2: the hand-drawn box on the identities the detector misses.


def drawn_boxes(identity) -> dict[str, tuple[float, float, float, float]]:
    """Boxes a person might drag around the face: forehead to chin (the outline's height,
    centred), the same shifted by 8 % of its side right and down, and one 15 % larger."""
    ox, oy, ow, oh = landmarks(identity, SIZE).outline
    cx, cy = ox + ow / 2, oy + oh / 2
    out = {}
    for name, side, dx, dy in (
        ("drawn", oh, 0.0, 0.0),
        ("drawn, shifted", oh, 0.08 * oh, 0.08 * oh),
        ("drawn, 15 % larger", 1.15 * oh, 0.0, 0.0),
    ):
        x, y = cx - side / 2 + dx, cy - side / 2 + dy
        x, y = max(0.0, x), max(0.0, y)
        side = min(side, SIZE - x, SIZE - y)
        out[name] = (round(x), round(y), round(side), round(side))
    return out


def lip_sync_rows(seconds: float) -> list[str]:
    from pipeline.config import load_config
    from pipeline.photo.reference import prepare_synthetic
    from pipeline.startup import load_engine
    from pipeline.synth.dataset import identity_for
    from pipeline.train.evaluate import EVAL_SEED, held_out_speech, score

    engine = load_engine(load_config("photo"), "cpu")
    cfg = engine.cfg.photo
    audio = held_out_speech(seconds)
    rows = []
    for k in range(8):
        identity = identity_for(EVAL_SEED, k)
        reference = render_reference(identity, SIZE)
        if len(finder.detect_faces(reference)) > 0:
            continue
        scores = {}
        png = prepare_synthetic(reference, identity, SIZE, SIZE, cfg)
        frames, seams = _frames(engine, png, audio)
        scores["PNG geometry"] = score(frames, reference, audio, seams)
        for name, box in drawn_boxes(identity).items():
            prepared = F.prepare_photo(reference, SIZE, SIZE, cfg, box)
            frames, seams = _frames(engine, prepared, audio)
            label = f"{name} {','.join(str(v) for v in box)}"
            scores[label] = score(frames, reference, audio, seams)
        base = scores["PNG geometry"]["lip_sync_r"]
        cells = [f"{name}: {s['lip_sync_r']:.3f}" for name, s in scores.items()]
        worst = min(s["lip_sync_r"] for name, s in scores.items() if name != "PNG geometry")
        rows.append(f"| {k} ({skin_group(identity)}) | {'; '.join(cells)} | {worst - base:+.3f} |")
        print(rows[-1], flush=True)
    return rows


def _frames(engine, prepared, audio):
    from pipeline.train.evaluate import generate

    frames, seams, *_ = generate(engine, prepared, audio)
    return frames, seams


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--per-group", type=int, default=40, help="synthetic faces per skin-tone group (x2)"
    )
    p.add_argument(
        "--lip-sync", action="store_true", help="part 2 instead of part 1 (minutes per face)"
    )
    p.add_argument("--seconds", type=float, default=12.0, help="part 2: seconds of speech")
    p.add_argument("--markdown", help="also write the tables to this file")
    args = p.parse_args(argv)
    cv2.setNumThreads(1)
    text = ""
    if not args.lip_sync:
        tallies = measure(args.per_group)
        text = detection_table(tallies) + "\n"
        print(text)
        for name, t in tallies.items():
            print(f"{name}: {t.seconds:.1f} s for {sum(t.total.values()) + t.faceless} images")
    else:
        head = (
            "| held-out identity the detector misses | lip-sync r, 12 s: PNG geometry; "
            "hand-drawn boxes x,y,w,h (256x256 photo pixels) | worst drawn minus PNG |\n"
            "| --- | --- | --- |"
        )
        print(head)
        text = head + "\n" + "\n".join(lip_sync_rows(args.seconds)) + "\n"
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
