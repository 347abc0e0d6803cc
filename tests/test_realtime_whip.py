"""WHIP ingest (RFC 9725): clients that know only the RFC start, run and end a session.

The test's own client is what any WHIP publisher does, with aiohttp and aiortc and none
of Facecast's client code: POST the offer as application/sdp, take the 201's answer and
Location, DELETE the Location to hang up. GStreamer's webrtcbin does the same (tests/
gst_peer.py). Debian 12 has no `whipsink` (gst-plugins-rs is not packaged) and its
`simple-whip-client` aborts at start (libsoup2 and libnice's libsoup3 in one process).
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from urllib.parse import urljoin

import aiohttp
import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.contrib.media import MediaPlayer
from aiortc.mediastreams import AudioStreamTrack, VideoStreamTrack
from support.gstreamer import needs_gstreamer, run_gst_peer
from support.realtime import make_speech_wav, running_server, wait_until, whip_publish

from realtime.ice_servers import link_header, parse_ice_server
from realtime.service import SERVICE
from realtime.whip import WHIP_SESSIONS

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SDP = {"Content-Type": "application/sdp"}


async def json_status(http, method: str, url: str, **kw) -> tuple[int, dict]:
    async with http.request(method, url, **kw) as r:
        return r.status, await r.json()


async def live_sessions(http, url: str) -> list[dict]:
    async with http.get(f"{url}/sessions", headers=AUTH) as r:
        return (await r.json())["sessions"]


@pytest.mark.slow  # a served call for seconds
@pytest.mark.timeout(180)
async def test_whip_client_streams_a_wav_and_delete_frees_the_slot(tmp_path):
    speech = make_speech_wav(
        tmp_path / "mic.wav", [0.3, "Hello, this is a WHIP client speaking.", 0.5, "Bye.", 6.0]
    )
    async with (
        running_server(token=TOKEN, max_sessions=1) as (url, app),
        aiohttp.ClientSession() as http,
    ):
        player = MediaPlayer(str(speech.path))  # a real-time paced microphone from the WAV
        posted = time.monotonic()
        pub = await whip_publish(http, f"{url}/whip", player.audio, {**SDP, **AUTH})
        try:
            assert pub.status == 201, pub.body
            assert pub.headers["Content-Type"] == "application/sdp"
            assert re.fullmatch(r"/whip/[\w-]+", pub.headers["Location"])
            assert pub.headers["Link"] == []  # no ICE servers configured, no Link
            assert pub.body.startswith("v=0") and "a=recvonly" in pub.body
            sid = pub.location.rsplit("/", 1)[1]
            service = app[SERVICE]

            def fresh_frames() -> int:
                s = service.sessions.get(sid)
                return 0 if s is None else s.video.sent - s.video.repeated

            await wait_until(lambda: fresh_frames() > 0, 30, interval=0.02)
            ttff = time.monotonic() - posted  # from the POST, as a publisher sees it
            await wait_until(lambda: fresh_frames() >= 75, 30)  # 3 s of generated video
            [listed] = await live_sessions(http, url)
            assert listed["id"] == sid and listed["state"] == "live" and listed["ttff_ms"]
            print(f"WHIP: POST to first frame {ttff * 1000:.0f} ms", file=sys.stderr)

            # the one slot is taken: a second publisher is told to come back later
            second = await whip_publish(http, f"{url}/whip", AudioStreamTrack(), {**SDP, **AUTH})
            assert second.status == 503 and "full" in second.body

            async with http.delete(pub.location, headers=AUTH) as r:
                assert r.status == 200
            assert await live_sessions(http, url) == [] and sid not in service.sessions
            status, body = await json_status(http, "DELETE", pub.location, headers=AUTH)
            assert status == 404 and "error" in body
        finally:
            await pub.pc.close()
            player.audio.stop()

        # the slot is free again
        again = await whip_publish(http, f"{url}/whip", AudioStreamTrack(), {**SDP, **AUTH})
        try:
            assert again.status == 201, again.body
            async with http.delete(again.location, headers=AUTH) as r:
                assert r.status == 200
        finally:
            await again.pc.close()
        await wait_until(lambda: not service.sessions, 10)


@pytest.mark.timeout(120)
async def test_whip_client_that_also_sends_a_camera_is_answered_inactive_for_video():
    """OBS publishes its camera with the microphone: the avatar takes only the audio."""
    async with running_server() as (url, app), aiohttp.ClientSession() as http:
        pc = RTCPeerConnection()
        pc.addTransceiver(AudioStreamTrack(), direction="sendonly")
        pc.addTransceiver(VideoStreamTrack(), direction="sendonly")
        await pc.setLocalDescription(await pc.createOffer())
        async with http.post(f"{url}/whip", data=pc.localDescription.sdp, headers=SDP) as r:
            status, answer, location = r.status, await r.text(), r.headers.get("Location")
        try:
            assert status == 201, answer
            audio, video = answer.split("m=audio", 1)[1].split("m=video", 1)
            assert "a=recvonly" in audio and "a=inactive" in video
            await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
            [session] = app[SERVICE].sessions.values()
            await wait_until(lambda: session.video.sent - session.video.repeated >= 25, 30)
            async with http.delete(urljoin(url, location)) as r:
                assert r.status == 200
        finally:
            await pc.close()


@pytest.mark.timeout(120)
async def test_whip_client_may_trickle_its_candidates_with_patch():
    """RFC 9725 §4.3.1: the offer goes out before gathering, candidates follow by PATCH."""
    trickle = {"Content-Type": "application/trickle-ice-sdpfrag"}
    async with running_server() as (url, app), aiohttp.ClientSession() as http:
        pc = RTCPeerConnection()
        pc.addTransceiver(AudioStreamTrack(), direction="sendonly")
        await pc.setLocalDescription(await pc.createOffer())
        full = pc.localDescription.sdp
        candidates = re.findall(r"a=candidate:[^\r\n]+", full)
        early = re.sub(r"a=(candidate:[^\r\n]+|end-of-candidates)\r\n", "", full)
        async with http.post(f"{url}/whip", data=early, headers=SDP) as r:
            assert r.status == 201, await r.text()
            answer, location = await r.text(), urljoin(url, r.headers["Location"])
        try:
            ufrag = re.search(r"a=ice-ufrag:(\S+)", full)[1]
            mid = re.search(r"a=mid:(\S+)", full)[1]
            host = candidates[0]
            frag = f"a=ice-ufrag:{ufrag}\r\nm=audio 9 UDP/TLS/RTP/SAVPF 0\r\na=mid:{mid}\r\n"
            async with http.patch(location, data=frag + host + "\r\n", headers=trickle) as r:
                assert r.status == 204, await r.text()
            rest = "".join(c + "\r\n" for c in candidates[1:]) + "a=end-of-candidates\r\n"
            async with http.patch(location, data=frag + rest, headers=trickle) as r:
                assert r.status == 204, await r.text()
            [session] = app[SERVICE].sessions.values()
            ice = session.pc.getTransceivers()[0].receiver.transport.transport
            port = host.split()[5]
            assert any(c.type == "host" and str(c.port) == port for c in ice.getRemoteCandidates())

            await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
            await wait_until(lambda: session.video.sent - session.video.repeated >= 25, 30)

            # what the server does not do, it says so
            for headers, body, expected in [
                ({**trickle, "If-Match": "*"}, frag, 422),  # an ICE restart
                (trickle, frag.replace(ufrag, "other"), 422),
                (SDP, frag, 415),
                (trickle, frag + "a=candidate:1 1 udp\r\n", 400),
            ]:
                status, reply = await json_status(
                    http, "PATCH", location, data=body, headers=headers
                )
                assert status == expected and reply["error"], (headers, body, status, reply)
            status, reply = await json_status(
                http, "PATCH", f"{url}/whip/nope", data=frag, headers=trickle
            )
            assert status == 404
            async with http.delete(location) as r:
                assert r.status == 200
        finally:
            await pc.close()


def sdp_without_usable_audio_codec(sdp: str) -> str:
    """The same offer, its audio section renamed to a codec nobody supports."""
    return re.sub(r"a=rtpmap:(\d+) (opus|PCMU|PCMA|G722)/", r"a=rtpmap:\1 nonsense/", sdp)


async def offer_sdp(direction: str = "sendonly") -> str:
    pc = RTCPeerConnection()
    pc.addTransceiver(AudioStreamTrack(), direction=direction)
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    return sdp


@pytest.mark.timeout(120)
async def test_whip_refuses_bad_requests_with_a_reason_and_keeps_running():
    offer = await offer_sdp()
    async with running_server(token=TOKEN) as (url, app), aiohttp.ClientSession() as http:
        whip = f"{url}/whip"
        cases = [
            ("no token", {**SDP}, offer, 401),
            ("wrong token", {**SDP, "Authorization": "Bearer nope"}, offer, 401),
            ("JSON body", {"Content-Type": "application/json", **AUTH}, '{"sdp": 1}', 415),
            ("no content type", {**AUTH}, offer.encode(), 415),
            ("not SDP", {**SDP, **AUTH}, "hello", 400),
            ("no usable codec", {**SDP, **AUTH}, sdp_without_usable_audio_codec(offer), 400),
            ("sends no audio", {**SDP, **AUTH}, await offer_sdp("recvonly"), 400),
        ]
        for name, headers, body, expected in cases:
            status, reply = await json_status(http, "POST", whip, data=body, headers=headers)
            assert status == expected and reply["error"], (name, status, reply)
        status, reply = await json_status(http, "DELETE", f"{whip}/nope", headers=AUTH)
        assert status == 404 and "nope" in reply["error"]
        status, reply = await json_status(http, "DELETE", f"{whip}/nope")
        assert status == 401
        status, reply = await json_status(http, "PATCH", f"{whip}/nope", headers=AUTH)
        assert status == 404 and "nope" in reply["error"]
        assert not app[SERVICE].sessions and app[SERVICE].reserved == 0

        # the server still takes a good offer
        pub = await whip_publish(http, whip, AudioStreamTrack(), {**SDP, **AUTH})
        try:
            assert pub.status == 201, pub.body
            async with http.delete(pub.location, headers=AUTH) as r:
                assert r.status == 200
        finally:
            await pub.pc.close()


async def test_whip_waits_for_the_engine_with_503():
    """While the engine starts (serve listens at once), a publisher is told to retry."""
    from aiohttp import web

    from realtime.server import build_app
    from realtime.service import ServerConfig

    runner = web.AppRunner(build_app(ServerConfig(port=0), engine=None), handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        async with aiohttp.ClientSession() as http:
            status, reply = await json_status(
                http, "POST", f"http://127.0.0.1:{port}/whip", data=await offer_sdp(), headers=SDP
            )
        assert status == 503 and "starting" in reply["error"]
    finally:
        await runner.cleanup()


@pytest.mark.timeout(120)
async def test_whip_advertises_the_configured_ice_servers_in_link_headers():
    servers = [
        parse_ice_server("stun:stun.example.net:3478"),
        parse_ice_server("turn:alice:pa55@turn.example.net:3478?transport=udp"),
    ]
    async with running_server(ice_servers=servers) as (url, app), aiohttp.ClientSession() as http:
        pub = await whip_publish(http, f"{url}/whip", AudioStreamTrack(), SDP)
        try:
            assert pub.status == 201, pub.body
            assert pub.headers["Link"] == [
                '<stun:stun.example.net:3478>; rel="ice-server"',
                '<turn:turn.example.net:3478?transport=udp>; rel="ice-server"; '
                'username="alice"; credential="pa55"; credential-type="password"',
            ]
            # a WHIP session is also a session: the API may end it, and then it is gone
            sid = pub.location.rsplit("/", 1)[1]
            async with http.delete(f"{url}/sessions/{sid}") as r:
                assert r.status == 200
            assert app[WHIP_SESSIONS] == {}
            async with http.delete(pub.location) as r:
                assert r.status == 404
        finally:
            await pub.pc.close()


def test_ice_server_uris_parse_with_credentials_and_escaping():
    turn = parse_ice_server("turns://bob:x:y@turn.example.net:5349?transport=tcp")
    assert (turn.urls, turn.username, turn.credential) == (
        "turns:turn.example.net:5349?transport=tcp",
        "bob",
        "x:y",
    )
    quoted = parse_ice_server('turn:a"b:c\\d@h:1')
    assert link_header(quoted) == [
        '<turn:h:1>; rel="ice-server"; username="a\\"b"; credential="c\\\\d"; '
        'credential-type="password"'
    ]
    for bad in ["", "http://x", "stun:", "stun:u:p@host", "turn:user@host", "turn::p@host"]:
        with pytest.raises(ValueError, match="ICE server"):
            parse_ice_server(bad)


@pytest.mark.slow  # GStreamer peer
@needs_gstreamer
@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "flags",
    [[], ["--receive"], ["--trickle"]],
    ids=["sendonly", "sendrecv", "trickle"],
)
async def test_webrtcbin_publishes_over_whip(flags):
    async with running_server(token=TOKEN, max_sessions=1) as (url, app):
        args = ["whip", f"{url}/whip", "--token", TOKEN, "--seconds", "8", *flags]
        peer = asyncio.ensure_future(run_gst_peer(*args))
        service = app[SERVICE]

        def generated() -> int:  # frames the engine made and the session sent (or pulled)
            return max(
                (s.video.sent - s.video.repeated for s in service.sessions.values()), default=0
            )

        # while it publishes: the avatar is generated whether or not the client receives it
        await wait_until(lambda: peer.done() or generated() >= 50, 60)
        fresh = generated()
        remote = [
            c.type
            for s in service.sessions.values()
            for c in s.pc.getTransceivers()[0].receiver.transport.transport.getRemoteCandidates()
        ]
        report = await peer
        await wait_until(lambda: not service.sessions, 10)  # its DELETE ended the session
    assert report["errors"] == [] and report["post_status"] == 201, report
    assert report["content_type"] == "application/sdp" and report["delete_status"] == 200, report
    assert report["connection_state"] == "connected" and fresh >= 50, (report, fresh)
    assert "host" in remote, remote  # webrtcbin's candidates, from the offer or by PATCH
    if "--trickle" in flags:  # none in the offer: each came by PATCH, then end-of-candidates
        assert report["offer_candidates"] == 0, report
        assert len(report["patch_statuses"]) >= 2 and set(report["patch_statuses"]) == {204}
    if "--receive" in flags:  # the answer is sendrecv: the avatar's video and audio come back
        assert report["video_fps"] >= 24.0 and report["video_flat_frames"] == 0, report
        assert report["audio_seconds"] >= 4.0, report
    else:
        assert report["video_frames"] == 0 and report["audio_seconds"] == 0, report
