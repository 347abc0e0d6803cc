"""Who may call the API, how long a request may take to arrive, and what logs never show.

Without a token (the default) the server serves its own page only. Any web page the local
user opens could otherwise drive it: a cross-site "simple" POST (text/plain, no preflight)
could create sessions and fill the slots, and a DNS-rebinding page (evil.example resolving
to 127.0.0.1) could read /sessions and /metrics and delete sessions. So, when no token is
set, `same_origin_guard` refuses

- a `Host` that is not the bind address, a loopback name for a loopback bind, an IP
  literal for a wildcard bind (an IP cannot be rebound), or an `--allow-host` name: 421;
- an `Origin` other than the one the `Host` names, or an `--allow-origin`: 403;
- a JSON endpoint's body that is not `Content-Type: application/json`: 415 (a browser
  cannot send that cross-site without a CORS preflight, which this server never grants).

With a token, the token is the guard (a foreign page cannot know it): nothing changes.

Incomplete requests are bounded: aiohttp closes a connection whose request headers are
not complete `header_timeout_s` after it opened or after its last response (its
keep-alive timer, which also covers a socket that never sends a byte), `read_body` gives
a body `body_timeout_s`, and an unread body is drained for at most as long. Tokens are
redacted from the access log (`?token=` in the request line or a Referer, `Bearer …`).
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from aiohttp import hdrs, web

from realtime.errors import Forbidden, MisdirectedRequest, RequestTimeout, UnsupportedMediaType

JSON_ENDPOINTS = frozenset({"/offer"})  # POST routes whose body is JSON
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::"})
DEFAULT_PORTS = {"http": 80, "https": 443}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class SecurityConfig:
    allow_origins: tuple[str, ...] = ()  # "scheme://host[:port]", or "*" for any
    allow_hosts: tuple[str, ...] = ()  # extra Host names, or "*" for any
    header_timeout_s: float = 10.0  # request line + headers, and keep-alive idle time
    body_timeout_s: float = 10.0  # a request body (the largest is a few KiB of SDP)

    def __post_init__(self) -> None:
        for name, flag in (
            ("header_timeout_s", "--header-timeout"),
            ("body_timeout_s", "--body-timeout"),
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{flag} {getattr(self, name)}: must be > 0 seconds")
        for origin in self.allow_origins:
            if origin != "*" and parse_origin(origin) is None:
                raise ValueError(
                    f"--allow-origin {origin!r} is not an origin: use scheme://host[:port], "
                    "e.g. https://avatar.example.com"
                )

    def handler_args(self) -> dict[str, float]:
        """aiohttp's per-connection limits (`web.Application(handler_args=...)`)."""
        return {"keepalive_timeout": self.header_timeout_s, "lingering_time": self.body_timeout_s}


# ---- Host and Origin -----------------------------------------------------------------


def split_host(value: str) -> tuple[str, int | None] | None:
    """A `Host` header → (lower-case name without brackets, port or None); None if bad."""
    if not value or any(c in value for c in "@/?#\\ \t"):
        return None
    try:
        parts = urlsplit("//" + value)
        port = parts.port
    except ValueError:
        return None
    return (parts.hostname, port) if parts.hostname else None


def parse_origin(value: str) -> tuple[str, str, int] | None:
    """An `Origin` → (scheme, host, port with the scheme's default); None if not one."""
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname or parts.path not in ("", "/"):
        return None
    return parts.scheme, parts.hostname, port or DEFAULT_PORTS[parts.scheme]


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class SameOriginPolicy:
    """Which `Host` names this server answers for and which `Origin`s may call it."""

    def __init__(self, bind_host: str, config: SecurityConfig) -> None:
        bind = bind_host.strip("[]").lower()
        self._any_host = "*" in config.allow_hosts
        self._any_ip = bind in WILDCARD_BINDS
        loopback = bind == "localhost" or (_is_ip(bind) and ipaddress.ip_address(bind).is_loopback)
        self._hosts = {h.strip("[]").lower() for h in config.allow_hosts}
        self._hosts |= {bind} | (set(LOOPBACK_NAMES) if loopback or self._any_ip else set())
        self._any_origin = "*" in config.allow_origins
        self._origins = {parse_origin(o) for o in config.allow_origins if o != "*"}

    def host_allowed(self, host: str) -> bool:
        parsed = split_host(host)
        if parsed is None:
            return False
        name = parsed[0]
        return self._any_host or name in self._hosts or (self._any_ip and _is_ip(name))

    def origin_allowed(self, origin: str, host: str | None) -> bool:
        parsed = parse_origin(origin)
        if parsed is None:  # "null" (sandboxed frames, file://) and anything malformed
            return False
        if self._any_origin or parsed in self._origins:
            return True
        target = split_host(host) if host else None
        if target is None:
            return False
        scheme, name, port = parsed
        return (name, port) == (target[0], target[1] or DEFAULT_PORTS[scheme])

    def check(self, request: web.Request) -> None:
        host = request.headers.get(hdrs.HOST)
        if host is not None and not self.host_allowed(host):
            raise MisdirectedRequest(
                f"this server does not answer for Host {host!r} (a DNS-rebinding page?); "
                "start it with --allow-host NAME to serve that name, or set a token"
            )
        origin = request.headers.get(hdrs.ORIGIN)
        if origin is not None and not self.origin_allowed(origin, host):
            raise Forbidden(
                f"cross-site request from Origin {origin!r} refused: without a token this "
                "server answers only its own page; allow that page with --allow-origin "
                "ORIGIN, or set a token"
            )
        if request.method == hdrs.METH_POST and request.path in JSON_ENDPOINTS:
            if request.content_type != "application/json":
                raise UnsupportedMediaType(
                    f"send the body as Content-Type: application/json "
                    f"(got {request.content_type!r})"
                )


def same_origin_guard(token: str | None, bind_host: str, config: SecurityConfig):
    """The aiohttp middleware enforcing `SameOriginPolicy` when no token is set."""
    policy = SameOriginPolicy(bind_host, config)

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not token:
            policy.check(request)
        return await handler(request)

    return guard


# ---- bodies --------------------------------------------------------------------------


async def read_body(request: web.Request, timeout_s: float) -> bytes:
    """The whole body within `timeout_s` (a bogus Content-Length or a trickle is cut off)."""
    try:
        return await asyncio.wait_for(request.read(), timeout_s)
    except asyncio.TimeoutError:
        raise RequestTimeout(
            f"the request body did not arrive within {timeout_s:g} s "
            f"(Content-Length {request.content_length})"
        ) from None


# ---- logs ----------------------------------------------------------------------------

_SECRETS = re.compile(r"(?i)(\btoken=)[^&\s\"']+|(\bbearer\s+)[^\s\"',]+")


def redact(text: str) -> str:
    """`token=…` query values and `Bearer …` credentials replaced by `REDACTED`."""
    return _SECRETS.sub(lambda m: (m.group(1) or m.group(2)) + "REDACTED", text)


class RedactSecrets(logging.Filter):
    """Rewrites records of the logger it is attached to (aiohttp's access log)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        return True


def redact_access_log(logger: logging.Logger | None = None) -> None:
    """Attach `RedactSecrets` to aiohttp's access log once (idempotent)."""
    logger = logger or logging.getLogger("aiohttp.access")
    if not any(isinstance(f, RedactSecrets) for f in logger.filters):
        logger.addFilter(RedactSecrets())


# ---- command line --------------------------------------------------------------------


def add_security_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("who may call the server")
    group.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="without a token, also accept browser requests from this page origin "
        "(scheme://host[:port]); repeatable",
    )
    group.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer for this Host name (a DNS name the server is reached by); repeatable",
    )
    group.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="close a connection whose request headers are not complete after S seconds "
        "(also the idle time of a kept-alive connection)",
    )
    group.add_argument(
        "--body-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="answer 408 and close when a request body is not complete after S seconds",
    )


def security_from_args(args: argparse.Namespace) -> SecurityConfig:
    """SecurityConfig from parsed flags; ValueError names a bad value."""
    return SecurityConfig(
        allow_origins=tuple(args.allow_origin),
        allow_hosts=tuple(args.allow_host),
        header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout,
    )
