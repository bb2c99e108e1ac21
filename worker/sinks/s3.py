"""Thumbnails to S3 with one signed PUT each, without botocore's per-call machinery.

A ``put_object`` through aioboto3 spends most of its CPU on evaluating the S3 endpoint
rule set (botocore caches its result by parameters that include the object key, so every
thumbnail misses the cache), event hooks and parameter validation: a sizeable share of
the image work itself. Here botocore finds the credentials (environment, profiles,
instance roles, with refresh); the Signature V4 is the AWS Common Runtime's (awscrt, the
C signer botocore itself uses when installed with its ``crt`` extra), called directly:
36 us a thumbnail, of which 23 are the payload's SHA-256, against 78 us for botocore's
``S3SigV4Auth`` on its ``AWSRequest`` (the same signature, byte for byte). The request is
a plain aiohttp PUT on a keep-alive session (the costs are measured in ``bench/``, see
docs/benchmark.md).
"""

from __future__ import annotations

import hashlib
import ssl
from typing import Any
from urllib.parse import quote

import aiohttp
from aiobotocore.session import get_session
from awscrt.auth import (
    AwsCredentialsProvider,
    AwsSignedBodyHeaderType,
    AwsSigningConfig,
    aws_sign_request,
)
from awscrt.exceptions import AwsCrtError
from awscrt.http import HttpHeaders, HttpRequest
from botocore.exceptions import BotoCoreError
from yarl import URL

from image_crawler.config import ConfigError, S3Settings
from worker.sinks.base import DependencyError, Stalls

DEFAULT_REGION = "us-east-1"
_ERROR_BODY_CHARS = 300


def object_url(settings: S3Settings, key: str) -> str:
    """The URL of ``key`` in the bucket: path style on a custom endpoint (MinIO, test
    servers), virtual-hosted on AWS unless the bucket's name has a dot (TLS certificates
    cover one label only)."""
    quoted = quote(key, safe="-_.~")
    bucket = settings.bucket
    if settings.endpoint_url:
        return f"{settings.endpoint_url.rstrip('/')}/{bucket}/{quoted}"
    region = settings.region or DEFAULT_REGION
    if "." in bucket:
        return f"https://s3.{region}.amazonaws.com/{bucket}/{quoted}"
    return f"https://{bucket}.s3.{region}.amazonaws.com/{quoted}"


class SignedS3Store:
    """A ``ThumbnailStore`` writing ``{key}`` to the bucket of ``settings``."""

    def __init__(
        self,
        settings: S3Settings,
        credentials: Any,
        http: aiohttp.ClientSession,
        *,
        stalls: Stalls | None = None,
    ) -> None:
        self._settings = settings
        self._credentials = credentials  # botocore (Refreshable)Credentials, async API
        self._region = settings.region or DEFAULT_REGION
        self._http = http
        self._stalls = stalls or Stalls("s3")
        # The CRT's provider for the last credentials botocore gave: they change only
        # when botocore refreshes them (an instance role's, hourly).
        self._provider: tuple[tuple[str, str, str | None], AwsCredentialsProvider] | None = None

    @classmethod
    async def open(
        cls,
        settings: S3Settings,
        *,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 60.0,
        stalls: Stalls | None = None,
    ) -> SignedS3Store:
        """Find credentials the way the AWS tools do; ``ConfigError`` when there are none."""
        credentials = await get_session().get_credentials()
        if credentials is None:
            raise ConfigError(
                "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                "(or an AWS profile or instance role)"
            )
        ca_bundle = settings.ca_bundle
        context = ssl.create_default_context(cafile=ca_bundle) if ca_bundle else True
        # botocore's own timeouts: a put that gets no answer for a minute is tried again
        # (a second PUT of the same thumbnail is harmless); Stalls reports it meanwhile.
        http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=connect_timeout_s, sock_read=read_timeout_s
            ),
            connector=aiohttp.TCPConnector(ssl=context),
        )
        return cls(settings, credentials, http, stalls=stalls)

    async def close(self) -> None:
        await self._http.close()

    async def put(self, key: str, data: bytes) -> None:
        await self._stalls.watch("s3_put", self._put(key, data))

    async def _put(self, key: str, data: bytes) -> None:
        url = URL(object_url(self._settings, key), encoded=True)
        try:
            frozen = await self._credentials.get_frozen_credentials()
            headers = self._signed_headers(url, data, frozen)
            async with self._http.put(url, data=data, headers=headers) as response:
                if response.status == 200:
                    return
                # Every failure is retried, 403 and NoSuchBucket too: those need an
                # operator, and meanwhile the URL waits instead of being lost.
                text = (await response.text(errors="replace"))[:_ERROR_BODY_CHARS]
                raise DependencyError("s3", S3Error(response.status, text))
        except (aiohttp.ClientError, TimeoutError, BotoCoreError, AwsCrtError) as e:
            raise DependencyError("s3", e) from e

    def _signed_headers(self, url: URL, data: bytes, frozen: Any) -> dict[str, str]:
        """The headers of a PUT of ``data`` to ``url``, signed (Signature V4 for S3: the
        payload's SHA-256 signed, the path neither normalised nor encoded twice, as
        botocore's ``S3SigV4Auth`` does)."""
        # The Host signed is the Host sent: aiohttp takes ours instead of making its own.
        host = url.raw_host or ""
        if ":" in host:  # an IPv6 address, bracketed as in the URL
            host = f"[{host}]"
        if not url.is_default_port():
            host = f"{host}:{url.port}"
        request = HttpRequest(
            "PUT", url.raw_path, HttpHeaders([("Host", host), ("Content-Type", "image/jpeg")])
        )
        config = AwsSigningConfig(
            credentials_provider=self._credentials_provider(frozen),
            region=self._region,
            service="s3",
            use_double_uri_encode=False,
            should_normalize_uri_path=False,
            signed_body_value=hashlib.sha256(data).hexdigest(),
            signed_body_header_type=AwsSignedBodyHeaderType.X_AMZ_CONTENT_SHA_256,
        )
        # With static credentials the CRT signs on this thread, before returning.
        aws_sign_request(request, config).result()
        return dict(request.headers)

    def _credentials_provider(self, frozen: Any) -> AwsCredentialsProvider:
        key = (frozen.access_key, frozen.secret_key, frozen.token)
        if self._provider is None or self._provider[0] != key:
            self._provider = (key, AwsCredentialsProvider.new_static(*key))
        return self._provider[1]


class S3Error(Exception):
    """S3 answered a PUT with something other than 200."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
