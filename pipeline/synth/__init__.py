"""The synthetic face world: a procedural talking face whose ground truth is known.

- `face`     — identities, the vectorised numpy renderer (`render_frames`) and where it
               paints the face (`landmarks`).
- `reference` — a reference PNG that names its identity, checked by re-rendering.
- `motion`   — per-frame mouth, blink and head tracks driven by 16 kHz audio.
- `speech`   — offline speech with Debian's espeak-ng (voices, languages, pauses).
- `dataset`  — deterministic training shards (frames + audio + per-frame params).
- `commands` — entry functions the CLI wires as subcommands.

Everything here is deterministic from a seed and runs on one CPU core.
"""

from pipeline.synth.face import FaceIdentity, random_identity, render_frames, render_reference
from pipeline.synth.motion import (
    MotionTrack,
    MouthParams,
    motion_from_audio,
    mouth_track_from_audio,
)

__all__ = [
    "FaceIdentity",
    "MotionTrack",
    "MouthParams",
    "motion_from_audio",
    "mouth_track_from_audio",
    "random_identity",
    "render_frames",
    "render_reference",
]
