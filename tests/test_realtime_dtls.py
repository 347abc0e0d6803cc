"""An independent WebRTC stack calls Facecast: GStreamer's webrtcbin (Debian 12, 1.22).

webrtcbin's default DTLS certificate is RSA 2048; stock aiortc accepts only ECDSA suites
and the handshake fails with "no shared cipher" (realtime/dtls.py). These tests show the
handshake with an RSA peer in memory, then a real webrtcbin peer (tests/support/gst_peer.py,
under the system Python) receiving the avatar over `POST /offer`, in VP8 and in H.264.
"""

from __future__ import annotations

import datetime

import pytest
from aiortc import RTCCertificate
from aiortc.rtcdtlstransport import SRTP_PROFILES
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from OpenSSL import SSL
from support.gstreamer import needs_gstreamer, run_gst_peer
from support.realtime import running_server

from realtime.dtls import RSA_SUITES, allow_rsa_peers
from realtime.service import SERVICE

# ---- the DTLS handshake with an RSA certificate, in memory ---------------------------


def rsa_dtls_server() -> SSL.Connection:
    """A DTLS server as webrtcbin sets one up: RSA 2048 self-signed, DTLS-SRTP."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "webrtcbin")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .sign(key, hashes.SHA256())
    )
    ctx = SSL.Context(SSL.DTLS_METHOD)
    ctx.set_verify(SSL.VERIFY_PEER, lambda *args: True)
    ctx.use_certificate(cert)
    ctx.use_privatekey(key)
    ctx.set_tlsext_use_srtp(b"SRTP_AES128_CM_SHA1_80")
    conn = SSL.Connection(ctx)
    conn.set_accept_state()
    return conn


def handshake(client: SSL.Connection, server: SSL.Connection) -> str:
    """Pump datagrams between two memory-BIO connections; the negotiated suite."""
    done = {id(client): False, id(server): False}
    for _ in range(20):
        for conn, peer in ((client, server), (server, client)):
            if not done[id(conn)]:
                try:
                    conn.do_handshake()
                    done[id(conn)] = True
                except SSL.WantReadError:
                    pass
            while True:
                try:
                    peer.bio_write(conn.bio_read(65536))
                except SSL.WantReadError:
                    break
        if all(done.values()):
            return client.get_cipher_name()
    raise AssertionError("handshake did not finish")


def aiortc_peer(create_ssl_context, server: bool = False) -> SSL.Connection:
    """aiortc's side; the client when it answers an offer (a=setup:active), as Facecast does."""
    cert = RTCCertificate.generateCertificate()
    conn = SSL.Connection(create_ssl_context(cert, srtp_profiles=SRTP_PROFILES))
    if server:
        conn.set_accept_state()
    else:
        conn.set_connect_state()
    return conn


def test_stock_aiortc_and_an_rsa_peer_share_no_cipher():
    allow_rsa_peers()
    stock = RTCCertificate._create_ssl_context.__wrapped__  # aiortc's own, unpatched
    with pytest.raises(SSL.Error, match="no shared cipher"):
        handshake(aiortc_peer(stock), rsa_dtls_server())


def test_patched_aiortc_completes_dtls_with_an_rsa_peer():
    assert allow_rsa_peers() and allow_rsa_peers()  # idempotent
    client = aiortc_peer(RTCCertificate._create_ssl_context)
    assert handshake(client, rsa_dtls_server()) in RSA_SUITES
    assert client.get_selected_srtp_profile() == b"SRTP_AES128_CM_SHA1_80"


def test_ecdsa_suites_stay_first_so_browsers_negotiate_as_before():
    allow_rsa_peers()
    stock = RTCCertificate._create_ssl_context.__wrapped__
    before = SSL.Connection(stock(RTCCertificate.generateCertificate(), SRTP_PROFILES))
    after = SSL.Connection(
        RTCCertificate._create_ssl_context(RTCCertificate.generateCertificate(), SRTP_PROFILES)
    )
    old, new = before.get_cipher_list(), after.get_cipher_list()
    assert new[: len(old)] == old and new[len(old) :] == list(RSA_SUITES)
    # An ECDSA peer (every browser, aiortc itself) still gets an ECDSA suite.
    patched = RTCCertificate._create_ssl_context
    suite = handshake(aiortc_peer(patched), aiortc_peer(patched, server=True))
    assert suite.startswith("ECDHE-ECDSA-")


# ---- a real webrtcbin peer -----------------------------------------------------------


@pytest.mark.slow  # GStreamer peer
@needs_gstreamer
@pytest.mark.timeout(240)
@pytest.mark.parametrize("codec", ["vp8", "h264"])
async def test_webrtcbin_receives_the_avatar_at_25_fps(codec):
    async with running_server() as (url, app):
        report = await run_gst_peer("offer", url, "--codec", codec, "--seconds", "8")
        size = list(app[SERVICE].video_size())
    assert report["errors"] == [], report
    assert report["connection_state"] == "connected", report
    assert report["video_encoding"] == codec.upper(), report
    # ≥ 24 fps of decoded frames over 8 s, each with a picture (not a blank frame)
    assert report["fps_window_s"] >= 7.5 and report["video_fps"] >= 24.0, report
    assert report["size"] == size and report["video_flat_frames"] == 0, report
    # the avatar's audio comes back on the same BUNDLE transport, decoded by opusdec
    assert report["audio_rate"] == 48000 and report["audio_seconds"] >= 6.0, report
