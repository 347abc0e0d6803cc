"""A session's own photo: uploaded by the page, checked, kept until an offer uses it.

`POST /photos` takes the image itself as the body (`Content-Type: image/png`, `image/jpeg`
or `image/webp`, at most `photo.max_image_bytes`), checks it exactly as `facecast render`
does (`pipeline.photo.reference`: type by magic bytes, pixel count, decoding, one frontal
face big enough, or a synthetic reference that names its identity) off the event loop, and
answers 201 `{"photo_id", "face", "face_box"}` (the face in video pixels, and in the
photo's own). `POST /offer` then names it with `"photo_id"`, or carries a small photo
inline as `"photo"` (base64, within the offer's body limit). Every refusal is one line of
JSON: 415 for a type that is not an image we read, 413 for too many bytes or pixels, 400
for a corrupt file, 422 for a photo without exactly one usable face.

A face the detector misses (or gets wrong) is framed by hand: `POST /photos?face_box=X,Y,W,H`
(the page's box drawing), or `"face_box": [x, y, w, h]` beside an inline `"photo"`, in the
original photo's pixels (`pipeline.faces.face_box.parse_face_box`, `check_face_box`); a box that
is not four numbers, lies outside the photo or is too small is a 400 naming the problem.

Uploads are held in a bounded store (oldest dropped first), so they never pile up; they
are only usable with the photo stack (`runtime.stack: photo`). The checks take the engine's
config and a store, not a server, so the fleet's front (`realtime/fleet/photos.py`) runs
the very same ones, keeping the photos in the cluster's session registry.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import secrets
from collections import OrderedDict
from typing import Any, Protocol

from aiohttp import web

from pipeline.errors import PhotoError
from realtime.errors import BadRequest, RealtimeError, UnsupportedMediaType

MAX_PHOTOS = 32  # uploads kept at once; each is one framed video-sized image


class PayloadTooLarge(RealtimeError):
    """A photo with more bytes or pixels than the server takes (HTTP 413)."""

    status = 413


class PhotoRefused(RealtimeError):
    """A photo that decodes but cannot be animated: no face, several, too small (HTTP 422)."""

    status = 422


_STATUS = {
    "type": UnsupportedMediaType,
    "size": PayloadTooLarge,
    "corrupt": BadRequest,
    "box": BadRequest,
}


class PhotoStore:
    """Checked photos by id, the newest `MAX_PHOTOS`. The server keeps one; so does the
    fleet's session registry (`realtime/fleet/registry.py`), for every front."""

    def __init__(self, limit: int = MAX_PHOTOS) -> None:
        self.limit = limit
        self._photos: OrderedDict[str, Any] = OrderedDict()

    def add(self, prepared: Any) -> str:
        photo_id = secrets.token_urlsafe(12)
        self._photos[photo_id] = prepared
        while len(self._photos) > self.limit:
            self._photos.popitem(last=False)
        return photo_id

    def find(self, photo_id: str) -> Any | None:
        return self._photos.get(photo_id)

    # The routes' calls, awaited so that the fleet's front, whose store is a Ray actor,
    # makes the same ones (fleet/photos.py); here they return at once.

    async def keep(self, prepared: Any) -> str:
        return self.add(prepared)

    async def lookup(self, photo_id: str) -> Any | None:
        return self.find(photo_id)


class Photos(Protocol):
    """Where the routes keep and find checked photos."""

    async def keep(self, prepared: Any) -> str: ...

    async def lookup(self, photo_id: str) -> Any | None: ...


def _check_stack(cfg) -> None:
    if not cfg.family.photos:
        raise BadRequest(
            f"this server runs config {cfg.name!r}, which animates its own identity; "
            "start it with --config photo to animate uploaded photos"
        )


def face_box_of(value: Any):
    """A request's hand-drawn face box (`None` when not given), or a 400 naming the fault."""
    from pipeline.faces.face_box import parse_face_box

    if value is None:
        return None
    try:
        return parse_face_box(value)
    except PhotoError as exc:
        raise BadRequest(str(exc)) from None


async def prepare(cfg, data: bytes, name: str, face_box=None):
    """Checked and framed photo (`PreparedPhoto`) from the bytes, around the hand-drawn
    `face_box` if given, or the RealtimeError to answer with. Decoding and face detection
    run in a thread, off the event loop."""
    from pipeline.photo.reference import prepare_reference

    def work():
        v = cfg.video
        return prepare_reference(data, name, v.width, v.height, cfg.photo, face_box)

    try:
        return await asyncio.to_thread(work)
    except PhotoError as exc:
        raise _STATUS.get(exc.kind, PhotoRefused)(str(exc)) from None


async def read_limited(request: web.Request, limit: int, timeout_s: float) -> bytes:
    """The body, refusing it (413) as soon as it passes `limit` bytes."""
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(
            f"photo of {request.content_length / 2**20:.1f} MiB; the limit is "
            f"{limit / 2**20:.0f} MiB: save a smaller JPEG"
        )

    async def read() -> bytes:
        parts, size = [], 0
        async for chunk in request.content.iter_chunked(64 * 1024):
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"photo larger than the {limit / 2**20:.0f} MiB limit")
            parts.append(chunk)
        return b"".join(parts)

    try:
        return await asyncio.wait_for(read(), timeout_s)
    except asyncio.TimeoutError:
        raise BadRequest(f"the photo did not arrive within {timeout_s:g} s") from None


async def upload(request: web.Request, service) -> web.Response:
    """POST /photos on the server: the image as the body → 201 {"photo_id", "face",
    "face_box"}."""
    timeout = service.config.security.body_timeout_s
    return await upload_to(request, service.engine.cfg, service.photos, timeout)


async def upload_to(request: web.Request, cfg, store: Photos, timeout: float) -> web.Response:
    """POST /photos[?face_box=X,Y,W,H] for an engine of `cfg`, the checked photo kept in
    `store`."""
    from pipeline.photo.face import IMAGE_TYPES

    _check_stack(cfg)
    if request.content_type not in IMAGE_TYPES:
        raise UnsupportedMediaType(
            f"send the photo as the body with Content-Type one of {', '.join(IMAGE_TYPES)} "
            f"(got {request.content_type!r})"
        )
    face_box = face_box_of(request.query.get("face_box"))  # refused before the body is read
    data = await read_limited(request, cfg.photo.max_image_bytes, timeout)
    prepared = await prepare(cfg, data, "upload", face_box)
    photo_id = await store.keep(prepared)
    face = [round(v, 1) for v in prepared.face.box]
    body = {"photo_id": photo_id, "face": face}
    if prepared.photo_box is not None:  # the same box in the photo's own pixels
        body["face_box"] = [round(v, 1) for v in prepared.photo_box]
    return web.json_response(body, status=201)


async def offer_photo(service, body: dict) -> Any:
    """The offer's own photo (`photo_id` or inline `photo`), or None for the server's."""
    if body.get("photo_id") is None and body.get("photo") is None:
        _no_box_without_photo(body)
        return None  # no engine needed to say so
    return await photo_of_offer(service.engine.cfg, service.photos, body)


def _no_box_without_photo(body: dict) -> None:
    if body.get("face_box") is not None:
        raise BadRequest("'face_box' frames the offer's inline 'photo': send the photo too")


async def photo_of_offer(cfg, store: Photos, body: dict) -> Any:
    """The offer's own photo for an engine of `cfg`, by id from `store` or inline; None."""
    photo_id, inline = body.get("photo_id"), body.get("photo")
    if photo_id is None and inline is None:
        _no_box_without_photo(body)
        return None
    _check_stack(cfg)
    if photo_id is not None and inline is not None:
        raise BadRequest("give 'photo_id' or 'photo', not both")
    face_box = face_box_of(body.get("face_box"))
    if photo_id is not None:
        if face_box is not None:
            raise BadRequest(
                "'face_box' goes with the photo itself: an inline 'photo', or the upload "
                "(POST /photos?face_box=X,Y,W,H)"
            )
        if not isinstance(photo_id, str):
            raise BadRequest("'photo_id' must be the string POST /photos answered")
        prepared = await store.lookup(photo_id)
        if prepared is None:
            raise BadRequest(
                f"unknown photo_id {photo_id!r}: upload the photo with POST /photos first "
                f"(the server keeps the latest {MAX_PHOTOS})"
            )
        return prepared
    if not isinstance(inline, str):
        raise BadRequest("'photo' must be the image as a base64 string")
    try:
        data = base64.b64decode(inline.split(",", 1)[-1], validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest("'photo' is not valid base64") from None
    return await prepare(cfg, data, "in the offer", face_box)
