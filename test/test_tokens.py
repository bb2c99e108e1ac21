import asyncio

import pytest
from structlog.testing import capture_logs

from image_crawler.contract import tokens_key
from image_crawler.tasks import cancel_and_wait
from test.fakes import FlakyRedis
from test.services import wait_for
from worker.tokens import RedisTokenBucket, tokens_granted


@pytest.mark.parametrize(
    ("requested", "result", "granted"),
    [(1, 0, 1), (1, -1, 0), (5, 10, 5), (5, 0, 5), (5, -2, 3), (5, -5, 0), (5, -9, 0)],
)
def test_decrby_grants_exactly_what_single_decrs_would(requested, result, granted):
    assert tokens_granted(requested, result) == granted


@pytest.fixture
async def bucket(fake_redis):
    bucket = RedisTokenBucket(fake_redis, retry_s=0.05)
    task = asyncio.create_task(bucket.run())
    yield bucket
    await cancel_and_wait([task])
    bucket.close()


async def test_waiters_get_exactly_the_tokens_in_the_bucket(fake_redis, bucket):
    await fake_redis.set(tokens_key("a"), 3)
    waiters = [bucket.acquire("a") for _ in range(5)]
    done, pending = await asyncio.wait(waiters, timeout=0.5)
    assert (len(done), len(pending)) == (3, 2)
    assert int(await fake_redis.get(tokens_key("a"))) < 0
    # The next refill serves the rest, and no more than it holds.
    await fake_redis.set(tokens_key("a"), 1)
    done, pending = await asyncio.wait(pending, timeout=0.5)
    assert (len(done), len(pending)) == (1, 1)
    await fake_redis.set(tokens_key("a"), 5)
    await asyncio.wait_for(asyncio.gather(*pending), 1)
    assert int(await fake_redis.get(tokens_key("a"))) == 4


async def test_sources_do_not_share_buckets(fake_redis, bucket):
    await fake_redis.set(tokens_key("fast"), 10)
    slow = bucket.acquire("slow")
    await asyncio.wait_for(asyncio.gather(*(bucket.acquire("fast") for _ in range(10))), 1)
    assert not slow.done()
    assert int(await fake_redis.get(tokens_key("fast"))) == 0


async def test_no_bucket_means_no_token(fake_redis, bucket):
    future = bucket.acquire("unknown")
    done, _ = await asyncio.wait([future], timeout=0.3)
    assert not done
    assert int(await fake_redis.get(tokens_key("unknown"))) < 0


async def test_a_cancelled_waiter_takes_nothing(fake_redis, bucket):
    first = bucket.acquire("a")
    second = bucket.acquire("a")
    first.cancel()
    await fake_redis.set(tokens_key("a"), 1)
    await asyncio.wait_for(second, 1)
    assert int(await fake_redis.get(tokens_key("a"))) == 0


async def test_a_redis_that_was_away_is_reported_back_and_grants_again(fake_redis):
    flaky = FlakyRedis(fake_redis)
    bucket = RedisTokenBucket(flaky, retry_s=0.05)
    task = asyncio.create_task(bucket.run())
    try:
        with capture_logs() as logs:
            future = bucket.acquire("a")
            await wait_for(lambda: flaky.refused >= 2, 5, what="two refused attempts")
            await fake_redis.set(tokens_key("a"), 1)
            flaky.away = False
            await asyncio.wait_for(future, 5)
    finally:
        await cancel_and_wait([task])
    events = [(e["event"], e["op"]) for e in logs]
    assert set(events[:-1]) == {("redis_unavailable", "take_tokens")}
    assert events[-1] == ("redis_recovered", "take_tokens")
    assert logs[-1]["unavailable_s"] >= 0
    assert int(await fake_redis.get(tokens_key("a"))) == 0
