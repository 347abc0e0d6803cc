"""Without a token the server answers its own page only; tokens never reach a log; input
that broke the server before (non-UTF-8 headers, deep JSON, offers that cannot connect)
gets a 4xx with a reason."""

from __future__ import annotations

import json
import logging
import re
from urllib.parse import urlsplit

import aiohttp
import pytest
from support.realtime import make_offer, post, raw_request, running_server, status_and_json

from realtime.security import SameOriginPolicy, SecurityConfig, redact
from realtime.service import SERVICE

JSON = {"Content-Type": "application/json"}


async def test_cross_site_posts_and_rebinding_pages_are_refused():
    async with running_server() as (url, app), aiohttp.ClientSession() as http:
        sdp = await make_offer()
        offer = json.dumps({"sdp": sdp, "type": "offer"})
        host = urlsplit(url).netloc
        # A foreign page's "simple" POST: text/plain needs no CORS preflight.
        async with http.post(
            f"{url}/offer",
            data=offer,
            headers={"Content-Type": "text/plain", "Origin": "https://evil.example"},
        ) as r:
            assert r.status == 403 and "Origin" in (await r.json())["error"]
        async with http.post(f"{url}/offer", data=offer, headers={**JSON, "Origin": "null"}) as r:
            assert r.status == 403
        # No Origin (curl, an agent) but not labelled JSON: refused too.
        async with http.post(
            f"{url}/offer", data=offer, headers={"Content-Type": "text/plain"}
        ) as r:
            assert r.status == 415 and "application/json" in (await r.json())["error"]
        # A DNS-rebinding page: the browser sends the attacker's name as Host.
        for method, path in [("GET", "/sessions"), ("GET", "/metrics"), ("DELETE", "/sessions/x")]:
            headers = {"Host": "evil.example:8080"}
            async with http.request(method, url + path, headers=headers) as r:
                assert r.status == 421, (method, path)
                assert "--allow-host" in (await r.json())["error"]
        async with http.get(url + "/", headers={"Host": "evil.example"}) as r:
            assert r.status == 421
        assert app[SERVICE].sessions == {} and app[SERVICE].reserved == 0
        # The page itself (same origin) still gets through to the offer's own checks.
        headers = {**JSON, "Origin": f"http://{host}"}
        status, body = await post(http, f"{url}/offer", {"sdp": "v=0", "type": "x"}, headers)
        assert status == 400 and "type" in body["error"]
        async with http.get(f"{url}/sessions", headers={"Host": f"localhost:{host[-5:]}"}) as r:
            assert r.status == 200


async def test_allow_lists_and_tokens_open_the_gate():
    security = SecurityConfig(
        allow_origins=("https://app.example",), allow_hosts=("avatar.example",)
    )
    async with running_server(security=security) as (url, _), aiohttp.ClientSession() as http:
        headers = {**JSON, "Origin": "https://app.example", "Host": "avatar.example"}
        status, body = await post(http, f"{url}/offer", {"sdp": "v=0", "type": "x"}, headers)
        assert status == 400 and "type" in body["error"]
        async with http.get(f"{url}/healthz", headers={"Origin": "https://other.example"}) as r:
            assert r.status == 403
    # With a token the token is the guard: same behaviour as before, whatever the headers.
    async with running_server(token="s3cret") as (url, _), aiohttp.ClientSession() as http:
        headers = {
            "Authorization": "Bearer s3cret",
            "Origin": "https://evil.example",
            "Host": "evil.example",
        }
        async with http.get(f"{url}/healthz", headers=headers) as r:
            assert r.status == 200
        async with http.post(f"{url}/offer", data="{}", headers=headers) as r:
            assert r.status == 400  # text/plain JSON still read, as before


@pytest.mark.parametrize(
    ("bind", "host", "ok"),
    [
        ("127.0.0.1", "127.0.0.1:8080", True),
        ("127.0.0.1", "localhost:8080", True),
        ("127.0.0.1", "[::1]:8080", True),
        ("127.0.0.1", "evil.example:8080", False),
        ("127.0.0.1", "127.0.0.1.evil.example", False),
        ("0.0.0.0", "192.168.1.5:8080", True),  # an IP literal cannot be rebound
        ("0.0.0.0", "[fe80::1]:8080", True),
        ("0.0.0.0", "evil.example", False),
        ("192.168.1.5", "192.168.1.6", False),
        ("127.0.0.1", "a@127.0.0.1", False),
        ("127.0.0.1", "", False),
    ],
)
def test_host_names_the_server_answers_for(bind, host, ok):
    assert SameOriginPolicy(bind, SecurityConfig()).host_allowed(host) is ok


def test_same_origin_compares_scheme_default_ports():
    policy = SameOriginPolicy("0.0.0.0", SecurityConfig())
    assert policy.origin_allowed("http://10.0.0.2:8080", "10.0.0.2:8080")
    assert policy.origin_allowed("https://10.0.0.2", "10.0.0.2:443")  # behind a TLS proxy
    assert not policy.origin_allowed("http://10.0.0.2:8081", "10.0.0.2:8080")
    assert not policy.origin_allowed("http://10.0.0.2", None)
    assert not policy.origin_allowed("file://", "10.0.0.2")
    with pytest.raises(ValueError, match="scheme://host"):
        SecurityConfig(allow_origins=("app.example",))


async def test_the_access_log_never_shows_a_token(caplog):
    caplog.set_level(logging.INFO, logger="aiohttp.access")
    async with running_server(token="s3cret") as (url, _), aiohttp.ClientSession() as http:
        referer = {"Referer": f"{url}/?autostart=1&token=s3cret"}
        async with http.get(f"{url}/?token=s3cret&autostart=1", headers=referer) as r:
            assert r.status == 200
        async with http.get(f"{url}/healthz", headers={"Authorization": "Bearer s3cret"}) as r:
            assert r.status == 200
    lines = [r.getMessage() for r in caplog.records if r.name == "aiohttp.access"]
    assert len(lines) == 2 and all("s3cret" not in line for line in lines), lines
    assert "token=REDACTED" in lines[0]
    assert redact("Authorization: Bearer abc.def") == "Authorization: Bearer REDACTED"


async def test_a_non_utf8_authorization_header_is_a_401_not_a_500():
    async with running_server(token="s3cret") as (url, _):
        raw = await raw_request(
            url,
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Authorization: Bearer \xff\xfe\r\n\r\n",
        )
    status, body = status_and_json(raw)
    assert status == 401 and "token" in body["error"]


async def test_deeply_nested_json_is_a_400_not_a_500():
    async with running_server() as (url, _), aiohttp.ClientSession() as http:
        status, body = await post(http, f"{url}/offer", b"[" * 100_000 + b"]" * 100_000)
        assert status == 413
        status, body = await post(http, f"{url}/offer", b"[" * 30_000 + b"]" * 30_000)
        assert status == 400 and "nested too deeply" in body["error"]


def without(sdp: str, *prefixes: str) -> str:
    return "".join(line for line in sdp.splitlines(keepends=True) if not line.startswith(prefixes))


async def test_offers_that_could_never_connect_take_no_slot():
    async with running_server(max_sessions=1) as (url, app), aiohttp.ClientSession() as http:
        sdp = await make_offer()
        cases = {
            "ICE credentials": without(sdp, "a=ice-ufrag", "a=ice-pwd"),
            "ice-pwd": re.sub(r"a=ice-pwd:\S+", "a=ice-pwd:short", sdp),
            "DTLS fingerprint": without(sdp, "a=fingerprint"),
            "unusable fingerprint": re.sub(r"a=fingerprint:(\S+) \S+", r"a=fingerprint:\1 zz", sdp),
            "does not parse": "v=0\r\nm=audio\r\n",
        }
        for reason, bad in cases.items():
            status, body = await post(http, f"{url}/offer", {"sdp": bad, "type": "offer"})
            assert status == 400 and reason in body["error"], (reason, body)
            assert not body["error"].endswith(": "), body
        assert "AssertionError" in body["error"]  # aiortc's parser gives no message
        assert app[SERVICE].sessions == {} and app[SERVICE].reserved == 0


async def test_kvs_stream_names_with_a_trailing_newline_are_refused():
    from realtime.kvs import KvsOptions

    async with running_server(kvs=KvsOptions(stream="facecast")) as (url, app):
        async with aiohttp.ClientSession() as http:
            body = {"sdp": await make_offer(), "type": "offer", "kvs_stream": "show\n"}
            status, reply = await post(http, f"{url}/offer", body)
            assert status == 400 and "stream name" in reply["error"]
        assert app[SERVICE].sessions == {}


async def test_unknown_routes_and_methods_answer_json():
    async with running_server() as (url, _), aiohttp.ClientSession() as http:
        async with http.get(f"{url}/nope") as r:
            assert r.status == 404 and r.content_type == "application/json"
            assert "/nope" in (await r.json())["error"]
        async with http.put(f"{url}/offer") as r:
            assert r.status == 405 and r.headers["Allow"] == "POST"
            assert "POST" in (await r.json())["error"]
        async with http.get(f"{url}/static/missing.js") as r:
            assert r.status == 404 and r.content_type == "application/json"


def test_serve_flags_set_the_allow_lists_and_timeouts():
    import argparse

    from realtime.server import add_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    flags = ["--allow-origin", "https://a.example", "--allow-origin", "https://b.example:8443"]
    flags += ["--allow-host", "avatar.example", "--header-timeout", "5", "--body-timeout", "3"]
    security = config_from_args(parser.parse_args(flags)).security
    assert security.allow_origins == ("https://a.example", "https://b.example:8443")
    assert security.allow_hosts == ("avatar.example",)
    assert (security.header_timeout_s, security.body_timeout_s) == (5.0, 3.0)
    with pytest.raises(ValueError, match="--body-timeout 0.0: must be > 0"):
        config_from_args(parser.parse_args(["--body-timeout", "0"]))
