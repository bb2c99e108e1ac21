"""What a new host's robots.txt costs in round trips to Redis (bench --long-tail: on a long
tail of hosts, every image pays them): the entry is read and its lock taken in one (a
script), and the entry written and its lock released together in another; the lock lives
through a fetch without renewals. And when the script finds the entry fresh, or another
worker's lock, the lock is left alone."""

import asyncio
import json
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
from worker.politeness.robots import _CLAIM_SCRIPT as CLAIM_SCRIPT
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
    # Loaded before counting: a first EVALSHA of a server that lacks it costs a load.
    await client.script_load(CLAIM_SCRIPT)
    client.round_trips.clear()
    yield client
    await client.aclose()


async def test_a_new_hosts_robots_txt_and_tdmrep_json_cost_two_round_trips(counting, origin):
    origin.set_robots("User-agent: *\nAllow: /\n")
    session = new_session(FETCH, LOOPBACK)
    try:
        guard = RobotsGuard(counting, Fetcher(session, FETCH, LOOPBACK), FakePacer(), SETTINGS)
        assert await guard.verdict(SOURCE, origin.url("/a.jpg")) is None
        asked = counting.round_trips[:]
        assert await guard.verdict(SOURCE, origin.url("/b.jpg")) is None
    finally:
        await session.close()
    assert origin.requests("/robots.txt") == 1
    assert origin.requests("/.well-known/tdmrep.json") == 1
    assert asked == [
        "SMEMBERS",  # robots_exempt
        "EVALSHA",  # the entry read, none found, the lock taken (robots_claim.lua)
        "SET+DEL",  # the entry, and the lock released
    ]
    # The same host's next URL: from this worker's memory.
    assert counting.round_trips == asked


class SlowSlots(FakePacer):
    """Grants each slot only after ``wait_s``."""

    def __init__(self, wait_s: float) -> None:
        super().__init__()
        self._wait_s = wait_s

    def acquire(self, key: HostKey, *, defer: bool = False) -> asyncio.Future[str | None]:
        async def later() -> str | None:
            await asyncio.sleep(self._wait_s)
            return None

        return asyncio.ensure_future(later())


@pytest.mark.timing("asserts lock renewals that depend on elapsed seconds against the lock's TTL")
async def test_a_lock_that_could_lapse_before_a_fetch_is_renewed_first(counting, origin):
    """fetch_timeout_s of 0.4 s: the lock lives 10.4 s and is renewed when less than
    5.4 s are left. Slots 0.5 s apart never need it; 3 s apart, the tdmrep.json's slot
    comes 6 s after the lock was taken, and the lock is renewed for its fetch."""
    origin.set_robots("User-agent: *\nAllow: /\n")
    session = new_session(FETCH, LOOPBACK)
    # Slots counted again only after they came (the pacer's rechecks are not the case).
    settings = RobotsSettings(**{**_fields(SETTINGS), "fetch_timeout_s": 0.4, "slot_recheck_s": 10})
    try:
        for wait_s, renewals in ((0.5, 0), (3.0, 1)):
            counting.round_trips.clear()
            guard = RobotsGuard(
                counting, Fetcher(session, FETCH, LOOPBACK), SlowSlots(wait_s), settings
            )
            url = origin.url(f"/{wait_s}/a.jpg")
            assert await guard.verdict(SOURCE, url) is None
            await counting.delete(c.robots_key(origin_of(url)[0]))  # type: ignore[index]
            assert counting.round_trips.count("PEXPIRE") == renewals, wait_s
    finally:
        await session.close()
    assert origin.requests("/robots.txt") == 2


def _fields(settings: RobotsSettings) -> dict[str, object]:
    return {name: getattr(settings, name) for name in settings.__slots__}


async def test_a_fresh_entry_leaves_the_lock_alone(counting, origin):
    """Written by another worker: read in one round trip, no lock taken."""
    url = origin.url("/a.jpg")
    where = origin_of(url)
    assert where is not None
    now = time.time()
    written = RobotsEntry("200", "User-agent: *\nDisallow: /\n", now, now + 600)
    await counting.set(c.robots_key(where[0]), written.to_json())
    counting.round_trips.clear()
    session = new_session(FETCH, LOOPBACK)
    try:
        guard = RobotsGuard(counting, Fetcher(session, FETCH, LOOPBACK), FakePacer(), SETTINGS)
        assert await guard.verdict(SOURCE, url) == c.Status.ROBOTS_DISALLOWED
    finally:
        await session.close()
    assert origin.total_requests == 0 and guard.fetches == 0
    assert counting.round_trips == ["SMEMBERS", "EVALSHA"]
    assert not await counting.exists(c.robots_lock_key(where[0]))


async def test_an_entry_only_the_script_can_read_is_fetched_again(counting, origin):
    """A fresh entry whose compressed text is damaged (written by hand): fresh to the
    script, which reads only the JSON, so it leaves the lock alone; unreadable to the
    guard, which takes the lock itself and fetches the file."""
    origin.set_robots("User-agent: *\nAllow: /\n")
    url = origin.url("/a.jpg")
    where = origin_of(url)
    assert where is not None
    now = time.time()
    damaged = {"v": 2, "s": "200", "f": now, "e": now + 600, "rz": "not base85 {}"}
    await counting.set(c.robots_key(where[0]), json.dumps(damaged))
    counting.round_trips.clear()
    session = new_session(FETCH, LOOPBACK)
    try:
        guard = RobotsGuard(counting, Fetcher(session, FETCH, LOOPBACK), FakePacer(), SETTINGS)
        assert await guard.verdict(SOURCE, url) is None
    finally:
        await session.close()
    assert origin.requests("/robots.txt") == 1
    assert counting.round_trips == ["SMEMBERS", "EVALSHA", "SET", "SET+DEL"]
    assert not await counting.exists(c.robots_lock_key(where[0]))
