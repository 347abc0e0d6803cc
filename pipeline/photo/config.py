"""The photo family's config section (`photo:` in a preset)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.sections import check


@dataclass
class PhotoConfig:
    """The photo stack (`runtime.stack: photo`, `pipeline/photo/`): a causal audio→motion
    model and a warping decoder that moves the reference photo's own pixels."""

    # audio→motion model (`pipeline/photo/motion.py`)
    n_mels: int = 40
    hidden: int = 96
    dilations: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    context_frames: int = 16  # left audio context per chunk, in video frames
    lookahead_frames: int = 2  # right context: the mouth leads the sound it shapes
    # warping decoder (`pipeline/photo/warp.py`), all in units of the face box width
    jaw_open: float = 0.11  # lip-to-lip gap at jaw = 1
    head_motion: float = 1.0  # scale of the idle/talking head sway (0: a still head)
    blink: bool = True
    # photo checks (`pipeline/photo/face.py`)
    max_image_bytes: int = 16 * 2**20
    max_image_pixels: int = 40_000_000
    min_face_px: int = 48  # smallest face box, in output pixels

    def validate(self) -> None:
        check(self.hidden >= 8, "photo.hidden", "must be >= 8")
        check(
            len(self.dilations) >= 1 and all(d >= 1 for d in self.dilations),
            "photo.dilations",
            "must be a non-empty list of dilations >= 1",
        )
        check(self.context_frames >= 0, "photo.context_frames", "must be >= 0")
        check(self.lookahead_frames >= 0, "photo.lookahead_frames", "must be >= 0")
        check(0.0 <= self.jaw_open <= 0.3, "photo.jaw_open", "must be in [0, 0.3]")
        check(0.0 <= self.head_motion <= 3.0, "photo.head_motion", "must be in [0, 3]")
        check(self.max_image_bytes >= 1024, "photo.max_image_bytes", "must be >= 1024")
        check(self.min_face_px >= 16, "photo.min_face_px", "must be >= 16")
