"""DTLS interoperability: let the server's peers complete a handshake with RSA certificates.

aiortc makes an ECDSA (P-256) certificate and limits its DTLS 1.2 cipher list to
ECDHE-ECDSA suites. Facecast's server answers offers with `a=setup:active`, so aiortc is
the DTLS *client*, and its cipher list tells the peer (the DTLS server) which kind of
certificate it accepts: only ECDSA. Browsers use ECDSA certificates and are fine; GStreamer
1.22's `webrtcbin` (Debian 12) uses an RSA 2048 certificate by default, finds no suite
it can sign for, and the handshake fails with "no shared cipher" (aiortc PR #1392, issues
#1421 and #1434 report the same).

`allow_rsa_peers()` appends the ECDHE-RSA AES-GCM suites to the list aiortc builds. aiortc's
own suites stay first, so a browser negotiates exactly what it did before; the added suites
are forward-secret AEAD ones, no weaker than those already on the list (which has CBC-SHA1).
aiortc has no public hook for its SSL context, so this wraps `RTCCertificate.
_create_ssl_context` once per process (it affects every aiortc peer in the process); if a
future aiortc renames it, the server logs a warning and runs as before.
"""

from __future__ import annotations

import functools
import logging

from aiortc import RTCCertificate
from OpenSSL import SSL

# What webrtcbin's RSA certificate can sign for, strongest first.
RSA_SUITES = ("ECDHE-RSA-AES128-GCM-SHA256", "ECDHE-RSA-AES256-GCM-SHA384")
_MARK = "_facecast_allows_rsa"
log = logging.getLogger(__name__)


def allow_rsa_peers() -> bool:
    """Extend aiortc's DTLS cipher list with `RSA_SUITES` (idempotent); True once applied."""
    original = getattr(RTCCertificate, "_create_ssl_context", None)
    if original is None:
        log.warning(
            "aiortc has no RTCCertificate._create_ssl_context: peers with RSA certificates "
            "(GStreamer webrtcbin) will fail DTLS with 'no shared cipher'"
        )
        return False
    if getattr(original, _MARK, False):
        return True

    suites: list[bytes] = []  # aiortc's list plus ours, read once from a first context

    @functools.wraps(original)
    def create_ssl_context(self: RTCCertificate, *args: object, **kwargs: object) -> SSL.Context:
        if not suites:
            # pyOpenSSL freezes a context once a Connection reads it: read a spare one.
            suites.append(cipher_list(original(self, *args, **kwargs)))
        ctx = original(self, *args, **kwargs)
        ctx.set_cipher_list(suites[0])
        return ctx

    setattr(create_ssl_context, _MARK, True)
    setattr(RTCCertificate, "_create_ssl_context", create_ssl_context)  # noqa: B010 - a patch, not an attribute
    return True


def cipher_list(ctx: SSL.Context) -> bytes:
    """The context's DTLS 1.2 suites in their order, then the RSA ones it lacks.

    Reading the list freezes `ctx` (pyOpenSSL): pass a context that is not used after."""
    # get_cipher_list also names the TLS 1.3 suites, which DTLS 1.2 never uses and
    # set_cipher_list does not take.
    names = [n for n in SSL.Connection(ctx).get_cipher_list() if not n.startswith("TLS_")]
    names += [suite for suite in RSA_SUITES if suite not in names]
    return ":".join(names).encode()
