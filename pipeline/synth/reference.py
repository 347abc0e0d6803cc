"""A synthetic reference image that says which identity it shows.

`facecast make-reference` writes an identity's neutral render (`render_reference`) as a PNG
whose tEXt chunk `IDENTITY_KEY` holds the identity's parameters as JSON (about 1 KB).
`identity_of(data, rgb)` reads them back from the file's bytes and re-renders that identity
at the picture's size; only when the render matches the decoded picture (every channel of
every pixel within `TOLERANCE` grey levels) is the picture taken to be that identity.

Why a chunk checked by re-rendering, rather than recognising the world's faces from their
pixels (the metrics' layout measurer, `pipeline.eval.metrics.measure_layout`, assumes the
world's framing and takes the reddest rows below the centre for the lips): the measurer
would also "find" lips in a faceless real photo with a reddish patch there, so a photo that
must be refused would be animated with a made-up face; and it knows the mouth only, not the
face or the eyes. The chunk carries the world's own numbers, so the face, eyes and mouth
are exact (`pipeline.synth.face.landmarks`) on every skin tone, including those the Haar
detector misses. It survives everything that passes the file on as bytes (an upload to
`POST /photos`, a fleet worker's copy of `--reference`). The re-render means a stale chunk
(the picture edited, cropped or resized after it was written) or a forged one is ignored
instead of trusted: such a picture is treated like any photo. A copy that was re-encoded
(a JPEG, a screenshot) has lost the chunk and is treated like any photo too.
"""

from __future__ import annotations

import json

import numpy as np

from pipeline.synth.face import FaceIdentity, render_reference

IDENTITY_KEY = "facecast-identity"
TOLERANCE = 2  # grey levels: rounding differences between machines, not an edited picture
MAX_SIDE = 2048  # larger pictures are not re-rendered (make-reference writes 256 by default)


def identity_text(identity: FaceIdentity) -> dict[str, str]:
    """The PNG text (`pipeline.media.write_png(..., text=)`) that names `identity`."""
    return {IDENTITY_KEY: json.dumps(identity.to_dict(), separators=(",", ":"))}


def identity_of(text: dict[str, str], rgb: np.ndarray) -> FaceIdentity | None:
    """The identity that `rgb` (uint8 (H, W, 3)) is the neutral render of, from the PNG's
    text (`pipeline.media.png_text`), or None when it names none or is not that render."""
    raw = text.get(IDENTITY_KEY)
    h, w = rgb.shape[:2]
    if raw is None or h != w or not 32 <= w <= MAX_SIDE:
        return None
    try:
        identity = FaceIdentity.from_dict(json.loads(raw))
        render = render_reference(identity, w)
    except (ValueError, TypeError, AttributeError, IndexError, KeyError):  # not an identity
        return None
    diff = np.abs(render.astype(np.int16) - rgb.astype(np.int16))
    return identity if int(diff.max()) <= TOLERANCE else None
