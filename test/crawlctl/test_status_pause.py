"""``image-crawler status`` while the whole crawl is paused (``crawl_paused``): why, above
the table and in ``--json``."""

from __future__ import annotations

from redis.asyncio import Redis
from rich.console import Console

from crawlctl.status.json_view import status_json
from crawlctl.status.model import read_status
from crawlctl.status.terminal import status_table
from image_crawler import contract as c

PAUSE = c.CrawlPause(
    c.PAUSE_DISK_FULL,
    "the disk of /data is full: 3.0 MiB free; free 7.0 MiB more",
    since_s=1_700_000_000.0,
    path="/data",
    free_bytes=3 << 20,
    reserve_bytes=8 << 20,
    needed_bytes=7 << 20,
    biggest=(("/data/broker", 20 << 20),),
)


def rendered(table: object) -> str:
    console = Console(width=200, record=True, color_system=None)
    console.print(table)
    return console.export_text()


async def test_status_says_why_the_crawl_is_paused(redis: Redis) -> None:
    status = await read_status(redis)
    assert status.paused is None
    assert "CRAWL PAUSED" not in rendered(status_table(status))
    await redis.set(c.CRAWL_PAUSED_KEY, PAUSE.to_json())
    status = await read_status(redis)
    assert status.paused == PAUSE
    assert f"CRAWL PAUSED: {PAUSE.message}" in rendered(status_table(status))
    general = status_json(status)["general"]
    assert general["paused"]["reason"] == "disk_full"
    assert general["paused"]["needed_bytes"] == 7 << 20
    assert general["paused"]["biggest"] == [{"path": "/data/broker", "bytes": 20 << 20}]
