"""The test harness itself: every fixture starts a real service that really answers."""

from __future__ import annotations

import asyncio
import socket
import time
import urllib.error
import urllib.request
import uuid

import aioboto3
import aiohttp
import pytest
from aiohttp import web
from redis.asyncio import Redis

from test.harness.origin import DISCONNECT, Origin, Reply
from test.harness.services import (
    KafkaBroker,
    RedisServer,
    S3Server,
    ServiceError,
    create_topics,
    free_port,
    get_object,
    kafka_metadata_brokers,
    list_keys,
    produce,
    read_records,
    read_topic,
    redis_command,
    wait_for,
    wait_until,
)

pytestmark = pytest.mark.integration


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# --- waiting ------------------------------------------------------------------------------


def test_wait_until_returns_the_first_truthy_value() -> None:
    calls = iter([0, None, "", "ready"])
    assert wait_until(lambda: next(calls), timeout_s=1, interval_s=0.001) == "ready"


def test_wait_until_names_what_it_waited_for() -> None:
    with pytest.raises(TimeoutError, match="the answer"):
        wait_until(lambda: False, timeout_s=0.05, what="the answer")


def test_wait_until_ignores_only_the_given_errors() -> None:
    def refuse() -> bool:
        raise ConnectionRefusedError("nope")

    with pytest.raises(TimeoutError, match="ConnectionRefusedError"):
        wait_until(refuse, timeout_s=0.05, ignore=(OSError,))
    with pytest.raises(ConnectionRefusedError):
        wait_until(refuse, timeout_s=5)


async def test_wait_for_accepts_async_and_plain_predicates() -> None:
    state = {"n": 0}

    async def grows() -> bool:
        state["n"] += 1
        return state["n"] >= 3

    assert await wait_for(grows, timeout_s=1, interval_s=0.001) is True
    assert await wait_for(lambda: state["n"], timeout_s=1) == 3
    with pytest.raises(TimeoutError, match="never"):
        await wait_for(lambda: False, timeout_s=0.05, what="never")


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


# --- Kafka ------------------------------------------------------------------------------


async def test_kafka_produce_and_read_topic_round_trip(kafka: KafkaBroker) -> None:
    await create_topics(kafka.bootstrap, ["harness"], partitions=3)
    values = [f"message-{i}".encode() for i in range(20)]
    await produce(kafka.bootstrap, "harness", values)

    records = await read_records(kafka.bootstrap, "harness", min_messages=20, timeout_s=10)

    assert sorted(r.value for r in records) == sorted(values)
    assert {r.partition for r in records} <= {0, 1, 2}


async def test_kafka_read_topic_says_how_many_it_got(kafka_session: KafkaBroker) -> None:
    topic = unique("short")
    await produce(kafka_session.bootstrap, topic, [b"only-one"])
    with pytest.raises(TimeoutError, match="read 1 of 2"):
        await read_topic(kafka_session.bootstrap, topic, min_messages=2, timeout_s=0.5)


async def test_kafka_read_topic_of_a_missing_topic_times_out(kafka_session: KafkaBroker) -> None:
    with pytest.raises(TimeoutError, match="read 0 of 1"):
        await read_topic(kafka_session.bootstrap, unique("absent"), min_messages=1, timeout_s=0.3)


async def test_kafka_auto_creates_topics_on_produce(kafka_session: KafkaBroker) -> None:
    topic = unique("auto")
    await produce(kafka_session.bootstrap, topic, [b"a", b"b"], key=b"k")
    records = await read_records(kafka_session.bootstrap, topic, min_messages=2)
    assert [(r.key, r.value) for r in records] == [(b"k", b"a"), (b"k", b"b")]


@pytest.mark.parametrize("run", [1, 2])
async def test_kafka_fixture_is_fresh_per_test(kafka: KafkaBroker, run: int) -> None:
    with pytest.raises(TimeoutError, match="read 0 of 1"):
        await read_topic(kafka.bootstrap, "leftover", min_messages=1, timeout_s=0.1)
    await produce(kafka.bootstrap, "leftover", [b"from run %d" % run])


def test_kafka_pause_resume_and_stop(kafka: KafkaBroker) -> None:
    assert kafka.log_path.exists()
    assert kafka.env == {"KAFKA_HOSTS": kafka.bootstrap}
    kafka.pause()
    with pytest.raises(OSError):
        kafka_metadata_brokers("127.0.0.1", kafka.port, timeout_s=0.2)
    kafka.resume()
    assert kafka_metadata_brokers("127.0.0.1", kafka.port) == [("127.0.0.1", kafka.port)]
    kafka.stop()
    assert not kafka.running
    with pytest.raises(ConnectionRefusedError):
        kafka_metadata_brokers("127.0.0.1", kafka.port)


def test_kafka_refuses_a_port_that_answers(kafka: KafkaBroker, tmp_path) -> None:
    other = KafkaBroker(port=kafka.port, log_dir=tmp_path)
    with pytest.raises(ServiceError, match="already in use"):
        other.start()
    assert not other.running


def test_kafka_start_failure_shows_the_log(tmp_path) -> None:
    with socket.socket() as squatter:  # bound, not listening: the broker's bind fails
        squatter.bind(("127.0.0.1", 0))
        broker = KafkaBroker(port=squatter.getsockname()[1], log_dir=tmp_path)
        with pytest.raises(ServiceError, match=r"(?s)exited with.*AddrInUse"):
            broker.start()
        assert not broker.running


# --- Redis ------------------------------------------------------------------------------


@pytest.mark.parametrize("run", [1, 2])
async def test_redis_set_get(redis: Redis, run: int) -> None:
    assert await redis.dbsize() == 0  # flushed before each test
    await redis.set("currtokens:flickr", 5)
    assert await redis.decr("currtokens:flickr") == 4
    assert await redis.get("currtokens:flickr") == "4"


async def test_redis_restart_keeps_the_port(fresh_redis_server: RedisServer) -> None:
    server = fresh_redis_server
    port = server.port
    client = Redis.from_url(server.url, decode_responses=True)
    try:
        await client.set("before", "1")
        server.kill()
        with pytest.raises(Exception, match=r"(?i)connect|closed"):
            await client.get("before")
        server.restart()
        assert server.port == port
        await wait_for(client.ping, timeout_s=5, what="redis after restart")
        assert await client.get("before") is None  # no persistence
        await client.set("after", "2")
        assert await client.get("after") == "2"
    finally:
        await client.aclose()


@pytest.mark.timing("asserts stop() of a SIGSTOPped redis takes under 2 s")
def test_redis_pause_makes_it_hang(fresh_redis_server: RedisServer) -> None:
    fresh_redis_server.pause()
    with pytest.raises(TimeoutError):
        redis_command(fresh_redis_server.port, "PING", timeout_s=0.2)
    fresh_redis_server.resume()
    assert redis_command(fresh_redis_server.port, "PING") == b"+PONG"
    fresh_redis_server.pause()
    began = time.monotonic()
    fresh_redis_server.stop(timeout_s=5)  # a paused process must still stop on SIGTERM
    assert not fresh_redis_server.running
    assert time.monotonic() - began < 2


def test_a_service_that_is_not_running_cannot_be_paused(tmp_path) -> None:
    with pytest.raises(ServiceError, match="not running"):
        RedisServer(log_dir=tmp_path).pause()


# --- S3 ---------------------------------------------------------------------------------


async def test_s3_put_get_with_the_env_credentials(
    s3_server: S3Server, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    session = aioboto3.Session()
    async with session.client("s3", endpoint_url=s3_server.env["S3_ENDPOINT_URL"]) as s3:
        await s3.put_object(Bucket=s3_bucket, Key="abc.jpg", Body=b"\xff\xd8jpeg")
        response = await s3.get_object(Bucket=s3_bucket, Key="abc.jpg")
        async with response["Body"] as body:
            assert await body.read() == b"\xff\xd8jpeg"

    assert get_object(s3_server.endpoint_url, s3_bucket, "abc.jpg") == b"\xff\xd8jpeg"
    assert list_keys(s3_server.endpoint_url, s3_bucket) == {"abc.jpg"}


def test_s3_buckets_are_fresh(s3_server: S3Server, s3_bucket: str) -> None:
    assert list_keys(s3_server.endpoint_url, s3_bucket) == set()


# --- HTTP origin ------------------------------------------------------------------------


async def test_origin_serves_bodies_and_404s(origin: Origin) -> None:
    url = origin.add("/img/cat.jpg", b"JPEGDATA", "image/jpeg", headers={"X-Test": "1"})
    async with aiohttp.ClientSession() as session:
        async with session.get(url) as response:
            assert response.status == 200
            assert response.headers["Content-Type"] == "image/jpeg"
            assert response.headers["X-Test"] == "1"
            assert await response.read() == b"JPEGDATA"
        async with session.get(origin.url("/nothing-here")) as response:
            assert response.status == 404
    assert origin.requests("/img/cat.jpg") == 1
    assert origin.requests("/nothing-here") == 1
    assert origin.requests("/never") == 0


async def test_origin_sequence_then_repeats_the_last(origin: Origin) -> None:
    # Two DISCONNECTs because aiohttp retries a disconnected GET once by itself.
    url = origin.add_sequence("/flaky", [500, DISCONNECT, DISCONNECT, Reply(b"ok", "text/plain")])
    async with aiohttp.ClientSession() as session:
        async with session.get(url) as response:
            assert response.status == 500
        with pytest.raises(aiohttp.ServerDisconnectedError):
            async with session.get(url) as response:
                await response.read()
        for _ in range(2):
            async with session.get(url) as response:
                assert (response.status, await response.read()) == (200, b"ok")
    assert origin.requests("/flaky") == 5


async def test_origin_disconnect_and_status(origin: Origin) -> None:
    origin.add_disconnect("/rude")
    origin.add_status("/limited", 429)
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ServerDisconnectedError):
            async with session.get(origin.url("/rude")) as response:
                await response.read()
        async with session.get(origin.url("/limited")) as response:
            assert response.status == 429
            assert await response.text() == "429\n"


async def test_aiohttp_retries_a_disconnected_get_once(origin: Origin) -> None:
    """Not the harness: a pinned fact about aiohttp that crawler retry tests must know.

    ClientSession retries an idempotent request once after ServerDisconnectedError, on
    fresh and pooled connections alike (there is no public switch), so the origin sees two
    requests per failed GET, and [DISCONNECT, image] reaches the caller as the image.
    """
    url = origin.add_sequence("/once", [DISCONNECT, Reply(b"img", "image/jpeg")])
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert await response.read() == b"img"
    assert origin.requests("/once") == 2
    origin.add_disconnect("/always")
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ServerDisconnectedError):
            await session.get(origin.url("/always"))
    assert origin.requests("/always") == 2


async def test_origin_custom_handler_and_request_log(origin: Origin) -> None:
    async def echo_agent(request: web.Request) -> web.Response:
        return web.Response(text=request.headers.get("User-Agent", ""))

    origin.add_handler("/agent", echo_agent)
    before = time.monotonic()
    async with aiohttp.ClientSession(headers={"User-Agent": "polite-crawler"}) as session:
        for query in ("", "?a=1"):
            async with session.get(origin.url("/agent" + query)) as response:
                assert await response.text() == "polite-crawler"
    log = origin.request_log
    assert [path for _, path in log] == ["/agent", "/agent?a=1"]
    assert all(before <= t <= time.monotonic() for t, _ in log)
    assert origin.requests("/agent") == 2
    assert origin.requests("/agent?a=1") == 1


def test_origin_works_from_synchronous_code(origin: Origin) -> None:
    origin.add("/plain.txt", b"hello", "text/plain")
    with urllib.request.urlopen(origin.url("/plain.txt"), timeout=5) as response:
        assert response.read() == b"hello"
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(origin.url("/missing"), timeout=5)
    assert info.value.code == 404
    info.value.close()


@pytest.mark.timing("asserts origin.stop() takes under 3 s")
async def test_origin_stop_cuts_slow_responses_short() -> None:
    origin = Origin().start()
    try:
        url = origin.add_slow("/slow.jpg", b"late", delay_s=60)
        async with aiohttp.ClientSession() as session:

            async def fetch() -> bytes:
                async with session.get(url) as response:
                    return await response.read()

            task = asyncio.create_task(fetch())
            await wait_for(lambda: origin.requests("/slow.jpg") == 1, timeout_s=5)
            began = time.monotonic()
            await asyncio.to_thread(origin.stop)
            assert time.monotonic() - began < 3
            # The server closes the connection; aiohttp's own retry then finds no server.
            with pytest.raises(aiohttp.ClientConnectionError):
                await task
    finally:
        origin.stop()
