"""The byte budget: first come, first served, never more than its limit but for overdrafts."""

from __future__ import annotations

import asyncio

import pytest

from worker.download.budget import ByteBudget


async def test_requests_wait_in_order_until_their_bytes_are_free():
    budget = ByteBudget(100)
    assert await budget.acquire(60) == 60
    big = asyncio.create_task(budget.acquire(50))
    small = asyncio.create_task(budget.acquire(10))  # would fit, but queues behind big
    await asyncio.sleep(0)
    assert not big.done() and not small.done()
    budget.release(60)
    assert await big == 50 and await small == 10
    assert budget.used == 60


async def test_a_request_over_the_limit_gets_the_whole_budget_once_alone():
    budget = ByteBudget(100)
    await budget.acquire(1)
    huge = asyncio.create_task(budget.acquire(10_000))
    await asyncio.sleep(0)
    assert not huge.done()
    budget.release(1)
    assert await huge == 100


async def test_a_cancelled_waiter_takes_nothing_and_lets_the_next_one_in():
    budget = ByteBudget(100)
    await budget.acquire(90)
    blocked = asyncio.create_task(budget.acquire(50))
    behind = asyncio.create_task(budget.acquire(10))
    await asyncio.sleep(0)
    blocked.cancel()
    assert await behind == 10
    with pytest.raises(asyncio.CancelledError):
        await blocked
    assert budget.used == 100


async def test_a_waiter_cancelled_as_it_is_granted_gives_its_bytes_back():
    budget = ByteBudget(100)
    await budget.acquire(100)
    waiter = asyncio.create_task(budget.acquire(40))
    await asyncio.sleep(0)
    budget.release(100)  # grants the waiter's future...
    waiter.cancel()  # ...before the waiter runs again
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert budget.used == 0


async def test_an_overdraft_is_taken_at_once_and_holds_back_new_requests():
    budget = ByteBudget(100)
    await budget.acquire(80)
    assert budget.take(70) == 70
    later = asyncio.create_task(budget.acquire(10))
    await asyncio.sleep(0)
    assert not later.done()
    budget.release(150)
    assert await later == 10


def test_releasing_more_than_was_taken_is_a_bug():
    budget = ByteBudget(10)
    with pytest.raises(RuntimeError):
        budget.release(1)


def test_the_budget_comes_from_the_environment():
    from image_crawler.config import ConfigError
    from worker.settings import WorkerSettings

    assert WorkerSettings.from_env({}).fetch.max_bytes_in_flight == 256 * 1024 * 1024
    assert WorkerSettings.from_env(
        {"MAX_BYTES_IN_FLIGHT": "5000000"}
    ).fetch.max_bytes_in_flight == (5_000_000)
    with pytest.raises(ConfigError, match="MAX_BYTES_IN_FLIGHT"):
        WorkerSettings.from_env({"MAX_BYTES_IN_FLIGHT": "10"})
