"""The ``monitoring_update`` event: its pure contents and a reading of a seeded Redis."""

from __future__ import annotations

import pytest
from redis.exceptions import ResponseError
from structlog.testing import capture_logs

from crawl_monitor.backlog import Backlog
from crawl_monitor.monitoring import Counters, MonitoringLog, build_update, read_counters
from crawl_monitor.policy.decision import RegulatorSnapshot
from crawl_monitor.regulator import Regulator
from crawl_monitor.store import RedisRegulatorStore
from image_crawler import contract as c
from test.harness.crawl import GENERAL_KEYS, PACING_KEYS, SPECIFIC_KEYS

AT_RATE = "at its configured rate"
CUT = "3 backoff signals in the last second: cut to 0.7 x"
# Beyond the original (issue 18): the backlog and the ETA, in general and per source, and
# how many sources ``specific`` left out.
BACKLOG_KEYS = {"backlog", "eta_s"}
GENERAL_BACKLOG_KEYS = BACKLOG_KEYS | {"specific_omitted"}
# Beyond the original (issue 30): a source's re-checks by status, only when it has any.
RECHECK_KEYS = {"rechecks"}


def snapshot(**overrides) -> RegulatorSnapshot:
    fields = {
        "rates": {"flickr": 178.5, "phylopic": 0.2, "met": 10.0, "idle": 1.0, "slow": 8.0},
        "pacing": {
            "flickr": c.PacingInfo(178.5, 178.5, "computed", c.PACE_CONFIGURED, AT_RATE),
            "phylopic": c.PacingInfo(0.0, 0.2, "computed", c.PACE_HALTED, "temporarily"),
            "met": c.PacingInfo(0.0, 10.0, "override_rate:", c.PACE_HALTED, "halted"),
            "idle": c.PacingInfo(1.0, 1.0, "computed", c.PACE_CONFIGURED, AT_RATE),
            "slow": c.PacingInfo(5.6, 8.0, "computed", c.PACE_BACKOFF, CUT),
        },
        "halted": frozenset({"met"}),
        "temp_halted": frozenset({"phylopic"}),
        "last_statuses": {"flickr": {"200": 50}, "phylopic": {"500": 7, "200": 3}},
    }
    fields.update(overrides)
    return RegulatorSnapshot(**fields)


def test_build_update():
    before = Counters(num_resized=100, resize_errors=10, num_split=1000)
    now = Counters(
        num_resized=150,
        resize_errors=20,
        num_split=3000,
        successful={"flickr": 140, "phylopic": 10},
        errors={"phylopic": 20},
    )
    update = build_update(now, before, 5.0, snapshot())
    assert update.general == {
        "global_max_rps": 185.1,  # flickr, idle and slow as cut: the halted ones do not count
        "error_rps": 2.0,
        "processing_rate": 12.0,
        "success_rps": 10.0,
        "circuit_breaker_tripped": ["met", "phylopic"],
        "num_resized": 150,
        "resize_errors": 20,
        "split_rate": 400.0,
        # No backlog measured yet.
        "backlog": None,
        "eta_s": None,
        "specific_omitted": 0,
    }
    unmeasured = {"backlog": None, "eta_s": None}
    assert update.specific == {
        "flickr": {
            "successful": 140,
            "error": 0,
            "last_50_statuses": {"200": 50},
            "rate_limit": 178.5,
            "effective_rate": 178.5,
            "pacing": c.PACE_CONFIGURED,
            "pacing_why": AT_RATE,
            **unmeasured,
        },
        "met": {
            "successful": 0,
            "error": 0,
            "last_50_statuses": {},
            "rate_limit": 10.0,
            "effective_rate": 0.0,
            "pacing": c.PACE_HALTED,
            "pacing_why": "halted",
            **unmeasured,
        },
        "phylopic": {
            "successful": 10,
            "error": 20,
            "last_50_statuses": {"200": 3, "500": 7},
            "rate_limit": 0.2,
            "effective_rate": 0.0,
            "pacing": c.PACE_HALTED,
            "pacing_why": "temporarily",
            **unmeasured,
        },
        # Held below its rate: listed, though it has done nothing since the last event.
        "slow": {
            "successful": 0,
            "error": 0,
            "last_50_statuses": {},
            "rate_limit": 8.0,
            "effective_rate": 5.6,
            "pacing": c.PACE_BACKOFF,
            "pacing_why": CUT,
            **unmeasured,
        },
    }  # "idle" has done nothing and is left out


def test_rechecks_are_in_a_sources_entry_only_when_it_has_any():
    now = Counters(
        successful={"flickr": 140},
        rechecks={
            "flickr": {c.CHECK_UNCHANGED: 12, c.CHECK_CHANGED: 3, c.CHECK_GONE: 1},
            # Re-checked and nothing else: listed for its re-checks alone.
            "archive": {c.CHECK_FAILED: 2},
        },
    )
    update = build_update(now, None, 5.0, snapshot())
    assert update.specific["flickr"]["rechecks"] == {"unchanged": 12, "changed": 3, "gone": 1}
    assert list(update.specific["flickr"]["rechecks"]) == ["unchanged", "changed", "gone"]
    assert update.specific["archive"] == {
        "successful": 0,
        "error": 0,
        "last_50_statuses": {},
        "rate_limit": 0.0,
        "effective_rate": 0.0,
        "pacing": None,
        "pacing_why": None,
        "backlog": None,
        "eta_s": None,
        "rechecks": {"failed": 2},
    }
    # The others' entries keep their keys, with no empty "rechecks".
    assert set(update.specific) == {"archive", "flickr", "met", "phylopic", "slow"}
    for source in ("met", "phylopic", "slow"):
        assert set(update.specific[source]) == SPECIFIC_KEYS | PACING_KEYS | BACKLOG_KEYS
    assert set(update.general) == GENERAL_KEYS | GENERAL_BACKLOG_KEYS


@pytest.mark.parametrize(
    ("before", "elapsed_s", "success_rps"),
    [
        (None, 5.0, 0.0),  # no earlier reading: no rate yet
        (Counters(num_resized=40), 0.0, 0.0),
        (Counters(num_resized=40), 2.0, 5.0),
        (Counters(num_resized=90), 4.0, 0.0),  # the counter went down (Redis flushed)
    ],
)
def test_rates_are_growth_per_second(before, elapsed_s, success_rps):
    update = build_update(Counters(num_resized=50), before, elapsed_s, None)
    assert update.general["success_rps"] == success_rps
    assert update.general["global_max_rps"] == 0
    assert update.general["circuit_breaker_tripped"] == []
    assert update.specific == {}


class Monotonic:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_seeded_redis_is_reported(redis):
    rates = {"flickr": 100.0, "animaldiversity": 0.5, "broken": 2.0, "quiet": 3.0}
    await redis.set("override_rate:flickr", "150")
    await redis.sadd(c.HALTED_SET, "broken")
    await redis.rpush(c.last50_key("flickr"), *["200"] * 48, "404", "500")
    await redis.rpush(c.last50_key("animaldiversity"), *["200"] * 18)
    await redis.rpush(c.last50_key("broken"), *["500"] * 30)
    await redis.mset(
        {
            c.NUM_RESIZED: 1000,
            c.RESIZE_ERRORS: 31,
            c.NUM_SPLIT: 5000,
            c.num_resized_key("flickr"): 982,
            c.resize_errors_key("flickr"): 1,
            c.num_resized_key("animaldiversity"): 18,
            c.resize_errors_key("broken"): 30,
        }
    )
    await redis.hset(
        c.RECHECKS_HASH,
        mapping={
            c.rechecks_field("flickr", c.CHECK_UNCHANGED): 12,
            c.rechecks_field("flickr", c.CHECK_CHANGED): 3,
            c.rechecks_field("flickr", c.CHECK_GONE): 1,
            c.rechecks_field("flickr", c.CHECK_FAILED): 0,  # none: left out
            c.rechecks_field("quiet", c.CHECK_FAILED): 2,
            c.rechecks_field("animaldiversity", c.CHECK_GONE): "x",  # no count: left out
            c.rechecks_field("animaldiversity", c.CHECK_CHANGED): "1.5",  # no count either
            c.rechecks_field("broken", "teapot"): 4,  # no status of the contract
            c.rechecks_field("broken", ""): 4,  # no status
            "broken": 4,  # no status, nor source
            c.rechecks_field("stranger", c.CHECK_GONE): 7,  # no known source: left out
        },
    )
    regulator = Regulator(RedisRegulatorStore(redis), lambda: rates)
    await regulator.tick()
    await redis.incrby(c.backoff_signals_key("quiet"), 2)  # its server pushed back
    await regulator.tick()
    clock = Monotonic()
    # "queued" is no known source: the splitter made its topic, nothing crawls it.
    backlog = Backlog({"flickr": 3000, "broken": 40, "queued": 12}, 1_700_000_000.0)
    monitoring = MonitoringLog(
        redis, lambda: regulator.snapshot, 5.0, backlog=lambda: backlog, clock=clock
    )
    await monitoring.baseline()
    await redis.incrby(c.NUM_RESIZED, 50)
    await redis.incrby(c.RESIZE_ERRORS, 5)
    await redis.incrby(c.NUM_SPLIT, 2000)
    clock.now += 5.0
    with capture_logs() as logs:
        update = await monitoring.report()

    (event,) = [e for e in logs if e["event"] == "monitoring_update"]
    assert event["general"] == update.general
    assert event["specific"] == update.specific
    assert set(event["general"]) == GENERAL_KEYS | GENERAL_BACKLOG_KEYS
    assert all(
        set(v) - RECHECK_KEYS == SPECIFIC_KEYS | PACING_KEYS | BACKLOG_KEYS
        for v in event["specific"].values()
    )
    assert {s for s, v in event["specific"].items() if "rechecks" in v} == {
        "flickr",
        "quiet",
    }
    assert event["general"] == {
        "global_max_rps": 152.6,  # overridden flickr, animaldiversity and quiet as cut
        "error_rps": 1.0,
        "processing_rate": 11.0,
        "success_rps": 10.0,
        "circuit_breaker_tripped": ["broken"],
        "num_resized": 1050,
        "resize_errors": 36,
        "split_rate": 400.0,
        "backlog": 3052,
        "eta_s": 20,  # flickr's; halted broken and unknown queued wait outside it
        "specific_omitted": 0,
    }
    assert event["specific"] == {
        "animaldiversity": {
            "successful": 18,
            "error": 0,
            "last_50_statuses": {"200": 18},
            "rate_limit": 0.5,
            "effective_rate": 0.5,
            "pacing": c.PACE_CONFIGURED,
            "pacing_why": AT_RATE,
            "backlog": 0,
            "eta_s": 0,
        },
        "broken": {
            "successful": 0,
            "error": 30,
            "last_50_statuses": {"500": 30},
            "rate_limit": 2.0,
            "effective_rate": 0.0,
            "pacing": c.PACE_HALTED,
            "pacing_why": "halted: an operator must resume it",
            "backlog": 40,
            "eta_s": None,  # never, unless an operator resumes it
        },
        "flickr": {
            "successful": 982,
            "error": 1,
            "last_50_statuses": {"200": 48, "404": 1, "500": 1},
            "rate_limit": 150.0,
            "effective_rate": 150.0,
            "pacing": c.PACE_CONFIGURED,
            "pacing_why": AT_RATE,
            "backlog": 3000,
            "eta_s": 20,
            "rechecks": {"unchanged": 12, "changed": 3, "gone": 1},
        },
        "queued": {
            "successful": 0,
            "error": 0,
            "last_50_statuses": {},
            "rate_limit": 0.0,
            "effective_rate": 0.0,
            "pacing": None,
            "pacing_why": None,
            "backlog": 12,
            "eta_s": None,
        },
        "quiet": {
            "successful": 0,
            "error": 0,
            "last_50_statuses": {},
            "rate_limit": 3.0,
            "effective_rate": 2.1,
            "pacing": c.PACE_BACKOFF,
            "pacing_why": "2 backoff signals in the last second: cut to 0.7 x",
            "backlog": 0,
            "eta_s": 0,
            "rechecks": {"failed": 2},
        },
    }
    # The metrics read this reading instead of Redis.
    assert monitoring.counters is not None
    assert monitoring.counters.successful == {"flickr": 982, "animaldiversity": 18}
    assert monitoring.counters.rechecks == {
        "flickr": {"unchanged": 12, "changed": 3, "gone": 1},
        "quiet": {"failed": 2},
    }


async def test_the_counters_are_three_gets_four_mgets_and_two_hgetalls(redis):
    """Whatever the number of sources: the re-checks and the deduplication stage's
    placements cost one HGETALL each, not a key each."""
    await redis.hset(c.RECHECKS_HASH, c.rechecks_field("source0007", c.CHECK_GONE), 3)
    await redis.hset(c.PLACEMENTS_HASH, c.placements_field("source0008", "near"), 2)
    await redis.set(c.resize_errors_key("source0009", c.Status.DNS_ERROR), 4)
    await redis.config_resetstat()
    counters = await read_counters(redis, [f"source{i:04}" for i in range(1000)])
    stats = await redis.info("commandstats")
    calls = {name.removeprefix("cmdstat_"): stat["calls"] for name, stat in stats.items()}
    assert {name: calls.get(name) for name in ("get", "mget", "hgetall")} == {
        "get": 3,
        "mget": 4,
        "hgetall": 2,
    }
    assert counters.rechecks == {"source0007": {"gone": 3}}
    assert counters.placements == {"source0008": {"near": 2}}
    assert counters.dns_errors == {"source0009": 4}


async def test_without_known_sources_the_rechecks_are_not_read(redis):
    await redis.hset(c.RECHECKS_HASH, c.rechecks_field("flickr", c.CHECK_GONE), 3)
    await redis.config_resetstat()
    assert (await read_counters(redis, [])).rechecks == {}
    assert "cmdstat_hgetall" not in await redis.info("commandstats")


async def test_the_placements_of_known_sources_are_read_in_the_order_of_the_kinds(redis):
    await redis.hset(
        c.PLACEMENTS_HASH,
        mapping={
            c.placements_field("flickr", "unique"): 278,
            c.placements_field("flickr", "near"): 2,
            c.placements_field("flickr", "exact"): 10,
            c.placements_field("met", "teapot"): 4,  # no kind of the contract
            c.placements_field("met", "near"): "many",  # no count
            c.placements_field("met", "exact"): 0,  # none: left out
            c.placements_field("stranger", "near"): 7,  # no known source
        },
    )
    counters = await read_counters(redis, ["flickr", "met"])
    assert counters.placements == {"flickr": {"exact": 10, "near": 2, "unique": 278}}
    assert list(counters.placements["flickr"]) == list(c.DUPLICATE_KINDS)
    await redis.delete(c.PLACEMENTS_HASH)
    await redis.set(c.PLACEMENTS_HASH, "not-a-hash")
    assert (await read_counters(redis, ["flickr"])).placements == {}


async def test_a_rechecks_hash_of_another_type_reads_as_no_rechecks(redis):
    await redis.set(c.num_resized_key("flickr"), 5)
    await redis.set(c.RECHECKS_HASH, "not-a-hash")
    counters = await read_counters(redis, ["flickr"])
    assert (counters.successful, counters.rechecks) == ({"flickr": 5}, {})
    # The other counters are read as before: a global one of another type is an error.
    await redis.rpush(c.NUM_RESIZED, "not-a-count")
    with pytest.raises(ResponseError):
        await read_counters(redis, ["flickr"])


def busy(successful: dict[str, int]) -> Counters:
    return Counters(successful=successful)


def test_top_sources_keeps_the_halted_then_the_busiest_then_the_largest_backlogs():
    before = busy({"flickr": 100, "met": 50, "idle": 7})
    now = busy({"flickr": 110, "met": 80, "idle": 7, "phylopic": 1})
    backlog = Backlog({"idle": 900, "slow": 10, "flickr": 5, "met": 5}, 0.0)
    cases = {
        # phylopic (temporarily halted) and met (halted), then met's 30 and flickr's 10
        # URLs since the last event, then idle's and slow's backlogs.
        2: ["met", "phylopic"],
        3: ["flickr", "met", "phylopic"],
        4: ["flickr", "idle", "met", "phylopic"],
        5: ["flickr", "idle", "met", "phylopic", "slow"],
    }
    for top, kept in cases.items():
        update = build_update(now, before, 5.0, snapshot(), backlog, top_sources=top)
        assert sorted(update.specific) == kept, top
        assert update.general["specific_omitted"] == 5 - len(kept)
    # 0: no cap; a cap above the count changes nothing.
    for top in (0, 5, 100):
        update = build_update(now, before, 5.0, snapshot(), backlog, top_sources=top)
        assert len(update.specific) == 5
        assert update.general["specific_omitted"] == 0


@pytest.mark.parametrize(
    ("waiting", "eta_s"),
    [
        ({}, 0),  # measured, nothing waits
        ({"flickr": 357}, 2),  # 357 / 178.5
        ({"flickr": 357, "slow": 56}, 10),  # slow's 56 / 5.6 is the longest
        ({"met": 1000, "phylopic": 10}, None),  # only halted sources wait: never
        ({"met": 1000, "idle": 3}, 3),  # the halted source waits outside it
        ({"unknown": 50}, 0),  # not a known source: not crawled, outside the ETA
    ],
)
def test_backlog_and_eta_in_general(waiting, eta_s):
    update = build_update(Counters(), None, 5.0, snapshot(), Backlog(waiting, 0.0))
    assert update.general["backlog"] == sum(waiting.values())
    assert update.general["eta_s"] == eta_s


def test_no_regulator_snapshot_no_eta():
    """A standby monitor (no snapshot) still reports the backlog, not an ETA it cannot know."""
    update = build_update(Counters(), None, 5.0, None, Backlog({"flickr": 10}, 0.0))
    assert update.general["backlog"] == 10
    assert update.general["eta_s"] is None
    assert update.specific["flickr"]["backlog"] == 10
    assert update.specific["flickr"]["eta_s"] is None


def test_rates_are_rounded_for_the_log():
    rates = {"flickr": 17.123456789, "tiny": 1 / 3600}
    pacing = {
        "flickr": c.PacingInfo(11.9864297, 17.123456789, "computed", c.PACE_BACKOFF, CUT),
        "tiny": c.PacingInfo(1 / 3600, 1 / 3600, "override_rate:", c.PACE_BACKOFF, CUT),
    }
    update = build_update(
        Counters(), None, 5.0, snapshot(rates=rates, pacing=pacing, last_statuses={})
    )
    assert update.specific["flickr"]["rate_limit"] == 17.1235
    assert update.specific["flickr"]["effective_rate"] == 11.9864
    assert update.specific["tiny"]["rate_limit"] == 0.000277778
