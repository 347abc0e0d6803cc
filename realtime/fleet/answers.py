"""A worker's answers as values, and back into the server's errors on the front.

A failure the caller should hear about (no such session, full, a bad offer) crosses Ray as
`{"error": reason, "status": http_status}` (`failure`), never as a Ray exception, so that
Ray's own errors always mean the worker itself is gone or unreachable. The front raises it
again as the error the server would have raised (`answer_of`), and answers it the same way.
"""

from __future__ import annotations

from realtime.errors import (
    BadRequest,
    RealtimeError,
    ServerFull,
    SessionClosed,
    SessionNotFound,
)

ERRORS = {400: BadRequest, 404: SessionNotFound, 409: SessionClosed, 503: ServerFull}


def failure(exc: RealtimeError) -> dict:
    return {"error": str(exc), "status": exc.status}


def error_from(answer: dict) -> RealtimeError:
    """A worker's `{"error", "status"}` as the error the server would have raised."""
    exc = ERRORS.get(answer["status"], RealtimeError)(answer["error"])
    exc.status = answer["status"]
    return exc


def answer_of(answer: dict) -> dict:
    """A worker's answer, or the error it carries raised."""
    if "error" in answer:
        raise error_from(answer)
    return answer
