"""The regulator's decision for one loop (``decide``), as tables: no Redis, no clock."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from crawl_monitor.policy.adaptive import AdaptiveSettings, Pace, start
from crawl_monitor.policy.decision import (
    HALTED_WHY,
    RATES_REWRITE_LOOPS,
    TEMP_HALTED_WHY,
    Decision,
    Memory,
    decide,
    plan_read,
)
from crawl_monitor.store import ObservedState, SourceState
from image_crawler.contract import (
    PACE_BACKOFF,
    PACE_CONFIGURED,
    PACE_FLOOR,
    PACE_HALTED,
    PACE_RECOVERING,
    PACE_STOPPED,
    PacingInfo,
)

NOW = 1000.0
SETTINGS = AdaptiveSettings()
NEW_TERM = Memory()


def observed(
    sources: dict[str, SourceState] | None = None,
    *,
    halted: frozenset[str] = frozenset(),
    temp_halted: frozenset[str] = frozenset(),
    signals: dict[str, int] | None = None,
    delays: dict[str, str | None] | None = None,
    exempt: frozenset[str] = frozenset(),
) -> ObservedState:
    return ObservedState(
        halted=halted,
        temp_halted=temp_halted,
        sources=sources or {},
        failure_counters={},
        backoff_signals=signals or {},
        crawl_delays=delays or {},
        robots_exempt=exempt,
    )


def loop(
    seen: ObservedState,
    memory: Memory = NEW_TERM,
    computed: dict[str, float] | None = None,
    now: float = NOW,
) -> Decision:
    computed = {"src": 50.0} if computed is None else computed
    return decide(
        seen, computed, memory, plan_read(computed, memory, 5), now_s=now, adaptive=SETTINGS
    )


def after_a_loop(paces: dict[str, Pace] | None = None, **fields) -> Memory:
    """The memory of a regulator that has run a loop (nothing was halted)."""
    return Memory(loops=1, halted=frozenset(), paces=paces or {}, **fields)


def at(effective: float, *, seen: int = 0, cut: float | None = None, state: str) -> Pace:
    return Pace(effective, 50.0, state, "", seen, NOW - 1, cut)


BAD_WINDOW = {"500": 10, "200": 10}
PUSHBACK = {"503": 30, "200": 10}


@pytest.mark.parametrize(
    ("seen", "memory", "expected"),
    [
        # (pace_rate, PacingInfo state, origin, halt, temp_halt, lift, clear_window, events)
        pytest.param(
            observed(),
            Memory(),
            (50.0, PACE_CONFIGURED, "computed", set(), set(), set(), set(), []),
            id="first-loop",
        ),
        pytest.param(
            observed({"src": SourceState(override="5", override_alias="9")}),
            after_a_loop(),
            (5.0, PACE_CONFIGURED, "override_rate:", set(), set(), set(), set(), []),
            id="override",
        ),
        pytest.param(
            observed({"src": SourceState(override="0")}),
            after_a_loop(),
            (0.0, PACE_STOPPED, "override_rate:", set(), set(), set(), set(), []),
            id="override-of-0",
        ),
        pytest.param(
            observed({"src": SourceState(override="fast", override_alias="7")}),
            after_a_loop(),
            (
                *(7.0, PACE_CONFIGURED, "override-rate:", set(), set(), set(), set()),
                ["override_ignored"],
            ),
            id="override-not-a-rate",
        ),
        pytest.param(
            observed(halted=frozenset({"src"})),
            Memory(loops=1, halted=frozenset({"src"})),
            (0.0, PACE_HALTED, "computed", set(), set(), set(), set(), []),
            id="halted",
        ),
        pytest.param(
            observed({"src": SourceState(window=BAD_WINDOW, override="5")}),
            Memory(loops=1, halted=frozenset({"src"}), paces={"src": at(0.1, state=PACE_FLOOR)}),
            (
                *(5.0, PACE_CONFIGURED, "override_rate:", set(), set(), set(), {"src"}),
                ["crawl_resumed"],
            ),
            id="resumed",
        ),
        pytest.param(
            observed({"src": SourceState(window=BAD_WINDOW)}),
            after_a_loop(),
            (0.0, PACE_HALTED, "computed", set(), {"src"}, set(), set(), ["crawl_halted"]),
            id="temporary-trip",
        ),
        pytest.param(
            observed({"src": SourceState(window=BAD_WINDOW)}, temp_halted=frozenset({"src"})),
            after_a_loop(),
            (0.0, PACE_HALTED, "computed", set(), set(), set(), set(), []),
            id="temporary-stays",
        ),
        pytest.param(
            observed(temp_halted=frozenset({"src"})),
            after_a_loop(),
            (
                *(50.0, PACE_CONFIGURED, "computed", set(), set(), {"src"}, set()),
                ["temporary_halt_lifted"],
            ),
            id="temporary-lifted",
        ),
        pytest.param(
            observed({"src": SourceState(last_statuses={"500": 50})}),
            after_a_loop(),
            (0.0, PACE_HALTED, "computed", {"src"}, set(), set(), set(), ["crawl_halted"]),
            id="permanent-trip",
        ),
        pytest.param(
            observed({"src": SourceState(window=PUSHBACK)}, signals={"src": 30}),
            after_a_loop({"src": start(50.0, 0, NOW - 1)}),
            (35.0, PACE_BACKOFF, "computed", set(), set(), set(), set(), ["pacing_changed"]),
            id="backoff-cut-not-a-breaker-error",
        ),
        pytest.param(
            observed({"src": SourceState(window=PUSHBACK)}, signals={"src": 30}),
            after_a_loop({"src": at(35.0, seen=30, cut=NOW - 1, state=PACE_BACKOFF)}),
            (35.5, PACE_RECOVERING, "computed", set(), set(), set(), set(), []),
            id="recovering",
        ),
        pytest.param(
            observed(signals={"src": 31}),
            after_a_loop({"src": at(0.12, seen=30, cut=NOW - 1, state=PACE_RECOVERING)}),
            (0.1, PACE_FLOOR, "computed", set(), set(), set(), set(), ["pacing_changed"]),
            id="cut-to-the-floor",
        ),
        pytest.param(
            observed({"src": SourceState(window=PUSHBACK)}, signals={"src": 31}),
            after_a_loop({"src": at(0.1, seen=30, cut=NOW - 1, state=PACE_FLOOR)}),
            (0.0, PACE_HALTED, "computed", set(), {"src"}, set(), set(), ["crawl_halted"]),
            id="pushback-at-the-floor-trips",
        ),
        pytest.param(
            observed(signals={"src": 30}),
            after_a_loop({"src": at(49.9, seen=30, cut=NOW - 99, state=PACE_RECOVERING)}),
            (50.0, PACE_CONFIGURED, "computed", set(), set(), set(), set(), ["pacing_changed"]),
            id="recovered",
        ),
    ],
)
def test_decide(seen, memory, expected):
    pace_rate, state, origin, halt, temp_halt, lift, clear, event_names = expected
    decision = loop(seen, memory)
    writes = decision.writes
    assert writes.pace_rates == {"src": pytest.approx(pace_rate)}
    info = decision.snapshot.pacing["src"]
    assert (info.rate_rps, info.state, info.origin) == (pytest.approx(pace_rate), state, origin)
    assert (set(writes.halt), set(writes.temp_halt), set(writes.lift_temp_halt)) == (
        halt,
        temp_halt,
        lift,
    )
    assert set(writes.clear_window) == clear
    assert [e.event for e in decision.events] == event_names
    if state == PACE_HALTED:
        assert info.why == (HALTED_WHY if "src" in decision.snapshot.halted else TEMP_HALTED_WHY)


def test_a_cut_is_reported_with_its_reason():
    decision = loop(observed(signals={"src": 3}), after_a_loop({"src": start(50.0, 0, NOW - 1)}))
    (event,) = decision.events
    assert event.level == "info"
    assert event.fields == {
        "source": "src",
        "state": PACE_BACKOFF,
        "previous_state": PACE_CONFIGURED,
        "rate_rps": 35.0,
        "configured_rps": 50.0,
        "why": "3 backoff signals in the last second: cut to 0.7 x",
    }
    assert decision.snapshot.pacing["src"].why == event.fields["why"]


def test_a_halted_source_s_rate_waits_for_it():
    memory = after_a_loop({"src": at(20.0, seen=5, cut=NOW - 1, state=PACE_BACKOFF)})
    halted = observed({"src": SourceState(window=BAD_WINDOW)}, temp_halted=frozenset({"src"}))
    for second in range(60):
        # Signals of requests that were in flight when it was halted come in.
        seen = dataclasses.replace(halted, backoff_signals={"src": 5 + second})
        decision = loop(seen, memory, None, NOW + second)
        assert decision.writes.pace_rates == {"src": 0.0}
        memory = decision.memory
    assert memory.paces["src"].effective_rps == 20.0
    # Lifted: it climbs from where it was, owing no cut for those signals.
    back = loop(
        observed(temp_halted=frozenset({"src"}), signals={"src": 64}), memory, None, NOW + 60
    )
    assert back.writes.lift_temp_halt == {"src"}
    assert back.writes.pace_rates == {"src": pytest.approx(20.5)}


def test_crawl_rates_gets_its_changed_fields_and_is_rewritten_whole_now_and_then():
    computed = {"a": 1.0, "b": 2.0, "c": 3.0}
    first = loop(observed(), Memory(), computed)
    assert first.writes.pacing_whole and set(first.writes.pacing) == {"a", "b", "c"}
    quiet = loop(observed(), first.memory, computed, NOW + 1)
    assert (quiet.writes.pacing_whole, dict(quiet.writes.pacing)) == (False, {})
    assert quiet.writes.pacing_gone == set()
    # The same objects while nothing changed: the store encodes them once.
    assert all(quiet.snapshot.pacing[s] is first.snapshot.pacing[s] for s in computed)
    changed = loop(
        observed({"b": SourceState(override="4")}), quiet.memory, {"a": 1.0, "b": 2.0}, NOW + 2
    )
    assert set(changed.writes.pacing) == {"b"}
    assert changed.writes.pacing["b"].rate_rps == 4.0
    assert set(changed.writes.pacing_gone) == {"c"}
    memory = changed.memory
    wholes = []
    for k in range(3, 3 + 2 * RATES_REWRITE_LOOPS):
        decision = loop(observed(), memory, {"a": 1.0, "b": 2.0}, NOW + k)
        wholes.append(decision.writes.pacing_whole)
        memory = decision.memory
    assert wholes.count(True) == 2
    assert wholes.index(True) == RATES_REWRITE_LOOPS - 3  # 30 loops after the first


def test_unreadable_keys_and_ignored_overrides_are_reported_once():
    bad = observed({"src": SourceState(override="x", errors=("status60s:src: WRONGTYPE",))})
    first = loop(bad, after_a_loop())
    assert [e.event for e in first.events] == ["redis_key_unreadable", "override_ignored"]
    assert loop(bad, first.memory).events == ()
    fixed = loop(observed(), first.memory)
    assert fixed.memory.reported_overrides == {}
    again = loop(bad, fixed.memory)
    assert [e.event for e in again.events] == ["override_ignored"]


def test_decide_leaves_its_inputs_as_they_were():
    memory = after_a_loop(
        {"src": at(35.0, seen=3, cut=NOW - 1, state=PACE_BACKOFF)},
        reported_overrides={"override_rate:src": "x"},
        last_statuses={"src": {"200": 3}, "gone": {"200": 1}},
    )
    seen = observed({"src": SourceState(last_statuses={"200": 50})}, signals={"src": 9})
    before = copy.deepcopy((memory, seen))
    decision = loop(seen, memory)
    assert (memory, seen) == before
    assert decision.memory.reported_overrides == {}
    assert decision.memory.last_statuses == {"src": {"200": 50}}
    assert decision.memory.loops == memory.loops + 1


@pytest.mark.parametrize(
    ("loops", "full"),
    [(0, None), (1, {"b", "g"}), (2, {"c"}), (5, {"a", "f"}), (6, {"b", "g"})],
)
def test_plan_read_reads_the_last_50_lists_in_turn(loops, full):
    computed = dict.fromkeys("gfedcba", 1.0)
    plan = plan_read(computed, dataclasses.replace(Memory(), loops=loops), 5)
    assert list(plan.sources) == sorted(computed)
    assert plan.full_last_statuses == (None if full is None else frozenset(full))


CAPPED_10S = "robots.txt Crawl-delay 10 s: at most 0.1/s"


@pytest.mark.parametrize(
    ("seen", "memory", "expected"),
    [
        # (pace_rate, configured, PacingInfo state, origin, why, forget, events)
        pytest.param(
            observed(delays={"src": "10"}),
            after_a_loop({"src": start(50.0, 0, NOW - 1)}),
            (0.1, 0.1, PACE_CONFIGURED, "crawl_delay", CAPPED_10S, set(), []),
            id="cap-binds-at-once",
        ),
        pytest.param(
            observed(delays={"src": "0.01"}),
            after_a_loop(),
            (50.0, 50.0, PACE_CONFIGURED, "computed", "at its configured rate", set(), []),
            id="cap-above-the-configured-rate-does-not-bind",
        ),
        pytest.param(
            observed({"src": SourceState(override="5")}, delays={"src": "2.5"}),
            after_a_loop(),
            (
                *(0.4, 0.4, PACE_CONFIGURED, "crawl_delay"),
                *("robots.txt Crawl-delay 2.5 s: at most 0.4/s", set(), []),
            ),
            id="an-override-does-not-lift-the-cap",
        ),
        pytest.param(
            observed({"src": SourceState(override="0.2")}, delays={"src": "2"}),
            after_a_loop(),
            (0.2, 0.2, PACE_CONFIGURED, "override_rate:", "at its configured rate", set(), []),
            id="an-override-below-the-cap",
        ),
        pytest.param(
            observed({"src": SourceState(override="0")}, delays={"src": "2"}),
            after_a_loop(),
            (0.0, 0.0, PACE_STOPPED, "override_rate:", "stopped: configured at 0", set(), []),
            id="an-override-of-0-below-the-cap",
        ),
        pytest.param(
            observed(delays={"src": "10"}, exempt=frozenset({"src"})),
            after_a_loop(),
            (50.0, 50.0, PACE_CONFIGURED, "computed", "at its configured rate", set(), []),
            id="exempt-ignores-the-cap",
        ),
        pytest.param(
            observed(delays={"src": "3600"}),
            after_a_loop(),
            (
                *(1 / 3600, 1 / 3600, PACE_CONFIGURED, "crawl_delay"),
                *("robots.txt Crawl-delay 3600 s: at most 0.000278/s", set(), []),
            ),
            id="a-delay-as-written-the-worker-capped-it",
        ),
        pytest.param(
            observed(delays={"src": None, "gone": None, "other": "5"}),
            after_a_loop({"src": start(0.1, 0, NOW - 1)}, pacing={}),
            (
                50.0,
                50.0,
                PACE_CONFIGURED,
                "computed",
                "at its configured rate",
                {"src", "gone"},
                [],
            ),
            id="key-expired-cap-lifted-member-forgotten",
        ),
        pytest.param(
            observed(delays={"src": "10"}, halted=frozenset({"src"})),
            Memory(loops=1, halted=frozenset({"src"})),
            (0.0, 0.1, PACE_HALTED, "crawl_delay", HALTED_WHY, set(), []),
            id="halted-under-a-cap",
        ),
        pytest.param(
            observed(delays={"src": "1"}, signals={"src": 4}),
            after_a_loop({"src": start(50.0, 3, NOW - 1)}),
            (
                *(0.7, 1.0, PACE_BACKOFF, "crawl_delay"),
                "1 backoff signal in the last second: cut to 0.7 x; "
                "robots.txt Crawl-delay 1 s: at most 1/s",
                set(),
                ["pacing_changed"],
            ),
            id="adaptive-cuts-below-the-cap",
        ),
        pytest.param(
            observed(delays={"src": "0.1"}),
            after_a_loop({"src": Pace(30.0, 50.0, PACE_RECOVERING, "", 0, NOW - 1, NOW - 9)}),
            (
                *(10.0, 10.0, PACE_CONFIGURED, "crawl_delay"),
                *("robots.txt Crawl-delay 0.1 s: at most 10/s", set(), ["pacing_changed"]),
            ),
            id="recovering-above-a-new-cap-drops-to-it",
        ),
        pytest.param(
            observed(delays={"src": "0.1"}),
            after_a_loop({"src": Pace(5.0, 50.0, PACE_RECOVERING, "", 0, NOW - 1, NOW - 9)}),
            (
                *(5.1, 10.0, PACE_RECOVERING, "crawl_delay"),
                "recovering +0.1/s, last cut 9 s ago; robots.txt Crawl-delay 0.1 s: at most 10/s",
                set(),
                [],
            ),
            id="recovering-below-a-new-cap-climbs-to-it",
        ),
        *(
            pytest.param(
                observed(delays={"src": bad}),
                after_a_loop(),
                (
                    *(50.0, 50.0, PACE_CONFIGURED, "computed", "at its configured rate"),
                    *(set(), ["crawl_delay_ignored"]),
                ),
                id=f"bad-value-{bad or 'empty'}",
            )
            for bad in ["ten", "0", "-5", "nan", "inf", ""]
        ),
    ],
)
def test_crawl_delay_caps_the_configured_rate(seen, memory, expected):
    pace_rate, configured, state, origin, why, forget, event_names = expected
    decision = loop(seen, memory)
    assert decision.writes.pace_rates == {"src": pytest.approx(pace_rate)}
    assert decision.snapshot.rates == {"src": pytest.approx(configured)}
    info = decision.snapshot.pacing["src"]
    # crawl_rates' rate_rps is rounded to 6 decimals.
    assert (info.rate_rps, info.configured_rps) == (
        pytest.approx(pace_rate, abs=1e-6),
        pytest.approx(configured),
    )
    assert (info.state, info.origin, info.why) == (state, origin, why)
    assert set(decision.writes.forget_crawl_delayed) == forget
    assert [e.event for e in decision.events] == event_names


def test_a_crawl_delay_that_is_not_a_delay_is_reported_once():
    bad = observed(delays={"src": "soon", "other": "-1"})
    first = loop(bad, after_a_loop())
    assert [e.fields for e in first.events] == [
        {"key": f"crawl_delay:{s}", "value": v, "reason": "not a number of seconds > 0"}
        for s, v in [("other", "-1"), ("src", "soon")]
    ]
    assert {e.level for e in first.events} == {"warning"}
    assert loop(bad, first.memory).events == ()
    changed = loop(observed(delays={"src": "never", "other": "-1"}), first.memory)
    assert [e.fields["value"] for e in changed.events] == ["never"]
    fixed = loop(observed(delays={"src": "10"}), changed.memory)
    assert (fixed.events, fixed.memory.reported_crawl_delays) == ((), {})
    assert fixed.writes.pace_rates == {"src": pytest.approx(0.1)}
    assert [e.event for e in loop(bad, fixed.memory).events] == ["crawl_delay_ignored"] * 2


def test_a_cap_follows_its_delay_and_lifts_when_it_expires():
    memory = after_a_loop({"src": start(50.0, 0, NOW - 1)})
    rates = []
    for second, delay in enumerate(["10", "10", "2", None, None]):
        seen = observed(delays={} if delay is None else {"src": delay})
        decision = loop(seen, memory, None, NOW + second)
        rates.append(decision.writes.pace_rates["src"])
        memory = decision.memory
    # At its configured rate, a source follows the cap down and back up at once.
    assert rates == [pytest.approx(r) for r in (0.1, 0.1, 0.5, 50.0, 50.0)]
    assert decision.snapshot.pacing["src"].origin == "computed"


# --- a new term takes over the last leader's cuts ---------------------------------------


def published(rate: float, state: str = PACE_RECOVERING, age_s: float | None = 4.0) -> str:
    """A crawl_rates record of a source configured at 50/s, as a leader writes it."""
    at = None if age_s is None else NOW - age_s
    return PacingInfo(rate, 50.0, "computed", state, "why", at).to_json().decode()


def test_a_new_term_starts_each_source_from_the_rate_the_last_leader_published():
    computed = dict.fromkeys(
        ["cut", "floor", "overridden", "delayed", "halted", "new", "stale", "bad", "calm"], 50.0
    )
    seen = dataclasses.replace(
        observed(
            {"overridden": SourceState(override="10")},
            temp_halted=frozenset({"halted"}),
            delays={"delayed": "0.5"},
            signals={"cut": 40},
        ),
        sources={
            "overridden": SourceState(override="10"),
            "halted": SourceState(window=BAD_WINDOW),
        },
        published={
            "cut": published(17.2),
            "floor": published(0.1, PACE_FLOOR),
            "overridden": published(17.2),  # the override (10/s) wins
            "delayed": published(17.2),  # so does a Crawl-delay (2/s)
            "halted": published(17.2),  # temp-halted now: it waits at its cut
            "stale": published(17.2, age_s=3600),
            "bad": "{not json",
            "calm": published(50.0, PACE_CONFIGURED),
            "gone": published(3.0),  # a source the new leader does not know
        },
    )
    first = loop(seen, NEW_TERM, computed)
    assert first.writes.pace_rates == pytest.approx(
        {
            "cut": 17.2,
            "floor": 0.1,
            "overridden": 10.0,
            "delayed": 2.0,
            "halted": 0.0,
            "new": 50.0,
            "stale": 50.0,
            "bad": 50.0,
            "calm": 50.0,
        }
    )
    pacing = first.snapshot.pacing
    assert pacing["cut"].state == PACE_RECOVERING
    assert pacing["cut"].decided_at_s == NOW  # the new record's time: the new leader's
    assert (pacing["overridden"].state, pacing["overridden"].origin) == (
        PACE_CONFIGURED,
        "override_rate:",
    )
    assert first.memory.paces["halted"].effective_rps == pytest.approx(17.2)
    # The floor: a source that was there is recovering, and says so.
    assert [(e.event, e.fields.get("source")) for e in first.events] == [
        ("pacing_changed", "floor"),
        ("pacing_inherited", None),
    ]
    assert first.events[-1].level == "info"
    assert first.events[-1].fields == {
        "sources": 9,
        "inherited": 3,  # cut, floor, halted
        "capped": 2,  # overridden, delayed
        "uncut": 1,  # calm
        "stale": 1,
        "untimed": 0,
        "malformed": 1,  # bad
        "new": 1,
        "max_age_s": 600.0,
    }

    # From there on, the cut climbs back and is cut again as the last leader's would:
    # +0.5/s a second without signals, x 0.7 on new ones (counted from the first reading).
    later = observed(signals={"cut": 40}, temp_halted=frozenset({"halted"}))
    second = loop(later, first.memory, computed, NOW + 1)
    assert second.writes.pace_rates["cut"] == pytest.approx(17.7)
    third = loop(observed(signals={"cut": 43}), second.memory, computed, NOW + 2)
    assert third.writes.pace_rates["cut"] == pytest.approx(17.7 * 0.7)
    assert not [e for e in [*second.events, *third.events] if e.event == "pacing_inherited"]


def test_a_taken_over_floor_keeps_backoff_statuses_breaker_errors():
    # At the floor the last leader counted its 503s as errors: so does the new one, which
    # starting afresh (at 50/s, above the floor) would have excused them.
    seen = dataclasses.replace(
        observed({"src": SourceState(window=PUSHBACK)}, signals={"src": 31}),
        published={"src": published(0.1, PACE_FLOOR)},
    )
    decision = loop(seen, NEW_TERM)
    assert set(decision.writes.temp_halt) == {"src"}
    afresh = loop(dataclasses.replace(seen, published={}), NEW_TERM)
    assert set(afresh.writes.temp_halt) == set()
    assert afresh.writes.pace_rates == {"src": 50.0}


def test_only_a_term_s_first_loop_reads_and_takes_over_what_was_published():
    assert plan_read({"src": 50.0}, NEW_TERM, 5).published
    assert not plan_read({"src": 50.0}, after_a_loop(), 5).published
    # Mid-term, a record is what this leader wrote itself: its memory rules.
    seen = dataclasses.replace(observed(), published={"src": published(17.2)})
    decision = loop(seen, after_a_loop({"src": start(50.0, 0, NOW - 1)}))
    assert decision.writes.pace_rates == {"src": 50.0}
    assert decision.events == ()
    # Nothing read (a store that was not asked): nothing taken over, nothing logged.
    assert loop(observed(), NEW_TERM).events == ()
