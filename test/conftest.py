"""Fixtures that start real services on free loopback ports (see ``test/harness/services.py``).

Scopes: one redis-server and one S3 server per session, that is per xdist worker (tests
get a clean database and a fresh bucket), and a private one of each for fault tests that
pause, kill or restart them (``fresh_redis_server``, ``fresh_s3_server``); a fresh Kafka
broker per test (``kafka``) because tansu's consumer groups carry state between tests,
plus a shared one (``kafka_session``) for tests that only produce and read without
groups; a fresh HTTP origin per test (and ``second_host``, another on 127.0.0.2). Tests
that use any of these are marked ``integration`` automatically. When a test fails, the
tail of each service's log is attached to its report. The hooks under "Parallel runs"
order the tests and keep the timing-bound ones apart (``test/harness/parallel.py``).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest
from redis.asyncio import Redis

from test.harness import parallel
from test.harness.origin import Origin
from test.harness.services import KafkaBroker, RedisServer, S3Server, create_bucket

SERVICE_FIXTURES = frozenset(
    {
        "kafka",
        "kafka_session",
        "redis_server",
        "fresh_redis_server",
        "redis_url",
        "redis",
        "s3_server",
        "fresh_s3_server",
        "s3_bucket",
        "origin",
        "second_host",
    }
)


def _uses_a_service(item: pytest.Item) -> bool:
    # Only the fixtures defined here count: a test module may define its own ``redis``
    # fixture (e.g. fakeredis), which is not a real service.
    definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    for name in SERVICE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        defs = definitions.get(name)
        if not defs or getattr(defs[-1].func, "__module__", __name__) == __name__:
            return True
    return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _uses_a_service(item):
            item.add_marker(pytest.mark.integration)
        parallel.check_timing_marker(item)
    items[:] = parallel.run_order(items, parallel.load_durations())
    parallel.write_timing_ids(config, items)


# --- Parallel runs (test/harness/parallel.py) --------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--store-durations",
        action="store_true",
        help=f"write each test's seconds to {parallel.DURATIONS_FILE} (the run order's guide)",
    )


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    return parallel.workers_for(os.cpu_count() or 1)


_LANES = parallel.Lanes.of(parallel.MACHINE_CPUS)
# In each worker's input: whether the timing-bound tests have a lane of their own.
LANES_INPUT = "image_crawler_timing_lane"


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if _LANES is None or config.getvalue("dist") != "load":
        return None  # one CPU, or a --dist of the caller's: xdist's own, and the lock
    return parallel.TimingLaneScheduling(config, log)


def pytest_configure_node(node: Any) -> None:
    node.workerinput[LANES_INPUT] = _LANES is not None and node.config.getvalue("dist") == "load"


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    # Outermost (tryfirst), so that the wait for the lock is not counted in the test's
    # timeout, and the lock covers the test's fixtures (its services) too.
    # The backstop's watch starts once the lock is held, for the same reason.
    lock = parallel.run_lock(item.config)
    if lock is None:
        with _watched(item):
            return (yield)
    timing = parallel.is_timing(item)
    if _LANES is not None and item.config.workerinput.get(LANES_INPUT):
        # A timing-bound test on its CPU, the others on the rest (on every CPU once the
        # timing-bound ones are done); the scheduler gives the timing-bound ones to one
        # worker, and their lock makes sure none overlap.
        lane_done = parallel.lane_done_path(parallel.run_folder(item.config)).exists()
        os.sched_setaffinity(0, _LANES.cpus_for(item, lane_done))
        with contextlib.ExitStack() as held:
            if timing:
                held.enter_context(lock.alone(parallel.TIMING_LANE))
            # One that needs the machine waits for the others to end, as without a lane.
            exclusive = parallel.needs_the_machine(item)
            held.enter_context(lock.exclusive() if exclusive else lock.shared())
            held.enter_context(_watched(item))
            return (yield)
    with lock.exclusive() if timing else lock.shared(), _watched(item):
        return (yield)


_backstop: parallel.Backstop | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _backstop
    _backstop = parallel.Backstop(2)  # capture has not started yet: fd 2 is the real one


def _watched(item: pytest.Item) -> contextlib.AbstractContextManager[object]:
    timeout_s = parallel.timeout_s(item)
    if _backstop is None or timeout_s is None or timeout_s <= 0:
        return contextlib.nullcontext()
    return _backstop.watch(item.nodeid, timeout_s)


_durations = parallel.Durations()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _durations.add(report)


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    # The controller (or a run without xdist) sees every worker's reports.
    if config.getoption("store_durations") and not hasattr(config, "workerinput"):
        _durations.store(parallel.DURATIONS_FILE)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report: pytest.TestReport = yield
    if report.failed and call.when in ("setup", "call"):
        funcargs = getattr(item, "funcargs", {})
        for name, value in funcargs.items():
            if isinstance(value, KafkaBroker | RedisServer | S3Server):
                report.sections.append(
                    (f"{name} log ({value.log_path})", value.log_tail() or "<empty>")
                )
            elif isinstance(value, Origin):
                lines = [f"{t:.3f} {path}" for t, path in value.request_log[-50:]]
                report.sections.append((f"{name} requests", "\n".join(lines) or "<none>"))
    return report


@pytest.fixture
def source_tree(request: pytest.FixtureRequest) -> Iterator[None]:
    """The source tree for this test alone: pip builds the package in it (``build/``,
    ``image_crawler.egg-info``), and two builds at once would write the same files."""
    with parallel.held_alone(request.config, "source-tree"):
        yield


# --- Fakes ------------------------------------------------------------------------------


@pytest.fixture
async def fake_redis() -> AsyncIterator[fakeredis.FakeAsyncRedis]:
    """An in-memory Redis (``decode_responses=True``) for unit tests of pure logic."""
    client = fakeredis.FakeAsyncRedis(decode_responses=True)
    try:
        yield client
    finally:
        await client.aclose()


# --- Kafka ------------------------------------------------------------------------------


@pytest.fixture
def kafka(tmp_path: Path) -> Iterator[KafkaBroker]:
    """A fresh tansu broker for this test alone (clean topics and consumer groups)."""
    broker = KafkaBroker(log_dir=tmp_path / "kafka").start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def kafka_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """One broker shared by the session: only for tests that do not use consumer groups.

    Use unique topic names per test. A test that kills or pauses a broker uses ``kafka``.
    """
    broker = KafkaBroker(log_dir=tmp_path_factory.mktemp("kafka-session")).start()
    try:
        yield broker
    finally:
        broker.stop()


# --- Redis ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """The session's redis-server. Fault tests use ``fresh_redis_server`` instead."""
    server = RedisServer(log_dir=tmp_path_factory.mktemp("redis")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def fresh_redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server for this test alone, free to be killed, paused or restarted."""
    server = RedisServer(log_dir=tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The session server's URL, emptied (FLUSHALL) before the test."""
    # Heal the shared server if an earlier test left it stopped or paused.
    if redis_server.paused:
        redis_server.resume()
    if not redis_server.running:
        redis_server.restart()
    redis_server.flushall()
    return redis_server.url


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    """An async client (``decode_responses=True``) on the emptied session server."""
    client = Redis.from_url(redis_url, decode_responses=True)
    try:
        yield client
    finally:
        await client.aclose()


# --- S3 ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """moto's S3 server for the session; ``.endpoint_url`` and ``.env`` for clients."""
    server = S3Server(log_dir=tmp_path_factory.mktemp("s3")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def fresh_s3_server(tmp_path: Path) -> Iterator[S3Server]:
    """An S3 server for this test alone, free to be paused or killed (empty, no bucket)."""
    server = S3Server(log_dir=tmp_path / "s3").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> str:
    """The name of a new, empty bucket on the session's S3 server."""
    name = f"test-{uuid.uuid4().hex}"
    create_bucket(s3_server.endpoint_url, name)
    return name


# --- HTTP origin ------------------------------------------------------------------------


@pytest.fixture
def origin() -> Iterator[Origin]:
    """A fresh HTTP origin with no routes (every path 404 until added)."""
    server = Origin().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def second_host() -> Iterator[Origin]:
    """Another host: same machine, another loopback address."""
    server = Origin(host="127.0.0.2").start()
    try:
        yield server
    finally:
        server.stop()
