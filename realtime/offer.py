"""An offer as a client sends it: the JSON body of POST /offer, the checks on its SDP
that refuse, with a reason, what could never connect, and the check on our answer."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from aiohttp import web
from aiortc import RTCSessionDescription
from aiortc.codecs import CODECS
from aiortc.sdp import SessionDescription

from pipeline.families import family_of
from pipeline.stream import Reference
from realtime.errors import BadRequest
from realtime.kvs import KvsConfigError
from realtime.kvs.options import check_stream_name
from realtime.security import read_body
from realtime.service import CONFIG, Service

OFFER_OPTIONS = {"sdp", "type", "seed", "kvs_stream", "photo_id", "photo", "face_box", "prompt"}
PROMPT_CHARS = 2000  # umT5 reads 512 tokens at most; a prompt is a sentence or a paragraph


def check_codecs(sdp: str) -> None:
    """Refuse early, with a reason, when the offer shares no codec with aiortc."""
    try:
        desc = SessionDescription.parse(sdp)
    except Exception as exc:
        raise BadRequest(f"the offer's SDP does not parse: {reason_of(exc)}") from exc
    for media in desc.media:
        if media.kind not in ("audio", "video"):
            continue
        ours = {c.mimeType.lower() for c in CODECS[media.kind]} - {"video/rtx"}
        theirs = {f"{media.kind}/{c.name}".lower() for c in media.rtp.codecs}
        if not ours & theirs:
            raise BadRequest(
                f"no common {media.kind} codec: the offer has {sorted(theirs)}, this server "
                f"supports {sorted(ours)}"
            )


ICE_CHARS = re.compile(r"[A-Za-z0-9+/]+")  # RFC 8839 ice-char
FINGERPRINT = re.compile(r"([0-9A-Fa-f]{2}:)*[0-9A-Fa-f]{2}")
HASHES = {"sha-1", "sha-224", "sha-256", "sha-384", "sha-512"}


def check_offer_transport(sdp: str) -> None:
    """Refuse, before a slot is taken, an offer that could never connect: every media
    section needs ICE credentials (RFC 8839: ufrag of 4+, pwd of 22+ ice-chars) and a DTLS
    certificate fingerprint (RFC 8122), at session or media level."""
    try:
        desc = SessionDescription.parse(sdp)
    except Exception as exc:
        raise BadRequest(f"the offer's SDP does not parse: {reason_of(exc)}") from exc
    for media in desc.media:
        where = f"the offer's {media.kind} section"
        ice = media.ice
        ufrag, pwd = (ice.usernameFragment, ice.password) if ice else (None, None)
        if not ufrag or not pwd:
            raise BadRequest(f"{where} has no ICE credentials (a=ice-ufrag and a=ice-pwd)")
        if not (4 <= len(ufrag) <= 256 and 22 <= len(pwd) <= 256):
            raise BadRequest(f"{where}: ice-ufrag needs 4-256 and ice-pwd 22-256 characters")
        if not (ICE_CHARS.fullmatch(ufrag) and ICE_CHARS.fullmatch(pwd)):
            raise BadRequest(f"{where}: ice-ufrag and ice-pwd may use only A-Z a-z 0-9 + /")
        prints = media.dtls.fingerprints if media.dtls else []
        if not prints:
            raise BadRequest(f"{where} has no DTLS fingerprint (a=fingerprint:sha-256 ...)")
        for fp in prints:
            if fp.algorithm.lower() not in HASHES or not FINGERPRINT.fullmatch(fp.value):
                raise BadRequest(
                    f"{where} has an unusable fingerprint {fp.algorithm} {fp.value[:100]!r}"
                )


def reason_of(exc: BaseException) -> str:
    """An exception's message, or its type when it has none (aiortc's SDP parser raises
    bare AssertionErrors on malformed lines)."""
    return str(exc) or f"{type(exc).__name__} on a malformed line"


def check_answer(sdp: str) -> None:
    """aiortc rejects a media section it shares no codec with by giving it port 0."""
    for line in sdp.splitlines():
        if line.startswith(("m=audio 0 ", "m=video 0 ")):
            kind = line[2:7]
            raise BadRequest(f"no common {kind} codec: offer Opus (audio) and VP8 or H264 (video)")


async def json_body(request: web.Request) -> dict:
    raw = await read_body(request, request.app[CONFIG].security.body_timeout_s)
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"body is not JSON: {exc}") from exc
    except RecursionError:
        raise BadRequest("body is not usable JSON: nested too deeply") from None
    if not isinstance(body, dict):
        raise BadRequest("body must be a JSON object")
    return body


@dataclass
class OfferRequest:
    description: RTCSessionDescription
    seed: int = 0
    kvs_stream: str | None = None  # this session's KVS stream name (mirroring servers)
    photo: Reference | None = (
        None  # the session's own checked photo (realtime/photos.py); None: the server's
    )
    prompt: str | None = None  # what the video shows, for a model that reads a prompt


def prompt_refusal(service: Service) -> str | None:
    """None when the server's model reads a prompt, else why an offer's is refused."""
    cfg = service.warm_engine().cfg
    if family_of(cfg).prompts:
        return None
    return f"this server's model ({cfg.name}) reads no prompt; only --model liveavatar does"


def parse_offer(body: dict, kvs: bool, prompts: str | None = None) -> OfferRequest:
    """The offer's fields, checked. `prompts`: None when the server's model reads prompts,
    else why an offer's "prompt" is refused."""
    unknown = set(body) - OFFER_OPTIONS
    if unknown:
        raise BadRequest(f"unknown fields {sorted(unknown)}; allowed: {sorted(OFFER_OPTIONS)}")
    sdp, kind, seed = body.get("sdp"), body.get("type"), body.get("seed", 0)
    if not isinstance(sdp, str) or not sdp.startswith("v=0"):
        raise BadRequest("'sdp' must be the offer's SDP text (starting with 'v=0')")
    if kind != "offer":
        raise BadRequest("'type' must be 'offer'")
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**31:
        raise BadRequest("'seed' must be an integer in [0, 2**31)")
    if "m=audio" not in sdp:
        raise BadRequest(
            "the offer has no audio track: add the microphone (or an audio "
            "transceiver) before creating the offer"
        )
    check_offer_transport(sdp)
    stream = body.get("kvs_stream")
    if stream is not None:
        if not kvs:
            raise BadRequest(
                "'kvs_stream' given, but this server does not mirror to KVS "
                "(start it with --kvs-stream)"
            )
        try:
            check_stream_name(stream if isinstance(stream, str) else "")
        except KvsConfigError as exc:
            raise BadRequest(str(exc)) from exc
    prompt = body.get("prompt")
    if prompt is not None:
        if prompts is not None:
            raise BadRequest(f"'prompt' given, but {prompts}")
        if not isinstance(prompt, str) or not prompt.strip() or len(prompt) > PROMPT_CHARS:
            raise BadRequest(f"'prompt' must be text of 1 to {PROMPT_CHARS} characters")
    return OfferRequest(RTCSessionDescription(sdp=sdp, type="offer"), seed, stream, prompt=prompt)
