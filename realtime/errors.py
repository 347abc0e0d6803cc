"""Typed exceptions for user-facing failures of the real-time service.

Each carries an HTTP status so the server maps it to a response in one place; messages say
what was wrong and how to fix it.
"""

from __future__ import annotations


class RealtimeError(Exception):
    """Base class: a failure the peer or operator should be told about."""

    status: int = 500


class BadRequest(RealtimeError):
    """The request body or the SDP offer cannot be used (HTTP 400)."""

    status = 400


class Unauthorized(RealtimeError):
    """Missing or wrong `Authorization: Bearer …` token (HTTP 401)."""

    status = 401


class SessionNotFound(RealtimeError):
    """No live session has this id (HTTP 404)."""

    status = 404


class ServerFull(RealtimeError):
    """All `--max-sessions` slots are taken (HTTP 503)."""

    status = 503


class EngineStarting(RealtimeError):
    """The engine is still loading or warming up (HTTP 503): try again shortly."""

    status = 503


class SessionClosed(RealtimeError):
    """An operation was attempted on a session that has already closed."""

    status = 409


class Forbidden(RealtimeError):
    """A cross-site request to a server without a token (HTTP 403)."""

    status = 403


class RequestTimeout(RealtimeError):
    """The request body did not arrive in time (HTTP 408)."""

    status = 408


class UnsupportedMediaType(RealtimeError):
    """The body has the wrong Content-Type: a JSON endpoint sent something that is not
    `application/json`, a WHIP offer not sent as `application/sdp` (HTTP 415)."""

    status = 415


class Unprocessable(RealtimeError):
    """A well-formed request the server does not act on, e.g. a WHIP ICE restart
    (HTTP 422)."""

    status = 422


class MisdirectedRequest(RealtimeError):
    """The `Host` header names a server this one is not (HTTP 421): DNS rebinding."""

    status = 421


class WorkerUnavailable(RealtimeError):
    """A fleet worker did not answer in time, or is gone (HTTP 503): the front never waits
    on a dead worker."""

    status = 503
