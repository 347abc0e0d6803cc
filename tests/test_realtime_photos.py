"""A session's own photo through the page's upload (POST /photos) and POST /offer: a good
one starts a session of that face; every bad one is refused with 4xx JSON before a slot
is taken."""

from __future__ import annotations

import asyncio
import base64

import aiohttp
import pytest
from support.photos import PORTRAIT, write_bad_photos
from support.realtime import make_offer, running_server

from pipeline.config import load_config
from pipeline.startup import load_engine
from realtime.server import SERVICE

EXPECTED = {
    "faceless": 422,
    "tiny face": 422,
    "two faces": 422,
    "truncated": 400,
    "corrupt": 400,
    "not an image": 415,
    "too many pixels": 413,
    "too many bytes": 413,
}


@pytest.fixture(scope="module")
def photo_engine():
    engine = load_engine(load_config("photo"), "cpu")
    engine.warmup()
    return engine


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    return write_bad_photos(tmp_path_factory.mktemp("bad"))


async def upload(http, url, data: bytes, kind: str = "image/jpeg"):
    async with http.post(url + "/photos", data=data, headers={"Content-Type": kind}) as r:
        return r.status, await r.json()


@pytest.mark.slow  # a face search on every photo
async def test_page_upload_checks_every_photo(photo_engine, bad):
    async with running_server(engine=photo_engine) as (url, app), aiohttp.ClientSession() as http:
        status, body = await upload(http, url, PORTRAIT.read_bytes())
        assert status == 201 and body["photo_id"] and len(body["face"]) == 4, body
        for case, want in EXPECTED.items():
            path, message = bad[case]
            status, body = await upload(http, url, path.read_bytes(), "image/png")
            assert status == want and message in body["error"], (case, status, body)
        status, body = await upload(http, url, PORTRAIT.read_bytes(), "text/plain")
        assert status == 415 and "Content-Type" in body["error"], body


async def test_offer_with_its_own_photo(photo_engine, bad):
    async with running_server(engine=photo_engine) as (url, app), aiohttp.ClientSession() as http:
        sdp = await make_offer()

        async def offer(**extra):
            body = {"sdp": sdp, "type": "offer", **extra}
            async with http.post(url + "/offer", json=body) as r:
                return r.status, await r.json()

        status, body = await offer(photo_id="nope")
        assert status == 400 and "POST /photos" in body["error"], body
        faceless = base64.b64encode(bad["faceless"][0].read_bytes()).decode()
        status, body = await offer(photo=faceless)
        assert status == 422 and "no face found" in body["error"], body
        status, body = await offer(photo="not base64!")
        assert status == 400 and "base64" in body["error"], body
        assert not app[SERVICE].sessions and app[SERVICE].reserved == 0  # no slot taken
        _, up = await upload(http, url, PORTRAIT.read_bytes())
        status, body = await offer(photo_id=up["photo_id"])
        assert status == 200 and body["session_id"], body
        await asyncio.sleep(0.5)
        async with http.delete(f"{url}/sessions/{body['session_id']}") as r:
            assert r.status == 200


async def test_uploads_need_the_photo_stack():
    async with running_server() as (url, _), aiohttp.ClientSession() as http:  # tiny config
        status, body = await upload(http, url, PORTRAIT.read_bytes())
        assert status == 400 and "--config photo" in body["error"], body
