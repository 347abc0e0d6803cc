"""KVS control plane against moto: find or create the stream, the PutMedia endpoint."""

from __future__ import annotations

import logging

import pytest
from botocore.stub import Stubber

from realtime.kvs.control import KvsControlPlane, clear_client_cache
from realtime.kvs.errors import (
    KvsAccessDenied,
    KvsNoCredentials,
    KvsStreamNotFound,
    KvsThrottled,
)
from realtime.kvs.options import KvsOptions

REGION = "eu-west-1"


def control(stream: str = "show", **options) -> KvsControlPlane:
    return KvsControlPlane(KvsOptions(stream=stream, region=REGION, **options), stream)


def test_creates_a_missing_stream_with_retention_when_asked(aws):
    info = control(create=True, retention_hours=48).ensure_stream()
    assert info.created and info.name == "show" and info.retention_hours == 48
    again = control(create=True).ensure_stream()  # now it exists: found, not re-created
    assert not again.created and again.arn == info.arn


def test_unknown_stream_without_create_names_the_fix(aws):
    with pytest.raises(KvsStreamNotFound, match="--kvs-create"):
        control().ensure_stream()


def test_stream_without_retention_is_accepted_with_a_warning(aws, caplog):
    plane = control()
    plane._client.create_stream(StreamName="show", DataRetentionInHours=0)  # made elsewhere
    with caplog.at_level(logging.WARNING):
        assert plane.ensure_stream().retention_hours == 0
    assert "retention 0" in caplog.text


def test_data_endpoint_is_cached_then_refreshed(aws, monkeypatch):
    plane = control(create=True, endpoint_refresh_s=3600)
    plane.ensure_stream()
    calls = []
    real = plane._client.get_data_endpoint
    monkeypatch.setattr(
        plane._client, "get_data_endpoint", lambda **kw: calls.append(kw) or real(**kw)
    )
    first = plane.data_endpoint()
    assert first.startswith("https://") and plane.data_endpoint() == first
    assert calls == [{"StreamName": "show", "APIName": "PUT_MEDIA"}]
    plane._endpoint_at -= 3601  # 45 minutes (here: an hour) later
    plane.data_endpoint()
    assert len(calls) == 2


def test_endpoint_override_skips_get_data_endpoint(aws):
    plane = control(endpoint_url="http://127.0.0.1:9/")
    assert plane.data_endpoint() == "http://127.0.0.1:9"


def test_no_credentials(aws, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    clear_client_cache()
    plane = control()
    with pytest.raises(KvsNoCredentials, match="no AWS credentials"):
        plane.credentials()
    with pytest.raises(KvsNoCredentials):
        plane.ensure_stream()


@pytest.mark.parametrize(
    ("code", "status", "error"),
    [
        ("AccessDeniedException", 403, KvsAccessDenied),
        ("NotAuthorizedException", 401, KvsAccessDenied),
        ("ClientLimitExceededException", 400, KvsThrottled),
    ],
)
def test_aws_errors_become_typed_errors_that_say_what_to_do(aws, code, status, error):
    plane = control()
    with Stubber(plane._client) as stub:  # moto cannot deny or throttle: stub the answer
        stub.add_client_error("describe_stream", code, "nope", status)
        with pytest.raises(error) as caught:
            plane.ensure_stream()
    if error is KvsAccessDenied:
        assert "kinesisvideo:DescribeStream" in str(caught.value)
