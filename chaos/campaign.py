"""One campaign: the stack up, the feed and the ledger running, faults for the set time,
the halted source resumed, every uuid waited for, then the checks and one summary line."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from redis.asyncio import Redis
from redis.exceptions import RedisError

from chaos import checks, plan
from chaos.faults import Faults
from chaos.ledger import OUTPUT_TOPICS, Ledger, feed, read_outputs
from chaos.stack import BUCKET, Census, Stack
from crawlctl.commands import controls
from image_crawler import contract as c
from image_crawler.lifecycle import cancel_and_wait
from test.harness.services import create_topics, list_keys

# The halted source is halted from this share of the fault period to its end.
HALT_FROM: float = 0.3
T = TypeVar("T")
INBOUND_PARTITIONS = 4


def say(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)


@dataclasses.dataclass(slots=True)
class Halt:
    """The operator's halt of ``plan.HALTED_SOURCE``, and every look at it meanwhile."""

    start: float = 0.0
    end: float = 0.0
    looks: list[tuple[float, str, bool]] = dataclasses.field(default_factory=list)

    @property
    def spans(self) -> list[tuple[float, float]]:
        return [(self.start, self.end)] if self.start else []

    def held(self) -> bool:
        return all(member for _, _, member in self.looks)


class Campaign:
    def __init__(self, run_dir: Path, seed: int, minutes: float, drain_timeout_s: float) -> None:
        self.run_dir = run_dir
        self.seed = seed
        self.duration_s = minutes * 60
        self.drain_timeout_s = drain_timeout_s
        self.stack = Stack(run_dir)
        self.census = Census()
        self.ledger = Ledger(run_dir / "ledger.jsonl")
        self.faults = Faults(self.stack, seed, say)
        self.halt = Halt()
        self.redis: Redis | None = None
        self.drain_s: float | None = None
        self.backlog_at_drain = 0  # uuids not ended when the faults ended
        self.exit_codes: dict[str, int | None] = {}

    async def run(self) -> dict[str, Any]:
        self.census.start()
        try:
            await asyncio.to_thread(self.stack.start_services)
            assert self.stack.broker is not None and self.stack.origin is not None
            bootstrap = self.stack.broker.bootstrap
            await create_topics(bootstrap, [c.INBOUND_TOPIC], partitions=INBOUND_PARTITIONS)
            await create_topics(bootstrap, OUTPUT_TOPICS)
            self.redis = Redis.from_url(self.stack.redis.url, socket_timeout=5)
            self.stack.start_crawlers()
            say(f"stack up in {self.run_dir}; faults for {self.duration_s:.0f} s")
            await self._crawl(bootstrap, self.stack.origin.port)
            return await self._finish()
        finally:
            await asyncio.to_thread(self._stop)

    async def _crawl(self, bootstrap: str, port: int) -> None:
        urls: asyncio.Queue[plan.Url] = asyncio.Queue()
        tasks = [
            asyncio.create_task(feed(self.ledger, bootstrap, urls)),
            asyncio.create_task(read_outputs(self.ledger, bootstrap)),
        ]
        start = time.time()
        until = start + self.duration_s
        self.faults.after_redis = self._look_at_halt
        try:
            await asyncio.gather(
                self._feed(urls, port, until),
                self.faults.run(until),
                self._halt_during(start + HALT_FROM * self.duration_s, until),
            )
            await self._drain(urls)
        finally:
            await cancel_and_wait(tasks)

    async def _feed(self, urls: asyncio.Queue[plan.Url], port: int, until: float) -> None:
        source = plan.Feed(self.seed, port)
        next_at = time.time()
        while next_at < until:
            for url in source.second():
                urls.put_nowait(url)
            next_at += 1.0
            await asyncio.sleep(max(0.0, next_at - time.time()))

    async def _halt_during(self, start: float, until: float) -> None:
        await asyncio.sleep(max(0.0, start - time.time()))
        # As an operator halts (`image-crawler halt`): SADD halted, and the source's pace
        # rate set to 0 so that workers stop within their pacing horizon. The SADD alone
        # waits for the monitor's next loop, up to its period (1 s) or longer while it is
        # slow after a Redis fault: seed 1864445941 saw a request 0.587 s into a halt
        # made 1 s after a Redis restart.
        assert self.redis is not None
        redis = self.redis
        await self._retrying(lambda: controls.halt(redis, plan.HALTED_SOURCE))
        self.halt.start = time.time()
        say(f"halted {plan.HALTED_SOURCE} (image-crawler halt: SADD halted, SET pace_rate 0)")
        while time.time() < until:
            await asyncio.sleep(5.0)
            await self._look_at_halt("look")
        await self.faults.finished.wait()  # faults still running past the fault period
        await self._look_at_halt("end")
        await self._redis_retrying("SREM", c.HALTED_SET, plan.HALTED_SOURCE)
        self.halt.end = time.time()
        say(f"resumed {plan.HALTED_SOURCE} (SREM halted)")

    async def _look_at_halt(self, why: str) -> None:
        if not self.halt.start or self.halt.end:
            return
        member = await self._redis_retrying("SISMEMBER", c.HALTED_SET, plan.HALTED_SOURCE)
        self.halt.looks.append((time.time(), why, bool(member)))
        if not member:
            say(f"{plan.HALTED_SOURCE} is not in halted any more ({why})")

    async def _redis_retrying(self, *command: str) -> Any:
        assert self.redis is not None
        redis = self.redis
        return await self._retrying(lambda: redis.execute_command(*command))

    async def _retrying(self, call: Callable[[], Awaitable[T]], timeout_s: float = 120.0) -> T:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return await call()
            except (RedisError, OSError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)

    async def _drain(self, urls: asyncio.Queue[plan.Url]) -> None:
        """Wait for every uuid to end while the crawl still ends some: a backlog the faults
        left takes as long as it takes, a uuid that is never answered gives up after
        ``drain_timeout_s`` without progress."""
        last_fault = max((f.ended for f in self.faults.done), default=time.time())
        say(f"faults over ({len(self.faults.done)}); waiting for every uuid to end")
        left = self.backlog_at_drain = len(self.ledger.unended()) + urls.qsize()
        stalled_at = time.monotonic() + self.drain_timeout_s
        while time.monotonic() < stalled_at:
            now_left = len(self.ledger.unended()) + urls.qsize()
            if not now_left:
                self.drain_s = time.time() - last_fault
                say(f"every uuid ended, {self.drain_s:.0f} s after the last fault")
                return
            if now_left < left:
                left, stalled_at = now_left, time.monotonic() + self.drain_timeout_s
            await asyncio.sleep(1.0)
        say(f"{left} uuids had not ended, none for {self.drain_timeout_s:.0f} s")

    async def _finish(self) -> dict[str, Any]:
        keys = await asyncio.to_thread(list_keys, self.stack.s3.endpoint_url, BUCKET)
        missing = sorted(u for u in self.ledger.resolved if f"{u}.jpg" not in keys)
        return {"thumbnails_missing": missing}

    def _stop(self) -> None:
        with contextlib.suppress(Exception):
            self.exit_codes = self.stack.stop()
        self.census.note()
        self.census.stop()
        self.ledger.close()


def summarize(campaign: Campaign, extra: dict[str, Any]) -> tuple[str, dict[str, Any], bool]:
    """The summary line, the summary's JSON, and whether every check passed."""
    summary = _findings(campaign, extra)
    passed = not (
        summary["lost"]
        or summary["wrong"]
        or summary["thumbnails_missing"]
        # A window one request over is reported; more fail (checks.REPORTED_OVER).
        or summary["over_bound_by_2_or_more"]
        or summary["retry_after_broken"]
        or summary["requests_while_halted"]
        or not campaign.halt.held()
        or summary["leftovers"]
        or any(code != 0 for code in campaign.exit_codes.values())
        or campaign.drain_s is None
    )
    summary["passed"] = passed
    return _line(campaign, summary, passed), summary, passed


def _findings(campaign: Campaign, extra: dict[str, Any]) -> dict[str, Any]:
    requests = campaign.stack.origin.requests() if campaign.stack.origin else []
    ends = checks.check_ends(campaign.ledger.produced, campaign.ledger.ends)
    windows = checks.pacing_windows(requests)
    worst = checks.worst_window(windows)
    fetches = checks.fetches_per_image(requests)
    copies = campaign.ledger.copies
    return {
        "seed": campaign.seed,
        "minutes": campaign.duration_s / 60,
        "faults": dict(campaign.faults.counts()),
        "fault_log": [dataclasses.asdict(f) for f in campaign.faults.done],
        "uuids": len(campaign.ledger.produced),
        "produce_retries": campaign.ledger.produce_failures,
        "ledger_consumer_restarts": campaign.ledger.consumer_restarts,
        "ledger_reader_holes": campaign.ledger.reader_holes,
        "lost": ends.lost,
        "wrong": ends.wrong,
        "duplicates": ends.duplicates,
        "inbound_copies_extra": sum(n - 1 for n in copies.values()),
        "duplicates_beyond_copies": checks.duplicates_beyond_copies(campaign.ledger.ends, copies),
        "deliveries": ends.deliveries,
        "thumbnails_missing": extra["thumbnails_missing"],
        "requests": len(requests),
        "fetches_per_image": dict(sorted(fetches.items())),
        "requests_per_image": checks.requests_per_image(fetches),
        "fetched_again_after_success": checks.fetched_again_after_success(requests),
        "requests_per_copy": checks.requests_per_copy(requests, copies),
        "fetched_again_beyond_copies": checks.fetched_again_after_success(requests, copies),
        "backlog_at_drain": campaign.backlog_at_drain,
        "statuses": {str(k): v for k, v in sorted(checks.statuses(requests).items())},
        "worst_window": str(worst and dataclasses.replace(worst, gaps_ms=())),
        "over_bound": [str(w) for w in windows if w.seen > w.bound],
        "over_bound_strict": [
            f"{w.who} {w.strict}/{w.bound} in {w.width_s:g} s"
            for w in windows
            if w.strict > w.bound
        ],
        "over_bound_by_2_or_more": [
            str(w) for w in windows if w.seen > w.bound + checks.REPORTED_OVER
        ],
        "retry_after_broken": checks.retry_after_broken(requests),
        "halt": dataclasses.asdict(campaign.halt),
        "requests_while_halted": checks.requests_while_halted(
            requests, plan.HALTED_SOURCE, campaign.halt.spans
        ),
        "leftovers": campaign.census.alive(),
        "exit_codes": campaign.exit_codes,
        "drain_s": campaign.drain_s,
    }


def _line(campaign: Campaign, s: dict[str, Any], passed: bool) -> str:
    kinds = " ".join(f"{k}={v}" for k, v in sorted(s["faults"].items()))
    drain = "NEVER" if s["drain_s"] is None else f"{s['drain_s']:.0f}s"
    held = "yes" if campaign.halt.held() else "NO"
    bad_exits = sum(code != 0 for code in s["exit_codes"].values())
    return (
        f"chaos seed={s['seed']} minutes={s['minutes']:g} "
        f"faults={sum(s['faults'].values())} ({kinds}) uuids={s['uuids']} "
        f"lost={len(s['lost'])} wrong={len(s['wrong'])} duplicates={s['duplicates']} "
        f"requests_per_image={s['requests_per_image']} "
        f"fetched_again={s['fetched_again_after_success']} "
        f"(beyond the feeder's {s['inbound_copies_extra']} extra copies: duplicates "
        f"{s['duplicates_beyond_copies']}, requests_per_copy={s['requests_per_copy']}, "
        f"fetched_again {s['fetched_again_beyond_copies']}) "
        f"thumbnails_missing={len(s['thumbnails_missing'])} "
        f"worst_window='{s['worst_window']}' over_bound={len(s['over_bound'])} "
        f"(strict {len(s['over_bound_strict'])}, 2+ over {len(s['over_bound_by_2_or_more'])}) "
        f"retry_after_broken={len(s['retry_after_broken'])} "
        f"halted_held={held}({len(campaign.halt.looks)} looks, "
        f"{len(s['requests_while_halted'])} requests) leftovers={len(s['leftovers'])} "
        f"bad_exits={bad_exits} backlog_at_drain={s['backlog_at_drain']} drain={drain}: "
        f"{'PASS' if passed else 'FAIL'}"
    )


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
