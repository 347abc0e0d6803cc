"""The warping decoder: motion parameters → frames made of the photo's own pixels.

Each output pixel p is traced back to the photo through a chain of smooth backward maps,
each a closed form in the face's geometry (`FaceGeometry`, units of the face box width w):

1. head: a small rigid motion (sway, nod, roll about the neck) weighted by a soft ellipse
   around the head, so the background outside it never moves;

Maps 1, 2 and 4 are laid out in the face's own frame (`FaceGeometry.roll`: a tilted face's
mouth opens along its own vertical, its ellipse and neck turn with it): each pixel's
offset is turned into that frame, mapped, and turned back.

2. jaw: below the lip line the skin moves down by up to 3/4 of the opening, fading to
   nothing about half a face width lower and widening towards the chin; above it the upper
   lip rises by 1/4, fading before the nose; between the two lips opens a lens-shaped gap
   whose width follows the lip spread;
3. lips: spread (width) and rounding scale the mouth region horizontally about its centre;
4. blink: over each eye the skin above slides down (the upper lid closing).

The photo is sampled once at the traced positions (bilinear), and the gap between the lips
is painted: a dark cavity shaded from the lip colour and, when `teeth` is up, a band of
upper teeth. Pixels no map moves keep the photo's exact values, so outside the moving
region (at 1280x720, outside the head's ellipse, unless the face fills the frame) the
output is the photo at full resolution.

Everything is batched over a chunk's frames and runs in torch on the engine's device.
Legend: T frames, H/W output pixels (of the region of interest), P params.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from pipeline.photo.face import FaceGeometry

# Columns of the params array a chunk hands the decoder.
PARAMS = ("jaw", "width", "rounding", "teeth", "blink", "head_x", "head_y", "head_roll")


def _smoothstep(x: Tensor) -> Tensor:
    x = x.clamp(0, 1)
    return x * x * (3 - 2 * x)


def _lens(u: Tensor) -> Tensor:
    """1 at the centre, 0 at |u| >= 1, rounder than a cosine near the middle."""
    return (1 - u * u).clamp_min(0).pow(0.6)


@dataclass
class _Roi:
    x0: int
    y0: int
    x1: int
    y1: int


class WarpDecoder:
    """One session's decoder: the photo and its geometry, prepared once."""

    def __init__(
        self, framed: np.ndarray, face: FaceGeometry, jaw_open: float, device: torch.device
    ) -> None:
        H, W = framed.shape[:2]
        x, y, w, h = face.box
        self.face = face
        self.jaw_open = jaw_open
        self.device = device
        self.photo = framed
        # the region of interest holds the head's soft ellipse (below) whole, so nothing
        # outside it moves: 1.6 radii of 0.85 w and 1.05 h around (x + w/2, y + 0.45 h)
        self.roi = _Roi(
            int(max(0, np.floor(x - 0.9 * w))),
            int(max(0, np.floor(y - 1.25 * h))),
            int(min(W, np.ceil(x + 1.9 * w))),
            int(min(H, np.ceil(y + 2.15 * h))),
        )
        r = self.roi
        crop = framed[r.y0 : r.y1, r.x0 : r.x1]
        self.src_13HW = torch.from_numpy(np.ascontiguousarray(crop)).to(device)
        self.src_13HW = self.src_13HW.permute(2, 0, 1)[None].float()
        ys = torch.arange(r.y0, r.y1, device=device, dtype=torch.float32) + 0.5
        xs = torch.arange(r.x0, r.x1, device=device, dtype=torch.float32) + 0.5
        self.Y, self.X = torch.meshgrid(ys, xs, indexing="ij")  # pixel centres, (H, W)
        # The head's motion is smooth (a rigid motion times a soft weight), so it is worked
        # out on a grid 4x coarser and interpolated: a third of the work at 1280x720.
        n_y, n_x = -(-len(ys) // 4) + 1, -(-len(xs) // 4) + 1
        self.Yc, self.Xc = torch.meshgrid(
            torch.linspace(float(ys[0]), float(ys[-1]), n_y, device=device),
            torch.linspace(float(xs[0]), float(xs[-1]), n_x, device=device),
            indexing="ij",
        )
        # the face's own frame: `roll` turns it about the box's centre (clockwise on screen)
        self.cos, self.sin = float(np.cos(face.roll)), float(np.sin(face.roll))
        cx, cy = self._from_face(0.0, -0.05 * h, x + 0.5 * w, y + 0.5 * h)
        u, v = self._to_face(self.Xc - cx, self.Yc - cy)
        e = torch.sqrt((u / (0.85 * w)) ** 2 + (v / (1.05 * h)) ** 2)
        self.head_weight = _smoothstep((1.6 - e) / 0.6)  # 1 on the head, 0 past 1.6 radii
        self.pivot = self._from_face(0.0, 0.75 * h, x + 0.5 * w, y + 0.5 * h)  # the neck
        lips = torch.tensor(face.lips, device=device) / 255.0
        skin_lum = float(np.mean(face.skin)) / 255.0
        # the cavity is a fixed share of the lips' colour, so an open mouth is as much darker
        # than the lips on every skin tone; an added floor (+0.03) had made it relatively
        # lighter the darker the lips, and the mouth read half as open on dark skin
        self.cavity_rgb = (lips * 0.45).view(1, 3, 1, 1)
        self.teeth_rgb = (
            torch.tensor([0.95, 0.92, 0.84], device=device) * min(1.0, 0.55 + 0.5 * skin_lum)
        ).view(1, 3, 1, 1)

    def _to_face(self, dx, dy):
        """An offset in frame pixels → the same offset in the face's frame (turned back)."""
        return self.cos * dx + self.sin * dy, -self.sin * dx + self.cos * dy

    def _from_face(self, du, dv, ox=0.0, oy=0.0):
        """An offset in the face's frame → frame pixels, plus an origin (ox, oy)."""
        return ox + self.cos * du - self.sin * dv, oy + self.sin * du + self.cos * dv

    def _turned_slices(
        self, cx: float, cy: float, left: float, up: float, right: float, down: float
    ) -> tuple[slice, slice]:
        """ROI slices holding the face-frame box [-left, right] x [-up, down] about (cx, cy)."""
        corners = [self._from_face(u, v, cx, cy) for u in (-left, right) for v in (-up, down)]
        xs, ys = [c[0] for c in corners], [c[1] for c in corners]
        return self._slices(min(xs), min(ys), max(xs), max(ys))

    def _slices(self, x0: float, y0: float, x1: float, y1: float) -> tuple[slice, slice]:
        """ROI index slices of a box in frame pixels (clipped; may be empty)."""
        r = self.roi
        ys = slice(
            int(np.clip(np.floor(y0) - r.y0, 0, r.y1 - r.y0)),
            int(np.clip(np.ceil(y1) - r.y0, 0, r.y1 - r.y0)),
        )
        xs = slice(
            int(np.clip(np.floor(x0) - r.x0, 0, r.x1 - r.x0)),
            int(np.clip(np.ceil(x1) - r.x0, 0, r.x1 - r.x0)),
        )
        return ys, xs

    @torch.inference_mode()
    def render(self, params_TP: np.ndarray) -> np.ndarray:
        """(T, len(PARAMS)) → uint8 (T, H, W, 3) frames of the whole video size."""
        p = torch.from_numpy(np.ascontiguousarray(params_TP, np.float32)).to(self.device)
        jaw, width, rounding, teeth, blink = (c.view(-1, 1, 1) for c in p[:, :5].unbind(1))
        w = self.face.box[2]
        X, Y = self.X.expand(p.shape[0], -1, -1), self.Y.expand(p.shape[0], -1, -1)

        # 1. head: undo a rotation by roll about the neck and a shift, where the head is
        qx, qy = self._head(p[:, 5:])
        sx, sy = qx.clone(), qy.clone()
        alpha = torch.zeros_like(qx)

        # 2-3. mouth and jaw, inside the box they can reach (the head sway adds a margin),
        # worked out in the face's own frame about the mouth and turned back
        mx, my = self.face.mouth
        mw0 = self.face.mouth_half_width
        reach = 2.6 * mw0 + 0.08 * w
        ys, xs = self._turned_slices(mx, my, reach, 0.4 * w, reach, 0.7 * w)
        k = 0.10 * width - 0.18 * rounding  # horizontal scale of the mouth
        u, v = self._to_face(qx[:, ys, xs] - mx, qy[:, ys, xs] - my)
        su, sv, a, paint = self._mouth(u + mx, v + my, jaw, teeth, k)
        sx[:, ys, xs], sy[:, ys, xs] = self._from_face(su - mx, sv - my, mx, my)
        alpha[:, ys, xs] = a

        # 4. blink: the skin above each eye slides down over it (down in the face's frame)
        for ex, ey, ew, eh in self.face.eyes:
            ecx, ecy = ex + 0.5 * ew, ey + 0.5 * eh
            reach = 0.7 * ew + 0.05 * w
            eys, exs = self._turned_slices(ecx, ecy, reach, 3 * eh, reach, 3 * eh)
            eu, ev = self._to_face(sx[:, eys, exs] - ecx, sy[:, eys, exs] - ecy)
            shape = _lens(eu / (0.65 * ew)) * torch.exp(-((ev / (0.9 * eh)) ** 2))
            slide = blink * 1.1 * eh * shape
            sx[:, eys, exs] += self.sin * slide
            sy[:, eys, exs] -= self.cos * slide

        frames = self._sample(sx, sy)
        a = alpha[:, ys, xs].unsqueeze(1)
        frames[:, :, ys, xs] = frames[:, :, ys, xs] * (1 - a) + paint * 255.0 * a
        return self._assemble(frames, (sx - X).abs() + (sy - Y).abs() + alpha > 1e-3)

    def _head(self, head_T3: Tensor) -> tuple[Tensor, Tensor]:
        """Where each ROI pixel (T, H, W) comes from in the photo under the head's motion
        (head_x, head_y, head_roll a frame): a rotation about the neck and a shift, weighted
        by the head's soft ellipse, worked out on the coarse grid and interpolated."""
        hx, hy, roll = (c.view(-1, 1, 1) for c in head_T3.unbind(1))
        w = self.face.box[2]
        px, py = self.pivot
        cos, sin = torch.cos(roll), torch.sin(roll)
        Xc, Yc, wt = self.Xc, self.Yc, self.head_weight
        hx, hy = self._from_face(hx * w, hy * w)  # sway and nod along the face's own axes
        dx, dy = Xc - px - hx, Yc - py - hy
        d_T2hw = torch.stack(
            [wt * (px + cos * dx + sin * dy - Xc), wt * (py - sin * dx + cos * dy - Yc)], dim=1
        )
        d_T2HW = F.interpolate(d_T2hw, size=self.X.shape, mode="bilinear", align_corners=True)
        return self.X + d_T2HW[:, 0], self.Y + d_T2HW[:, 1]

    @torch.inference_mode()
    def head_map(self, params_TP: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(T, len(PARAMS)) → float32 (T, H, W) x and y: where each pixel of the whole frame
        comes from in the photo under the head's motion alone (pixel centres at +0.5; the
        photo's own pixel outside the head). What `render` moves the head by, for measuring
        what else changed (the photo posed by it, `tests/support/hard_faces.posed`)."""
        p = torch.from_numpy(np.ascontiguousarray(params_TP, np.float32)).to(self.device)
        qx, qy = self._head(p[:, 5:])
        H, W = self.photo.shape[:2]
        ys, xs = np.mgrid[0:H, 0:W].astype(np.float32) + 0.5
        mx, my = np.repeat(xs[None], len(p), axis=0), np.repeat(ys[None], len(p), axis=0)
        r = self.roi
        mx[:, r.y0 : r.y1, r.x0 : r.x1] = qx.cpu().numpy()
        my[:, r.y0 : r.y1, r.x0 : r.x1] = qy.cpu().numpy()
        return mx, my

    def _mouth(self, qx: Tensor, qy: Tensor, jaw: Tensor, teeth: Tensor, k: Tensor):
        """Backward maps of the jaw (the lips part along the lip line) and the lips
        (spread, rounding) on the mouth box, the gap's coverage, and what shows in it."""
        mx, my = self.face.mouth
        w = self.face.box[2]
        mw = self.face.mouth_half_width * (1 + k)
        # the opening is an oval inside the lips: it closes before the mouth's corners
        gap = jaw * self.jaw_open * w * _lens((qx - mx) / (0.85 * mw)).pow(1.5)
        down, up = 0.75 * gap, 0.25 * gap
        reach_lo, reach_up = 0.55 * w, 0.30 * w
        s = torch.where(qy >= my, (qy - down).clamp_min(my), (qy + up).clamp_max(my))
        for _ in range(3):  # fixed point of qy = s + D(s): D is smooth on each side
            z_lo = ((s - my) / reach_lo).clamp(0, 1)
            widen = _lens((qx - mx) / (mw * (1 + 1.2 * z_lo)))
            d_lo = 0.75 * jaw * self.jaw_open * w * widen * (1 - _smoothstep(z_lo))
            d_up = up * (1 - _smoothstep(((my - s) / reach_up).clamp(0, 1)))
            s = torch.where(qy >= my, (qy - d_lo).clamp_min(my), (qy + d_up).clamp_max(my))
        in_gap = (qy > my - up) & (qy < my + down)
        sy = torch.where(in_gap, torch.full_like(s, my), s)
        soft = 0.35 + 0.02 * w  # edge width, px: lips are soft at their inner edge
        alpha = ((qy - (my - up)) / soft + 0.5).clamp(0, 1)
        alpha = alpha * (((my + down) - qy) / soft + 0.5).clamp(0, 1)
        alpha = alpha * (gap / (gap + 1.0))  # a slit shows less of the dark inside
        m = torch.exp(-(((qx - mx) / (1.5 * self.face.mouth_half_width)) ** 2))
        m = m * torch.exp(-(((sy - my) / (0.16 * w)) ** 2))
        sx = mx + (qx - mx) / (1 + k * m)
        return sx, sy, alpha, self._inside(qx, qy, my - up, gap, teeth, mw)

    def _sample(self, sx: Tensor, sy: Tensor) -> Tensor:
        r = self.roi
        gx = (sx - r.x0) / (r.x1 - r.x0) * 2 - 1
        gy = (sy - r.y0) / (r.y1 - r.y0) * 2 - 1
        grid = torch.stack([gx, gy], dim=-1)
        src = self.src_13HW.expand(len(sx), -1, -1, -1)
        return F.grid_sample(src, grid, mode="bilinear", padding_mode="border", align_corners=False)

    def _inside(self, qx, qy, top, gap, teeth, mw) -> Tensor:
        """What shows between the lips (T, 3, h, w) in 0..1: a dark cavity, lighter near
        the lips, and a band of upper teeth as tall as `teeth` says."""
        mx = self.face.mouth[0]
        depth = ((qy - top) / gap.clamp_min(1e-3)).clamp(0, 1)  # 0 at the upper lip
        side = _lens((qx - mx) / mw).clamp(0, 1)
        cavity = self.cavity_rgb * (0.6 + 0.4 * (2 * depth - 1).abs()).unsqueeze(1)
        band = (teeth * 0.45 * gap).clamp(max=0.06 * self.face.box[2])
        soft = 0.5 + 0.01 * self.face.box[2]  # teeth edges blur like the lips' do
        is_teeth = ((top + band - qy) / soft + 0.5).clamp(0, 1) * (band > 0.4)
        # teeth show in the middle of the mouth, not out to its corners
        is_teeth = (is_teeth * _smoothstep((side - 0.55) / 0.35)).unsqueeze(1)
        shade = 0.6 + 0.4 * _smoothstep((qy - top) / band.clamp_min(1e-3))  # under the lip
        teeth_rgb = self.teeth_rgb * (shade * (0.7 + 0.3 * side)).unsqueeze(1)
        return cavity * (1 - is_teeth) + teeth_rgb * is_teeth

    def _assemble(self, roi_T3HW: Tensor, moved_THW: Tensor) -> np.ndarray:
        r = self.roi
        T = roi_T3HW.shape[0]
        roi = roi_T3HW.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1)
        still = self.src_13HW[0].permute(1, 2, 0).to(torch.uint8)
        roi = torch.where(moved_THW.unsqueeze(-1), roi, still)  # unmoved pixels stay exact
        out = np.repeat(self.photo[None], T, axis=0)
        out[:, r.y0 : r.y1, r.x0 : r.x1] = roi.cpu().numpy()
        return out
