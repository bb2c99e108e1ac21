"""``status --json``: every field, numbers as numbers, the sources in the order and
count asked for."""

from __future__ import annotations

import json
from typing import Any

import pytest
from redis.asyncio import Redis

from crawlctl.status.json_view import status_json
from crawlctl.status.model import (
    CrawlStatus,
    parse_status,
    read_status,
)
from test.crawlctl.test_status_model import (
    SORTABLE,
    payload,
    seed_backlog,
    seed_host_index,
    seed_rechecks,
    source,
)


async def seeded_document(redis: Redis) -> dict[str, Any]:
    """The ``--json`` document of ``seed_backlog`` and ``seed_rechecks``, read back."""
    await seed_backlog(redis)
    await seed_rechecks(redis)
    await seed_host_index(redis, "busy")
    document = status_json(await read_status(redis))
    # Strict JSON: no NaN or Infinity anywhere (an endless ETA is null).
    document = json.loads(json.dumps(document, allow_nan=False))
    return document


@pytest.mark.timing("asserts the backlog age is read within 2 s of its seeding (7 <= age < 9)")
async def test_the_json_has_every_field_with_numbers_as_numbers(redis: Redis) -> None:
    document = await seeded_document(redis)
    assert document["version"] == 1
    general = document["general"]
    assert set(general) == {
        "sources", "sources_shown", "sort", "successes", "errors", "split", "malformed",
        "effective_rps", "configured_rps", "backlog", "backlog_age_s", "backlog_stale",
        "eta_s", "eta_source", "stalled_sources", "stalled_backlog", "unknown_eta_sources",
        "errors_by_reason", "rechecks", "urls_lost", "hosts", "paused", "dns", "dns_errors",
        "placements", "duplicates", "duplicate_share",
    }  # fmt: skip
    assert set(document) == {"version", "general", "sources", "dns_workers"}
    # No worker reports its resolver: no figures, not zeros.
    assert general["dns"] is None and document["dns_workers"] == []
    assert general["dns_errors"] == 0
    assert general["paused"] is None
    assert general["sources"] == general["sources_shown"] == 6 and general["sort"] == "backlog"
    assert (general["successes"], general["errors"], general["split"]) == (13224, 9, 20000)
    assert general["backlog"] == 2_105_712 and 7 <= general["backlog_age_s"] < 9
    assert general["backlog_stale"] is False
    assert general["eta_s"] == pytest.approx(2_055_000 / 178.4)
    assert general["eta_source"] == "flickr"
    assert (general["stalled_sources"], general["stalled_backlog"]) == (1, 300)
    assert general["unknown_eta_sources"] == 1  # orphan: no rate
    assert general["errors_by_reason"] == {
        "503": 40, "500": 11, "Timeout": 9, "404": 1, "ConnectionError": 1}  # fmt: skip
    assert general["urls_lost"] == 120
    assert general["hosts"] == {"active": 3, "paced": 1, "backed_off": 1, "halted": 0}
    # Only the statuses there are, in the contract's order; "nowhere" counts too.
    assert list(general["rechecks"].items()) == [
        ("unchanged", 52),
        ("changed", 3),
        ("gone", 6),
        ("failed", 2),
    ]


async def test_each_source_in_the_json_has_every_field(redis: Redis) -> None:
    document = await seeded_document(redis)
    assert [s["name"] for s in document["sources"]] == [
        "flickr", "busy", "broken", "orphan", "met", "phylopic"]  # fmt: skip
    by_name = {s["name"]: s for s in document["sources"]}
    assert by_name["busy"] == {
        "name": "busy",
        "backlog": 50400,
        "eta_s": 3600.0,
        "eta_state": "draining",
        "effective_rps": 14.0,
        "configured_rps": 50.0,
        "rate_origin": "override_rate:",
        "pacing_state": "backoff",
        "pacing_why": "cut to 14/s: 3 backoff signals (503)",
        "pace_rate_rps": 14.0,
        "next_slot_in_s": by_name["busy"]["next_slot_in_s"],
        "successes": 0,
        "errors": 0,
        "errors_by_reason": {"503": 40, "500": 9, "Timeout": 9, "ConnectionError": 1},
        "rechecks": {"unchanged": 40, "failed": 2},
        "last_statuses": {},
        "urls_lost": 120,
        "halted": False,
        "temp_halted": False,
        "override_rps": 50.0,
        "robots_disallowed": 0,
        "no_index": 0,
        "robots_exempt": False,
        "crawl_delay_s": None,
        "hosts": {"active": 3, "paced": 1, "backed_off": 1, "halted": 0},
        # The deduplication stage placed none of its images (dedup_placements).
        "placements": {},
        "duplicates": 0,
        "duplicate_share": None,
    }
    assert by_name["flickr"]["hosts"] is None  # no host index
    assert 40 < by_name["busy"]["next_slot_in_s"] <= 42
    assert (by_name["broken"]["eta_s"], by_name["broken"]["eta_state"]) == (None, "halted")
    assert (by_name["met"]["eta_s"], by_name["met"]["eta_state"]) == (0.0, "empty")
    assert (by_name["orphan"]["eta_s"], by_name["orphan"]["eta_state"]) == (None, "unknown")
    phylopic = by_name["phylopic"]
    assert (phylopic["backlog"], phylopic["eta_state"], phylopic["configured_rps"]) == (
        None, "unknown", 0.2)  # fmt: skip
    assert phylopic["pacing_state"] is None  # an older monitor's plain rate
    assert phylopic["rechecks"] == {}
    assert list(by_name["flickr"]["rechecks"]) == ["unchanged", "changed", "gone"]


def test_the_json_of_an_unmeasured_crawl_says_so() -> None:
    general = status_json(CrawlStatus((source("a", rate_rps=1.0),), 0, 0, 0, 0))["general"]
    assert general["backlog"] is None and general["backlog_age_s"] is None
    assert general["backlog_stale"] is True and general["eta_s"] is None


def test_the_json_has_no_nan_or_infinity_whatever_redis_holds() -> None:
    raw = {
        "rate": json.dumps(
            {"rate_rps": "nan", "configured_rps": "inf", "origin": "", "state": "", "why": ""}
        ),
        "pace_rate": "inf",
        "pace_next": "inf",
        "override": "-inf",
        "backlog": "12",
    }
    document = status_json(parse_status(payload(raw)))
    (only,) = document["sources"]
    assert json.loads(json.dumps(document, allow_nan=False))["sources"] == [only]
    assert only["effective_rps"] is None and only["configured_rps"] is None
    assert only["pace_rate_rps"] is None and only["next_slot_in_s"] is None
    assert only["override_rps"] is None and only["eta_s"] is None


def test_the_json_follows_sort_and_top() -> None:
    document = status_json(CrawlStatus(tuple(SORTABLE), 0, 0, 0, 0), sort="eta", top=2)
    assert [s["name"] for s in document["sources"]] == ["d", "b"]
    assert (document["general"]["sources"], document["general"]["sources_shown"]) == (5, 2)
