"""``image-crawler status --hosts SOURCE``: one source's hosts, read from the host index
and the hashes the workers' pacing script writes (run here as the workers run it, on
the suite's redis-server), in the table, in ``--json`` and in ``status``'s host counts."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from redis.asyncio import Redis

from crawlctl import cli
from crawlctl.console import EXIT_OK
from crawlctl.status.hosts import (
    BACKLOG_UNKNOWN,
    HostRow,
    SourceHosts,
    effective_rps,
    read_source_hosts,
    why_text,
)
from image_crawler import contract as c
from image_crawler.host_index import HostCounts
from image_crawler.lua import lua_script
from worker.politeness.hosts import NO_REPORT, HostSettings

SOURCE = "web"
SCRIPT = lua_script("worker.politeness", "pacing_acquire.lua")


async def redis_now(redis: Redis) -> float:
    seconds, micros = await redis.time()
    return seconds + micros / 1e6


async def ask(redis: Redis, source: str, hosts: list[str]) -> Any:
    """An ask of the workers' pacing script for a slot of each of ``hosts``, as if each
    came when its source had a slot to give (the script reads no host the round robin
    does not reach: one with nothing to report, once the source's slots within the
    horizon are spent, is left unread). The answers, as the script gives them for one
    ask of them all (its last)."""
    answers: Any = None
    for i in range(len(hosts)):
        await redis.delete(c.pace_next_key(source))
        answers = await _ask_once(redis, source, hosts[i:] + hosts[:i])
    assert answers is not None
    return answers if len(hosts) <= 1 else _rotated(answers, len(hosts))


def _rotated(answers: Any, n: int) -> Any:
    """The last ask's answers (its hosts rotated by n - 1) in the order asked."""
    out = []
    for answer in answers:
        if not isinstance(answer, list):
            out.append(answer)
            continue
        shift = n - 1
        out.append(answer[n - shift :] + answer[: n - shift])
    return out


async def _ask_once(redis: Redis, source: str, hosts: list[str]) -> Any:
    config = {
        "rp": c.PACE_RATE_PREFIX,
        "np": c.PACE_NEXT_PREFIX,
        "hp": c.PACE_HOST_PREFIX,
        "cp": c.HOST_RATE_PREFIX,
        "h": 0.05,
        "s": HostSettings().to_json_obj(),
    }
    asks = [[source, [[host, 1, NO_REPORT.to_list()] for host in hosts]]]
    return json.loads(await redis.eval(SCRIPT, 0, json.dumps(config), json.dumps(asks)))["a"]


async def seed_hosts(redis: Redis, source: str = SOURCE) -> None:
    """A source at 40/s whose hosts are in every state, as its workers left them, and
    indexed by one ask of the pacing script."""
    now = await redis_now(redis)
    await redis.sadd(c.INBOUND_SOURCES_SET, source)
    await redis.set(c.pace_rate_key(source), "40")
    await redis.set(c.host_rate_key(source), "20")
    hashes: dict[str, dict[str, str]] = {
        "fast.example": {"rate": "40"},  # capped at 20/s by host_rate: paced
        "slow.example": {"rate": "20"},
        "delayed.example": {"rate": "40", "delay": "3", "delay_until": f"{now + 100}"},
        "capped.example": {"override": "0.5"},
        "cut.example": {"rate": "6", "cut": f"{now - 5}"},
        "broken.example": {
            "rate": "20",
            "until": f"{now + 30}",
            "fails": "4",
            "halts": "2",
            "since": f"{now - 90}",
            "last": "3",
        },
        "asked.example": {"rate": "20", "halt": "asked by its webmaster"},
        "gone.example": {"rate": "20", "gone": f"{now - 10}", "since": f"{now - 4000}"},
    }
    for host, fields in hashes.items():
        await redis.hset(c.pace_host_key(source, host), mapping=fields)
    await ask(redis, source, [*hashes, "new.example"])
    # The source's rate rose to 20/s for each host: fast and slow go at its pace now.
    await redis.delete(c.host_rate_key(source))
    await redis.set(c.pace_rate_key(source), "20")
    await ask(redis, source, ["fast.example", "slow.example"])


async def test_the_hosts_are_read_by_state_with_why_they_are_paced(redis: Redis) -> None:
    await seed_hosts(redis)
    hosts = await read_source_hosts(redis, SOURCE)
    assert hosts.counts == HostCounts(at_pace=2, paced=3, backed_off=1, halted=3)
    assert (hosts.source_rps, hosts.host_rate_rps) == (20.0, None)
    shown = {state: [r.host for r in rows] for state, rows in hosts.rows.items()}
    assert sorted(shown[c.HOST_HALTED]) == ["asked.example", "broken.example", "gone.example"]
    assert shown[c.HOST_BACKED_OFF] == ["cut.example"]
    assert sorted(shown[c.HOST_PACED]) == ["capped.example", "delayed.example", "new.example"]
    assert sorted(shown[c.HOST_AT_PACE]) == ["fast.example", "slow.example"]
    why = {row.host: why_text(row, hosts) for rows in hosts.rows.values() for row in rows}
    assert why["asked.example"] == "operator halt: asked by its webmaster"
    assert why["broken.example"].startswith("halted by its breaker until ")
    assert why["broken.example"].endswith("(4 failures in a row, 2 halts, failing for 90 s)")
    assert why["gone.example"].startswith("given up at ")
    assert "its URLs end as HostUnavailable" in why["gone.example"]
    assert why["cut.example"].startswith("cut by its server 5 s ago")
    assert why["delayed.example"] == "crawl-delay 3 s (its robots.txt)"
    assert why["capped.example"] == "its override, 0.5/s"
    assert why["new.example"].startswith("slow start")
    assert why["fast.example"] == "at the source's pace"
    rows = {row.host: row for rows in hosts.rows.values() for row in rows}
    assert effective_rps(rows["delayed.example"], 20.0) == pytest.approx(1 / 3)
    assert effective_rps(rows["fast.example"], 20.0) == 20.0
    assert effective_rps(rows["broken.example"], 20.0) == 0.0


async def test_at_most_top_of_each_state_the_most_recently_asked_about_first(
    redis: Redis,
) -> None:
    await redis.set(c.pace_rate_key(SOURCE), "100")
    for i in range(8):
        host = f"h{i}.example"
        await redis.hset(c.pace_host_key(SOURCE, host), mapping={"rate": f"{100 - i}"})
        await ask(redis, SOURCE, [host])
    hosts = await read_source_hosts(redis, SOURCE, per_state=3)
    assert hosts.counts == HostCounts(at_pace=1, paced=7)  # below 100/s: climbing
    assert [row.host for row in hosts.rows[c.HOST_PACED]] == [
        "h7.example",
        "h6.example",
        "h5.example",
    ]
    assert [row.host for row in hosts.rows[c.HOST_AT_PACE]] == ["h0.example"]
    assert why_text(hosts.rows[c.HOST_PACED][0], hosts) == "climbing to its ceiling, which rose"


def test_why_text_without_a_hash_says_the_state() -> None:
    hosts = SourceHosts("web", None, 10.0, 2.0, 1_700_000_000.0, {})
    row = HostRow("x.example", c.HOST_PACED, 1_700_000_000.0, {"why": "cap"})
    assert why_text(row, hosts) == "host_rate:web, 2/s"
    expired = HostRow("y.example", c.HOST_AT_PACE, 1_700_000_000.0, {})
    assert why_text(expired, hosts) == "at the source's pace"
    assert effective_rps(expired, 10.0) is None


async def test_the_command_prints_the_troubled_hosts_first(
    redis: Redis, redis_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    await seed_hosts(redis)
    monkeypatch.setenv("COLUMNS", "200")
    argv = ["status", "--hosts", "Web", "--redis", redis_url]
    assert await asyncio.to_thread(cli.run, argv) == EXIT_OK
    captured = capsys.readouterr()
    firsts = [line.split()[0] for line in captured.out.splitlines() if line.split()]
    order = [word for word in firsts if word.endswith(".example")]
    assert order.index("asked.example") < order.index("cut.example") < order.index("new.example")
    assert order.index("new.example") < order.index("fast.example")
    text = " ".join(captured.out.split())
    assert (
        "9 active (asked about in the last minute): 2 at the source's pace, 3 paced below it, "
        "1 backed off, 3 halted"
    ) in text
    assert " ".join(BACKLOG_UNKNOWN.replace("{source}", "web").split()) in text
    assert captured.err == ""


async def test_the_command_prints_json_and_names_an_unknown_source(
    redis: Redis, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    await seed_hosts(redis)
    argv = ["status", "--hosts", "web", "--json", "--top", "1", "--redis", redis_url]
    assert await asyncio.to_thread(cli.run, argv) == EXIT_OK
    document = json.loads(capsys.readouterr().out)
    assert document["counts"] == {
        "active": 9,
        "paced": 3,
        "backed_off": 1,
        "halted": 3,
        "at_pace": 2,
    }
    assert (document["source_rps"], document["host_rate_rps"]) == (20.0, None)
    assert [h["state"] for h in document["hosts"]] == [
        c.HOST_HALTED,
        c.HOST_BACKED_OFF,
        c.HOST_PACED,
        c.HOST_AT_PACE,
    ]
    cut = document["hosts"][1]
    assert cut["host"] == "cut.example" and cut["why"] == c.WHY_CUT
    assert cut["backlog"] is None and cut["rate_rps"] == pytest.approx(6.0, rel=0.1)

    argv = ["status", "--hosts", "nowhere", "--redis", redis_url]
    assert await asyncio.to_thread(cli.run, argv) == EXIT_OK
    captured = capsys.readouterr()
    assert "no host of nowhere asked about in the last 10 minutes" in " ".join(captured.out.split())
    assert "'nowhere' is not a source the monitor rates" in captured.err


async def test_status_shows_the_counts_the_pacing_script_indexed(
    redis: Redis, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    await seed_hosts(redis)
    argv = ["status", "--json", "--redis", redis_url]
    assert await asyncio.to_thread(cli.run, argv) == EXIT_OK
    document = json.loads(capsys.readouterr().out)
    (web,) = document["sources"]
    expected = {"active": 9, "paced": 3, "backed_off": 1, "halted": 3}
    assert web["hosts"] == document["general"]["hosts"] == expected
