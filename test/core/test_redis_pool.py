"""A bounded Redis pool makes commands wait for a connection instead of failing
(image_crawler.config.RedisSettings.client)."""

from __future__ import annotations

import asyncio

from redis.asyncio import BlockingConnectionPool
from redis.exceptions import MaxConnectionsError

from image_crawler.config import RedisSettings


async def test_commands_beyond_the_pool_wait_for_a_connection(redis_url):
    client = RedisSettings(url=redis_url).client(decode_responses=True, pool_size=2)
    try:
        assert isinstance(client.connection_pool, BlockingConnectionPool)
        # Ten commands that each hold their connection for 0.2 s, on two connections.
        replies = await asyncio.gather(*(client.blpop([f"none{i}"], 0.2) for i in range(10)))
        assert replies == [None] * 10
    finally:
        await client.aclose()


async def test_redis_py_s_own_pool_fails_them_instead(redis_url):
    # What the workers ran into with a thousand new hosts at once.
    client = RedisSettings(url=redis_url).client(decode_responses=True, max_connections=2)
    try:
        replies = await asyncio.gather(
            *(client.blpop([f"none{i}"], 0.2) for i in range(10)), return_exceptions=True
        )
        assert any(isinstance(r, MaxConnectionsError) for r in replies), replies
    finally:
        await client.aclose()
