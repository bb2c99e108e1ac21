"""The metrics server of both processes: /metrics (compressed when asked), /healthz."""

from __future__ import annotations

import gzip

import aiohttp
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

from image_crawler.metrics import COMPRESS_FROM_BYTES, serving


def _registry(sources: int) -> CollectorRegistry:
    registry = CollectorRegistry()
    counter = Counter("crawler_test", "A labelled counter.", ["source"], registry=registry)
    for n in range(sources):
        counter.labels(f"source-{n}").inc(n)
    return registry


async def _get(port: int, path: str, encoding: str) -> tuple[int, str, bytes]:
    # auto_decompress off: the test sees the bytes as they crossed the wire.
    async with (
        aiohttp.ClientSession(auto_decompress=False) as http,
        http.get(f"http://127.0.0.1:{port}{path}", headers={"Accept-Encoding": encoding}) as r,
    ):
        return r.status, r.headers.get("Content-Encoding", ""), await r.read()


async def test_a_large_page_is_gzipped_for_a_client_that_asks_and_plain_for_one_that_does_not():
    async with serving(0, "127.0.0.1", _registry(1000)) as port:
        assert port
        status, encoding, zipped = await _get(port, "/metrics", "gzip")
        assert (status, encoding) == (200, "gzip")
        _, plain_encoding, plain = await _get(port, "/metrics", "identity")
    assert plain_encoding == ""
    assert gzip.decompress(zipped) == plain
    assert len(zipped) * 5 < len(plain)
    families = {f.name: f for f in text_string_to_metric_families(plain.decode())}
    assert len(families["crawler_test"].samples) >= 1000


async def test_a_small_page_goes_uncompressed():
    registry = _registry(1)
    async with serving(0, "127.0.0.1", registry) as port:
        assert port
        status, encoding, body = await _get(port, "/metrics", "gzip")
    assert (status, encoding) == (200, "")
    assert len(body) < COMPRESS_FROM_BYTES


async def test_healthz_says_the_problems_with_503_and_nothing_with_200():
    problems: list[str] = []
    async with serving(0, "127.0.0.1", _registry(1), health=lambda: problems) as port:
        assert port
        assert (await _get(port, "/healthz", "identity"))[0] == 200
        problems.append("starting")
        status, _, body = await _get(port, "/healthz", "identity")
    assert status == 503 and b"starting" in body


async def test_no_port_serves_nothing():
    async with serving(None, "127.0.0.1") as port:
        assert port is None
