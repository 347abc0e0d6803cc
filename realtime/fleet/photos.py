"""The page's own photo through a fleet front: `POST /photos` and the offer's photo.

The front runs the server's checks itself (`realtime/photos.py`: the same code, status
codes and JSON), off its event loop, and keeps the checked, framed photo (`PreparedPhoto`,
one video-sized frame) in the cluster's session registry (`fleet/registry.py`, the newest
32), so an offer through any front can name it. An offer that names one (`photo_id`) or
carries one inline (`photo`) has it found or checked here, before any worker is asked,
and the prepared photo travels with the offer to the worker it is placed on (Ray's object
store carries the arguments), which opens the session with it as the server does. No
worker keeps uploads, so any worker can take any offer. A registry that Ray restarted has
no photos: an offer naming an older one is told to upload it again (400).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from pipeline.config import FacecastConfig, load_config
from pipeline.startup import EngineOptions
from realtime.fleet.pool import POOL, WorkerPool
from realtime.photos import photo_of_offer, upload_to
from realtime.service import CONFIG

ENGINE_CONFIG = web.AppKey("facecast-fleet-engine-config", FacecastConfig)


def add_photo_routes(app: web.Application, engine_options: EngineOptions) -> None:
    """`POST /photos` on the front, checked for the workers' engine config."""
    # The workers load this very config (their EngineOptions are the front's), so a photo
    # the front accepts is framed as their engine needs it.
    # (--model's preset where it names a real model, not the default config beside it)
    app[ENGINE_CONFIG] = load_config(*engine_options.config_and_overrides())
    app.router.add_post("/photos", _upload)


class ClusterPhotos:
    """The photos of the registry, through the pool's registry calls (each with its
    timeout: 503 when the registry does not answer)."""

    def __init__(self, pool: WorkerPool) -> None:
        self.pool = pool

    async def keep(self, prepared: Any) -> str:
        return await self.pool.registry_call("add_photo", prepared)

    async def lookup(self, photo_id: str) -> Any | None:
        return await self.pool.registry_call("photo", photo_id)


async def _upload(request: web.Request) -> web.Response:
    timeout = request.app[CONFIG].security.body_timeout_s
    store = ClusterPhotos(request.app[POOL])
    return await upload_to(request, request.app[ENGINE_CONFIG], store, timeout)


async def offer_photo(request: web.Request, body: dict) -> Any:
    """The offer's own prepared photo, or None for the workers' reference; a RealtimeError
    (4xx, the server's) for an unknown id or a photo that fails the checks."""
    store = ClusterPhotos(request.app[POOL])
    return await photo_of_offer(request.app[ENGINE_CONFIG], store, body)
