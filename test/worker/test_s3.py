"""The signed S3 store against a real S3 server (moto), and its URLs."""

from __future__ import annotations

import datetime
from urllib.parse import urlsplit

import botocore.auth
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from yarl import URL

from image_crawler.config import ConfigError, S3Settings
from test.harness.services import free_port, get_object, list_keys
from worker.sinks.base import DependencyError
from worker.sinks.s3 import SignedS3Store, object_url


@pytest.fixture
async def store(s3_server, s3_bucket, monkeypatch):
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    settings = S3Settings(bucket=s3_bucket, endpoint_url=s3_server.endpoint_url, region="us-east-1")
    opened = await SignedS3Store.open(settings)
    try:
        yield opened
    finally:
        await opened.close()


async def test_a_put_lands_byte_for_byte_and_twice_is_harmless(store, s3_server, s3_bucket):
    await store.put("a.jpg", b"first")
    await store.put("a.jpg", b"\xff\xd8 second")
    assert get_object(s3_server.endpoint_url, s3_bucket, "a.jpg") == b"\xff\xd8 second"


@pytest.mark.parametrize("key", ["with space.jpg", "plus+and%.jpg", "ünï©ødé.jpg", "a~b_c-d.jpg"])
async def test_keys_that_need_quoting_are_signed_and_stored_as_given(
    store, s3_server, s3_bucket, key
):
    await store.put(key, b"data")
    assert list_keys(s3_server.endpoint_url, s3_bucket) == {key}


async def test_a_missing_bucket_is_a_dependency_error_with_the_answer(s3_server, monkeypatch):
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    settings = S3Settings(bucket="no-such-bucket-here", endpoint_url=s3_server.endpoint_url)
    store = await SignedS3Store.open(settings)
    try:
        with pytest.raises(DependencyError, match="NoSuchBucket") as caught:
            await store.put("a.jpg", b"data")
        assert caught.value.retriable
    finally:
        await store.close()


async def test_a_server_that_is_not_there_is_a_dependency_error(s3_server, monkeypatch):
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    settings = S3Settings(bucket="b", endpoint_url=f"http://127.0.0.1:{free_port()}")
    store = await SignedS3Store.open(settings)
    try:
        with pytest.raises(DependencyError, match="s3"):
            await store.put("a.jpg", b"data")
    finally:
        await store.close()


async def test_no_credentials_anywhere_is_a_config_error(monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(ConfigError, match="AWS_ACCESS_KEY_ID"):
        await SignedS3Store.open(S3Settings())


@pytest.mark.parametrize(
    ("settings", "url"),
    [
        (
            S3Settings(bucket="thumbs", endpoint_url="http://minio:9000/"),
            "http://minio:9000/thumbs/k%20ey.jpg",
        ),
        (
            S3Settings(bucket="thumbs", region="eu-west-1"),
            "https://thumbs.s3.eu-west-1.amazonaws.com/k%20ey.jpg",
        ),
        (S3Settings(bucket="my.thumbs"), "https://s3.us-east-1.amazonaws.com/my.thumbs/k%20ey.jpg"),
    ],
)
def test_object_urls(settings, url):
    assert object_url(settings, "k ey.jpg") == url


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        (S3Settings(bucket="thumbs", endpoint_url="http://127.0.0.1:9000"), "plus+and%.jpg"),
        (S3Settings(bucket="thumbs", region="eu-west-1"), "ünï©ødé with space.jpg"),
        (S3Settings(bucket="my.thumbs"), "a~b_c-d.jpg"),
        (S3Settings(bucket="thumbs", endpoint_url="http://[::1]:9000"), "k.jpg"),
        (S3Settings(bucket="thumbs", endpoint_url="https://s3.example:443"), "k.jpg"),
    ],
)
@pytest.mark.parametrize("token", [None, "session/token+="])
def test_the_signature_is_botocores_byte_for_byte(settings, key, token, monkeypatch):
    # The CRT signs; botocore's S3SigV4Auth, at the same instant, is the reference.
    frozen = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token)
    store = SignedS3Store(settings, frozen, http=None)  # type: ignore[arg-type]
    url = URL(object_url(settings, key), encoded=True)
    data = b"\xff\xd8 a thumbnail"
    signed = store._signed_headers(url, data, frozen.get_frozen_credentials())

    at = datetime.datetime.strptime(signed["X-Amz-Date"], "%Y%m%dT%H%M%SZ")
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: at)
    reference = AWSRequest(
        method="PUT", url=str(url), data=data, headers={"Content-Type": "image/jpeg"}
    )
    S3SigV4Auth(frozen.get_frozen_credentials(), "s3", settings.region or "us-east-1").add_auth(
        reference
    )
    assert signed["Authorization"] == reference.headers["Authorization"]
    assert signed["Host"] == urlsplit(str(url)).netloc
    assert signed.get("X-Amz-Security-Token") == token
