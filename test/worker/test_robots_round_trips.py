"""What a new host's robots.txt costs in round trips to Redis (bench --long-tail: on a long
tail of hosts, every image pays them): each read of the entry goes with its lock's check or
its taking, and the entry is written and its lock released together. And when another
worker wrote the entry while this one waited for its slot, the lock it took is given back."""

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from image_crawler import contract as c
from test.harness.fakes import FakePacer
from worker.download.fetch import Fetcher, new_session
from worker.download.netguard import AddressPolicy, parse_networks
from worker.politeness.hosts import HostKey
from worker.politeness.robots import RobotsEntry, RobotsGuard, origin_of
from worker.settings import FetchSettings, RobotsSettings

FETCH = FetchSettings(connect_timeout_s=1, read_timeout_s=1, total_timeout_s=3)
LOOPBACK = AddressPolicy(parse_networks("127.0.0.0/8"))
SETTINGS = RobotsSettings(token="image-crawler", poll_s=0.02, slot_recheck_s=0.1)
SOURCE = "example"


class CountingRedis(Redis):
    """A client that notes each round trip: a command sent alone by its name, a pipeline
    by its commands' names joined with ``+``."""

    round_trips: list[str]

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        self.round_trips.append(str(args[0]).upper())
        return await super().execute_command(*args, **options)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Pipeline:
        pipe = super().pipeline(transaction, shard_hint)
        execute = pipe.execute

        async def counted(raise_on_error: bool = True) -> list[Any]:
            names = "+".join(str(args[0]).upper() for args, _ in pipe.command_stack)
            self.round_trips.append(names)
            return await execute(raise_on_error)

        pipe.execute = counted  # type: ignore[method-assign]
        return pipe


@pytest.fixture
async def counting(redis_url: str) -> AsyncIterator[CountingRedis]:
    client = CountingRedis.from_url(redis_url, decode_responses=True)
    client.round_trips = []
    yield client
    await client.aclose()


async def test_a_new_hosts_robots_txt_and_tdmrep_json_cost_four_round_trips(counting, origin):
    origin.set_robots("User-agent: *\nAllow: /\n")
    session = new_session(FETCH, LOOPBACK)
    try:
        guard = RobotsGuard(counting, Fetcher(session, FETCH, LOOPBACK), FakePacer(), SETTINGS)
        await guard.verdict(SOURCE, origin.url("/first.jpg"))  # the exemptions, read once
        asked = counting.round_trips[:]
        assert await guard.verdict(SOURCE, origin.url("/a.jpg")) is None
    finally:
        await session.close()
    assert origin.requests("/robots.txt") == 1
    assert origin.requests("/.well-known/tdmrep.json") == 1
    assert asked == [
        "SMEMBERS",  # robots_exempt
        "GET+EXISTS",  # the entry, and whether another worker is fetching it
        "GET+SET",  # again once the host's slot has come, and the lock taken
        "PEXPIRE",  # the lock renewed before the tdmrep.json's slot
        "SET+DEL",  # the entry, and the lock released
    ]
    # The same host's next URL: from this worker's memory.
    assert counting.round_trips == asked


class WrittenMeanwhile(FakePacer):
    """Grants the robots.txt's slot only once ``entry`` has been written to ``key``, as
    another worker would have while this one waited for it."""

    def __init__(self, redis: Redis, key: str, entry: RobotsEntry) -> None:
        super().__init__()
        self._redis, self._key, self._entry = redis, key, entry

    def acquire(self, key: HostKey, *, defer: bool = False) -> asyncio.Future[str | None]:
        async def written() -> str | None:
            await self._redis.set(self._key, self._entry.to_json())
            return None

        return asyncio.ensure_future(written())


async def test_the_lock_taken_for_an_entry_written_meanwhile_is_given_back(counting, origin):
    url = origin.url("/a.jpg")
    where = origin_of(url)
    assert where is not None
    now = time.time()
    written = RobotsEntry("200", "User-agent: *\nDisallow: /\n", now, now + 600)
    pacer = WrittenMeanwhile(counting, c.robots_key(where[0]), written)
    session = new_session(FETCH, LOOPBACK)
    try:
        guard = RobotsGuard(counting, Fetcher(session, FETCH, LOOPBACK), pacer, SETTINGS)
        assert await guard.verdict(SOURCE, url) == c.Status.ROBOTS_DISALLOWED
    finally:
        await session.close()
    assert origin.total_requests == 0 and guard.fetches == 0
    assert counting.round_trips == [
        "SMEMBERS",
        "GET+EXISTS",
        "SET",  # the other worker's entry (written by the pacer here)
        "GET+SET",  # found fresh once the slot came, the lock taken all the same...
        "DEL",  # ...and given back
    ]
    assert not await counting.exists(c.robots_lock_key(where[0]))
