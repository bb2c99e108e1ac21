"""The metrics server of both processes: /metrics (compressed when asked), /healthz, and
the first free port of a METRICS_PORT range."""

from __future__ import annotations

import contextlib
import errno
import gzip

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from image_crawler.metrics import COMPRESS_FROM_BYTES, serving
from test.harness.services import free_port_range


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


async def test_servers_on_a_range_take_its_first_free_ports_and_fail_when_none_is_left():
    ports = free_port_range(3)
    a, b, c = range(ports.first, ports.last + 1)
    async with contextlib.AsyncExitStack() as stack:
        bound = [
            await stack.enter_async_context(
                serving(
                    a,
                    "127.0.0.1",
                    _registry(1),
                    port_last=c,
                    health=lambda: ["one of the first two"],
                )
            )
            for _ in range(2)
        ]
        assert bound == [a, b]
        # A range of two of those ports: its first is taken, then none is left.
        third = await stack.enter_async_context(serving(b, "127.0.0.1", _registry(1), port_last=c))
        assert third == c
        with pytest.raises(OSError, match=rf"METRICS_PORT {b}-{c}: every port is in use") as e:
            await stack.enter_async_context(serving(b, "127.0.0.1", _registry(1), port_last=c))
        assert e.value.errno == errno.EADDRINUSE
        # Each port answers for its own server: the first two say they have a problem.
        statuses = [(await _get(port, "/healthz", "identity"))[0] for port in (a, b, c)]
        assert statuses == [503, 503, 200]
    # All closed: the range is free again.
    async with serving(b, "127.0.0.1", _registry(1), port_last=c) as again:
        assert again == b


async def test_a_server_on_a_range_skips_a_port_in_use_and_logs_the_one_it_bound():
    ports = free_port_range(2)
    with capture_logs() as events:
        async with (
            serving(ports.first, "127.0.0.1", _registry(1)),
            serving(ports.first, "127.0.0.1", _registry(1), port_last=ports.last) as bound,
        ):
            assert bound == ports.last
    bound_ports = [e["port"] for e in events if e["event"] == "metrics_serving"]
    assert bound_ports == [ports.first, ports.last]


async def test_a_single_port_in_use_fails_as_it_always_did():
    async with serving(0, "127.0.0.1", _registry(1)) as port:
        assert port
        with pytest.raises(OSError) as raised:
            async with serving(port, "127.0.0.1", _registry(1)):
                pass
    assert raised.value.errno == errno.EADDRINUSE
    assert "every port" not in str(raised.value)
