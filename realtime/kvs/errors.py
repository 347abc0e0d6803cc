"""Typed failures of the KVS mirror. None of them ever reaches the WebRTC session.

Each carries `kind`, the short label used for the error metric and in log lines.
"""

from __future__ import annotations


class KvsError(Exception):
    kind = "error"
    retryable = True


class KvsConfigError(KvsError):
    """Bad options (stream name, fragment duration, region): fixed by the operator."""

    kind = "config"
    retryable = False


class KvsNoCredentials(KvsError):
    kind = "no_credentials"
    retryable = False


class KvsStreamNotFound(KvsError):
    kind = "stream_not_found"
    retryable = False


class KvsAccessDenied(KvsError):
    kind = "access_denied"
    retryable = False


class KvsThrottled(KvsError):
    """ClientLimitExceeded / ConnectionLimitExceeded: back off and try again."""

    kind = "throttled"


class KvsControlPlaneError(KvsError):
    kind = "control_plane"


class PutMediaHttpError(KvsError):
    """PutMedia answered with a status other than 200."""

    def __init__(self, status: int, error_type: str, message: str) -> None:
        super().__init__(f"PutMedia answered HTTP {status} {error_type}: {message}".strip())
        self.status = status
        self.error_type = error_type
        self.kind = f"http_{status}"


class PutMediaConnectionLost(KvsError):
    """The PutMedia connection dropped, ended, or stopped sending acknowledgements."""

    kind = "disconnect"
