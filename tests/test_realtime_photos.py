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


async def upload(http, url, data: bytes, kind: str = "image/jpeg", face_box: str | None = None):
    params = {} if face_box is None else {"face_box": face_box}
    headers = {"Content-Type": kind}
    async with http.post(url + "/photos", data=data, headers=headers, params=params) as r:
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


@pytest.fixture(scope="module")
def dark_photo(tmp_path_factory):
    """A plain photo of a dark synthetic face (one Haar missed), and the box a person drags
    around it (x, y, w, h in its pixels)."""
    from pipeline.media import write_png
    from pipeline.synth.face import landmarks, random_identity, render_reference

    identity = random_identity(4)
    path = write_png(tmp_path_factory.mktemp("dark") / "dark.png", render_reference(identity, 256))
    ox, oy, ow, oh = landmarks(identity, 256).outline
    return path.read_bytes(), [round(ox + ow / 2 - oh / 2), round(oy), round(oh), round(oh)]


async def test_a_face_is_framed_by_hand(photo_engine, dark_photo):
    """POST /photos finds the dark face by itself (201, the detector's box and angle),
    takes it with ?face_box= too (201, the box echoed in photo pixels), refuses bad boxes
    with 400 JSON naming the fault and keeps serving; an offer carries a box beside an
    inline photo, not beside a photo_id."""
    data, box = dark_photo
    async with running_server(engine=photo_engine) as (url, app), aiohttp.ClientSession() as http:
        status, body = await upload(http, url, data, "image/png")
        assert status == 201 and len(body["face_box"]) in (4, 5), body
        x, y, w, h = body["face_box"][:4]
        assert abs(x + w / 2 - (box[0] + box[2] / 2)) < 0.1 * box[2], (body, box)
        bad = {
            "a,b,c,d": "not four numbers",
            "1,2,3": "not four numbers",
            "200,10,100,100": "reaches outside the 256x256 photo",
            "10,10,12,12": "a face needs at least 48 px",
        }
        for text, message in bad.items():
            status, body = await upload(http, url, data, "image/png", text)
            assert status == 400 and message in body["error"], (text, status, body)
        box_text = ",".join(map(str, box))
        status, body = await upload(http, url, data, "image/png", box_text)
        assert status == 201 and body["face_box"] == box, body
        photo_id = body["photo_id"]

        sdp = await make_offer()

        async def offer(**extra):
            async with http.post(url + "/offer", json={"sdp": sdp, "type": "offer", **extra}) as r:
                return r.status, await r.json()

        inline = base64.b64encode(data).decode()
        status, body = await offer(photo=inline, face_box="nope")
        assert status == 400 and "not four numbers" in body["error"], body
        status, body = await offer(photo=inline, face_box=[250, 0, 100, 100])
        assert status == 400 and "outside" in body["error"], body
        status, body = await offer(photo_id=photo_id, face_box=box)
        assert status == 400 and "inline 'photo'" in body["error"], body
        status, body = await offer(face_box=box)
        assert status == 400 and "send the photo too" in body["error"], body
        assert not app[SERVICE].sessions and app[SERVICE].reserved == 0  # no slot taken
        status, body = await offer(photo=inline, face_box=box)
        assert status == 200 and body["session_id"], body
        await asyncio.sleep(0.3)
        async with http.delete(f"{url}/sessions/{body['session_id']}") as r:
            assert r.status == 200
