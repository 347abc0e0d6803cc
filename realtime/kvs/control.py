"""KVS control plane through boto3: find or create the stream, find the PutMedia endpoint.

Blocking (boto3): the mirror calls these from a thread, never on the event loop.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import boto3
import botocore.config
import botocore.credentials
import botocore.exceptions

from realtime.kvs.errors import (
    KvsAccessDenied,
    KvsConfigError,
    KvsControlPlaneError,
    KvsError,
    KvsNoCredentials,
    KvsStreamNotFound,
    KvsThrottled,
)
from realtime.kvs.options import KvsOptions

log = logging.getLogger(__name__)

ACCESS_DENIED_CODES = {
    "AccessDeniedException",
    "NotAuthorizedException",
    "UnrecognizedClientException",
    "InvalidSignatureException",
    "ExpiredTokenException",
}
THROTTLED_CODES = {"ClientLimitExceededException", "ConnectionLimitExceededException"}
MEDIA_TYPE = "video/h264,audio/aac"


@dataclass(frozen=True)
class StreamInfo:
    name: str
    arn: str
    retention_hours: int
    created: bool


class KvsControlPlane:
    """One stream's control plane; caches the data endpoint for `endpoint_refresh_s`."""

    def __init__(self, options: KvsOptions, stream_name: str) -> None:
        self._options = options
        self.stream_name = stream_name
        self._session, self._client = _shared_client(options.region)
        self.region: str = self._client.meta.region_name
        self._endpoint: str | None = None
        self._endpoint_at = 0.0

    def credentials(self) -> botocore.credentials.ReadOnlyCredentials:
        """Current credentials from the standard chain (refreshed when they expire)."""
        credentials = self._session.get_credentials()
        if credentials is None:
            raise KvsNoCredentials(
                "no AWS credentials found (env, shared config, SSO, container or instance "
                "role); KVS mirroring is off for this session"
            )
        return credentials.get_frozen_credentials()

    def ensure_stream(self) -> StreamInfo:
        """Describe the stream; create it when missing and `--kvs-create` was given."""
        try:
            info = self._describe()
            created = False
        except KvsStreamNotFound:
            if not self._options.create:
                raise KvsStreamNotFound(
                    f"KVS stream {self.stream_name!r} does not exist in {self.region}; "
                    "create it or pass --kvs-create"
                ) from None
            info = self._create()
            created = True
        if info.retention_hours == 0:
            log.warning(
                "KVS stream %s keeps no data (retention 0): fragments are final when "
                "RECEIVED, and HLS playback will not work",
                self.stream_name,
            )
        return StreamInfo(info.name, info.arn, info.retention_hours, created)

    def data_endpoint(self, force_refresh: bool = False) -> str:
        """The PutMedia endpoint, from GetDataEndpoint at most every `endpoint_refresh_s`."""
        if self._options.endpoint_url:
            return self._options.endpoint_url.rstrip("/")
        age = time.monotonic() - self._endpoint_at
        if force_refresh or self._endpoint is None or age > self._options.endpoint_refresh_s:
            response = self._call(
                self._client.get_data_endpoint, StreamName=self.stream_name, APIName="PUT_MEDIA"
            )
            self._endpoint = response["DataEndpoint"].rstrip("/")
            self._endpoint_at = time.monotonic()
        return self._endpoint

    def _describe(self) -> StreamInfo:
        stream = self._call(self._client.describe_stream, StreamName=self.stream_name)
        info = stream["StreamInfo"]
        return StreamInfo(
            info["StreamName"], info["StreamARN"], int(info.get("DataRetentionInHours", 0)), False
        )

    def _create(self) -> StreamInfo:
        log.info(
            "creating KVS stream %s in %s (retention %d h)",
            self.stream_name,
            self.region,
            self._options.retention_hours,
        )
        try:
            self._call(
                self._client.create_stream,
                StreamName=self.stream_name,
                DataRetentionInHours=self._options.retention_hours,
                MediaType=MEDIA_TYPE,
            )
        except KvsControlPlaneError as exc:
            if "ResourceInUseException" not in str(exc):
                raise  # someone else creating it at the same moment is fine
        return self._wait_active()

    def _wait_active(self, timeout_s: float = 30.0) -> StreamInfo:
        deadline = time.monotonic() + timeout_s
        while True:
            stream = self._call(self._client.describe_stream, StreamName=self.stream_name)
            info = stream["StreamInfo"]
            if info.get("Status") == "ACTIVE":
                return StreamInfo(
                    info["StreamName"], info["StreamARN"], int(info["DataRetentionInHours"]), True
                )
            if time.monotonic() > deadline:
                raise KvsControlPlaneError(
                    f"KVS stream {self.stream_name} still {info.get('Status')} after {timeout_s} s"
                )
            time.sleep(1.0)  # blocking on purpose: this runs in a worker thread

    def _call(self, method, **kwargs):
        try:
            return method(**kwargs)
        except botocore.exceptions.NoCredentialsError as exc:
            raise KvsNoCredentials(f"no AWS credentials found: {exc}") from exc
        except botocore.exceptions.ClientError as exc:
            raise _from_client_error(exc, self.stream_name) from exc
        except botocore.exceptions.BotoCoreError as exc:
            raise KvsControlPlaneError(f"KVS control plane unreachable: {exc}") from exc


_CLIENTS: dict[str | None, tuple[boto3.session.Session, Any]] = {}
_CLIENTS_LOCK = threading.Lock()


def _shared_client(region: str | None) -> tuple[boto3.session.Session, Any]:
    """One boto3 session and client per region for the process: building one costs
    ~100 ms of CPU under the GIL, too much to pay again for every WebRTC session."""
    with _CLIENTS_LOCK:
        if region not in _CLIENTS:
            try:
                session = boto3.session.Session(region_name=region)
                client = session.client(
                    "kinesisvideo",
                    config=botocore.config.Config(retries={"max_attempts": 3, "mode": "standard"}),
                )
            except botocore.exceptions.NoRegionError as exc:
                raise KvsConfigError(
                    "no AWS region for KVS: pass --kvs-region or set AWS_REGION"
                ) from exc
            _CLIENTS[region] = (session, client)
        return _CLIENTS[region]


def clear_client_cache() -> None:
    """Forget the shared clients (their cached credentials): after AWS config changes."""
    with _CLIENTS_LOCK:
        _CLIENTS.clear()


def _from_client_error(exc: botocore.exceptions.ClientError, stream: str) -> KvsError:
    code = exc.response.get("Error", {}).get("Code", "")
    message = exc.response.get("Error", {}).get("Message", "")
    if code == "ResourceNotFoundException":
        return KvsStreamNotFound(f"KVS stream {stream!r} not found: {message}")
    if code in ACCESS_DENIED_CODES:
        return KvsAccessDenied(
            f"access denied to KVS stream {stream!r} ({code}): {message}; the role needs "
            "kinesisvideo:DescribeStream, GetDataEndpoint, PutMedia (and CreateStream "
            "with --kvs-create)"
        )
    if code in THROTTLED_CODES:
        return KvsThrottled(f"KVS throttled the control plane ({code}): {message}")
    return KvsControlPlaneError(f"KVS control plane error {code}: {message}")
