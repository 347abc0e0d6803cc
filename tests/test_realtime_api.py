"""The HTTP API refuses bad input with the right status and a reason, and never falls over."""

from __future__ import annotations

import re

import aiohttp
import pytest
from support.realtime import make_offer, post, running_server

from realtime.service import SERVICE


def without_audio_codecs(sdp: str) -> str:
    """Rewrite the audio section so it offers only a codec nobody supports."""
    sdp = re.sub(r"m=audio (\d+) (\S+) [\d ]+", r"m=audio \1 \2 96", sdp)
    sdp = re.sub(r"a=rtpmap:96 opus/48000/2", "a=rtpmap:96 nonsense/48000/2", sdp)
    return re.sub(r"a=rtpmap:(9|0|8) [^\r\n]+\r\n", "", sdp)


async def test_bad_offers_are_refused_with_reasons():
    async with running_server() as (url, app), aiohttp.ClientSession() as http:
        offer = f"{url}/offer"
        status, body = await post(http, offer, b"{not json")
        assert status == 400 and "JSON" in body["error"]
        status, body = await post(http, offer, [1, 2])
        assert status == 400 and "object" in body["error"]
        status, body = await post(http, offer, {"sdp": "hello", "type": "offer"})
        assert status == 400 and "sdp" in body["error"]
        status, body = await post(http, offer, {"sdp": await make_offer(), "type": "answer"})
        assert status == 400 and "type" in body["error"]
        status, body = await post(
            http, offer, {"sdp": await make_offer(), "type": "offer", "color": "red"}
        )
        assert status == 400 and "color" in body["error"]
        status, body = await post(
            http, offer, {"sdp": await make_offer(), "type": "offer", "seed": "x"}
        )
        assert status == 400 and "seed" in body["error"]
        status, body = await post(
            http, offer, {"sdp": await make_offer(audio=False), "type": "offer"}
        )
        assert status == 400 and "no audio track" in body["error"]
        status, body = await post(
            http, offer, {"sdp": await make_offer(video=False), "type": "offer"}
        )
        assert status == 400 and "video" in body["error"]
        sdp = without_audio_codecs(await make_offer())
        status, body = await post(http, offer, {"sdp": sdp, "type": "offer"})
        assert status == 400 and "codec" in body["error"], body
        status, body = await post(http, offer, b"x" * (256 * 1024))
        assert status == 413 and "larger" in body["error"]
        # Nothing leaked: no session was created by any of these.
        assert app[SERVICE].sessions == {}
        async with http.get(f"{url}/healthz") as r:
            assert r.status == 200 and (await r.json())["sessions"] == 0


async def test_kvs_stream_option_is_checked():
    from realtime.kvs import KvsOptions

    body = {"sdp": await make_offer(), "type": "offer", "kvs_stream": "mine"}
    async with running_server() as (url, app), aiohttp.ClientSession() as http:
        status, reply = await post(http, f"{url}/offer", body)
        assert status == 400 and "does not mirror" in reply["error"]
    async with running_server(kvs=KvsOptions(stream="facecast")) as (url, app):
        async with aiohttp.ClientSession() as http:
            status, reply = await post(http, f"{url}/offer", {**body, "kvs_stream": "no way!"})
            assert status == 400 and "stream name" in reply["error"]
        assert app[SERVICE].sessions == {}


async def test_a_prompt_is_refused_by_a_model_that_reads_none_and_checked():
    from realtime.errors import BadRequest
    from realtime.offer import parse_offer

    body = {"sdp": await make_offer(), "type": "offer", "prompt": "A chef in a kitchen."}
    async with running_server() as (url, app), aiohttp.ClientSession() as http:
        status, reply = await post(http, f"{url}/offer", body)
        assert status == 400 and "reads no prompt" in reply["error"], reply
        assert "only --model liveavatar" in reply["error"]
        assert app[SERVICE].sessions == {}
    # a server whose model reads prompts takes text, and nothing else
    assert parse_offer(body, kvs=False).prompt == "A chef in a kitchen."
    for bad in ("", "   ", 7, "x" * 2001):
        with pytest.raises(BadRequest, match="'prompt' must be text of 1 to 2000"):
            parse_offer({**body, "prompt": bad}, kvs=False)


def test_a_fleets_front_knows_from_the_config_whether_its_workers_read_prompts():
    from types import SimpleNamespace

    from pipeline.startup import EngineOptions
    from realtime.fleet.front import model_prompt_refusal

    demo = SimpleNamespace(engine_options=EngineOptions(config="demo"))
    assert "reads no prompt" in (model_prompt_refusal(demo) or "")  # type: ignore[arg-type]
    files = {"weights": "/models/Wan2.2-S2V-14B", "lora": "/models/Live-Avatar"}
    live = SimpleNamespace(engine_options=EngineOptions(model="liveavatar", **files))
    assert model_prompt_refusal(live) is None  # type: ignore[arg-type]


async def test_unknown_sessions_are_404():
    async with running_server() as (url, _app), aiohttp.ClientSession() as http:
        async with http.delete(f"{url}/sessions/nope") as r:
            assert r.status == 404 and "nope" in (await r.json())["error"]
        async with http.post(f"{url}/sessions/nope/interrupt") as r:
            assert r.status == 404
        async with http.get(f"{url}/sessions") as r:
            assert r.status == 200 and (await r.json()) == {"sessions": []}


async def test_token_guards_every_api_call_but_the_page():
    async with running_server(token="s3cret") as (url, _app), aiohttp.ClientSession() as http:
        good = {"Authorization": "Bearer s3cret"}
        bad = {"Authorization": "Bearer nope"}
        for method, path in [
            ("GET", "/sessions"),
            ("GET", "/healthz"),
            ("GET", "/metrics"),
            ("POST", "/offer"),
            ("DELETE", "/sessions/x"),
            ("POST", "/sessions/x/interrupt"),
        ]:
            for headers in ({}, bad):
                async with http.request(method, url + path, headers=headers) as r:
                    assert r.status == 401, (method, path, headers)
                    assert "token" in (await r.json())["error"]
        async with http.get(f"{url}/healthz", headers=good) as r:
            assert r.status == 200
        async with http.get(f"{url}/metrics", headers=good) as r:
            assert r.status == 200 and "facecast_active_sessions" in await r.text()
        async with http.get(f"{url}/") as r:  # the page itself loads without the token
            assert r.status == 200 and "<video" in await r.text()
        async with http.get(f"{url}/static/app.js") as r:
            assert r.status == 200 and "facecastStats" in await r.text()


@pytest.mark.parametrize("value", ["0.0.0.0"])
def test_binds_loopback_by_default(value):
    import argparse

    from realtime.server import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([])
    assert args.host == "127.0.0.1" and args.port == 8080
    assert parser.parse_args(["--host", value]).host == value
