"""The per-host rule (worker/politeness/hosts.py), pure: keys, slow start, AIMD, the
breaker, ceilings, the round robin, and what the host index says of a host (why it is
paced as it is, when its member is written). Its Lua twin is held to it in
test_lua_twins.py."""

import dataclasses
import math

import idna
import pytest
import yarl

from image_crawler import contract as c
from worker.__main__ import URL_HOSTS_DECODED, keep_decoded_hosts
from worker.politeness.hosts import (
    CLEAN,
    F_FAILS,
    F_GONE,
    F_HALT,
    F_HALTS,
    F_OVERRIDE,
    F_SINCE,
    F_UNTIL,
    FAILED,
    FLAG_GONE,
    FLAG_HALTED,
    FLAG_OPERATOR,
    NO_REPORT,
    REFUSED,
    UNREAD,
    HostAsk,
    HostKey,
    HostReport,
    HostSettings,
    HostState,
    ScoreRange,
    answer_kind,
    blocked,
    ceiling_rps,
    decide_source,
    fields_of,
    host_interval,
    host_of,
    host_step,
    host_why,
    indexed,
    key_of,
    round_robin_grant,
)

S = HostSettings()
NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("url", "pacing_key", "host"),
    [
        ("http://Images.Example.ORG/a.jpg", "host", "images.example.org"),
        ("https://images.example.org:8443/a.jpg", "host", "images.example.org"),
        ("http://images.example.org./a.jpg", "host", "images.example.org"),
        ("http://images.example.co.uk/a.jpg", "domain", "example.co.uk"),
        ("http://a.b.blogspot.com/x.jpg", "domain", "b.blogspot.com"),  # a private suffix
        ("http://127.0.0.2:8080/x.jpg", "domain", "127.0.0.2"),
        ("http://[::1]/x.jpg", "host", "::1"),
        ("not a url", "host", ""),
    ],
)
def test_the_key_is_the_lower_cased_host_or_its_registered_domain(url, pacing_key, host):
    assert key_of("s", url, pacing_key) == HostKey("s", host)


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        ("200", CLEAN),
        ("404", CLEAN),
        ("UnidentifiedImageError", CLEAN),
        ("403", CLEAN),
        ("429", REFUSED),
        ("503", REFUSED),
        ("Timeout", REFUSED),
        ("500", FAILED),
        ("502", FAILED),
        ("ConnectionError", FAILED),
        ("ServerDisconnected", FAILED),
    ],
)
def test_what_an_answer_says_of_its_host(status, kind):
    assert answer_kind(status) == kind


@pytest.mark.parametrize(
    ("source", "host_rate", "override", "settings", "ceiling"),
    [
        (40.0, None, None, S, 40.0),
        (40.0, 5.0, None, S, 5.0),
        (40.0, 80.0, None, S, 40.0),  # never above the source's rate
        (40.0, 5.0, 2.0, S, 2.0),  # the host's own override beats host_rate
        (40.0, None, None, HostSettings(max_host_rps=10.0), 10.0),
        (40.0, 5.0, None, HostSettings(max_host_rps=10.0), 5.0),
        (40.0, -1.0, None, S, 40.0),  # not a rate: ignored
    ],
)
def test_a_host_s_ceiling(source, host_rate, override, settings, ceiling):
    assert ceiling_rps(source, host_rate, override, settings) == ceiling


def test_a_new_host_starts_at_one_request_a_second_and_grows_on_clean_answers():
    state = host_step(HostState(), NO_REPORT, 50.0, NOW, S)
    assert (state.rate, state.slow) == (1.0, True)
    state = host_step(state, HostReport(clean=1, last=CLEAN), 50.0, NOW + 1, S)
    assert state.rate == 3.0
    state = host_step(state, HostReport(clean=3, last=CLEAN), 50.0, NOW + 1.4, S)
    assert state.rate == 9.0
    state = host_step(state, HostReport(clean=30, last=CLEAN), 50.0, NOW + 1.8, S)
    assert (state.rate, state.slow) == (50.0, False)  # at its ceiling: slow start over


def test_a_host_below_its_ceiling_starts_there():
    assert host_step(HostState(), NO_REPORT, 0.2, NOW, S).rate == 0.2


def test_a_signal_cuts_once_per_cooldown_and_ends_the_slow_start():
    state = HostState(rate=20.0, slow=True)
    signal = HostReport(signals=1, refused=1, last=REFUSED)
    state = host_step(state, signal, 50.0, NOW, S)
    assert (state.rate, state.slow, state.cut_at) == (14.0, False, NOW)
    assert host_step(state, signal, 50.0, NOW + 0.5, S).rate == 14.0  # held
    assert host_step(state, signal, 50.0, NOW + 1.0, S).rate == pytest.approx(9.8)
    # The signal that ends a slow start can cut deeper (slow_start_exit_factor).
    deeper = dataclasses.replace(S, slow_start_exit_factor=0.5)
    assert host_step(HostState(rate=20.0, slow=True), signal, 50.0, NOW, deeper).rate == 10.0


@pytest.mark.parametrize(
    ("rate", "after_s", "climbed"),
    [
        (10.0, 1.0, 10.2),  # 2% of its own rate a second, whatever its ceiling (50)
        (10.0, 2.0, 10.4),
        # No answer for 4 s (idle, or starved of its source's slots): counted as 2 s.
        (10.0, 4.0, 10.4),
        (0.2, 1.0, 0.21),  # at least 0.01/s a second
    ],
)
def test_without_signals_it_climbs_back_by_2_percent_of_its_own_rate_a_second(
    rate, after_s, climbed
):
    state = HostState(rate=rate, climb_at=NOW)
    state = host_step(state, HostReport(clean=5, last=CLEAN), 50.0, NOW + after_s, S)
    assert state.rate == pytest.approx(climbed)


def test_never_below_the_floor():
    state = HostState(rate=0.12, climb_at=NOW)
    signal = HostReport(signals=1, refused=1, last=REFUSED)
    assert host_step(state, signal, 50.0, NOW, S).rate == S.floor_rps


def test_five_failures_halt_it_then_each_halt_is_longer_and_an_hour_gives_it_up():
    state = HostState(rate=10.0)
    state = host_step(state, HostReport(failed=4, last=FAILED), 10.0, NOW, S)
    assert blocked(state, NOW) == ""
    state = host_step(state, HostReport(failed=1, last=FAILED), 10.0, NOW + 1, S)
    assert (blocked(state, NOW + 1), state.until) == (FLAG_HALTED, NOW + 31)
    # After the halt one probe; its failure halts it again, twice as long.
    state = host_step(state, HostReport(failed=1, last=FAILED), 10.0, NOW + 32, S)
    assert state.until == NOW + 32 + 60
    state = host_step(state, HostReport(failed=1, last=FAILED), 10.0, NOW + 3601, S)
    assert blocked(state, NOW + 3601) == FLAG_GONE


def test_refusals_are_failures_only_at_the_floor_and_a_clean_answer_ends_the_streak():
    refused = HostReport(signals=5, refused=5, last=REFUSED)
    assert host_step(HostState(rate=10.0, cut_at=NOW), refused, 50.0, NOW, S).fails == 0
    at_floor = host_step(HostState(rate=0.1, cut_at=NOW), refused, 50.0, NOW, S)
    assert blocked(at_floor, NOW) == FLAG_HALTED
    clean = host_step(at_floor, HostReport(clean=1, last=CLEAN), 50.0, NOW + 40, S)
    assert (clean.fails, clean.since, clean.halts) == (0, None, 0)


def test_an_operator_s_halt_beats_everything():
    assert blocked(HostState(halt="asked", gone=NOW), NOW) == FLAG_OPERATOR


def test_hosts_share_their_source_s_slots_in_turn_and_each_keeps_its_own_interval():
    asks = [HostAsk(None, 1.0, 5), HostAsk(NOW + 0.01, 0.001, 5), HostAsk(None, 0.0, 0)]
    granted = round_robin_grant(NOW, None, 0.01, asks, 0.05)
    assert granted.slots[0] == (NOW,)  # one a second for this host
    assert granted.slots[1] == pytest.approx(
        (NOW + 0.01, NOW + 0.02, NOW + 0.03, NOW + 0.04, NOW + 0.05)
    )
    assert granted.slots[2] == ()
    assert granted.source_next == pytest.approx(NOW + 0.06)
    assert math.isclose(granted.host_next[0], NOW + 1.0)


# --- what the host index says of a host ---------------------------------------------------

DELAYED = {"delay_s": 3.0, "delay_until": NOW + 60}


@pytest.mark.parametrize(
    ("state", "source_rps", "ceiling", "why"),
    [
        (HostState(rate=40.0), 40.0, 40.0, c.WHY_PACE),
        (HostState(rate=80.0), 40.0, 40.0, c.WHY_PACE),  # capped at its source's rate
        (HostState(rate=40.0, **DELAYED), 0.2, 0.2, c.WHY_PACE),  # a delay under 5 s
        (HostState(rate=40.0, **DELAYED), 40.0, 40.0, c.WHY_CRAWL_DELAY),
        (HostState(rate=0.1, cut_at=NOW, **DELAYED), 40.0, 40.0, c.WHY_CUT),  # 10 s > 3 s
        (HostState(rate=3.0, slow=True), 40.0, 40.0, c.WHY_SLOW_START),
        (HostState(rate=0.5, slow=True), 40.0, 0.5, c.WHY_CAP),  # at its ceiling already
        (HostState(rate=3.0, slow=True, **DELAYED), 40.0, 40.0, c.WHY_CRAWL_DELAY),
        (HostState(rate=14.0, cut_at=NOW - 5), 40.0, 40.0, c.WHY_CUT),
        (HostState(rate=14.0), 40.0, 40.0, c.WHY_CLIMB),  # below a ceiling that rose
        (HostState(rate=2.0), 40.0, 2.0, c.WHY_CAP),
        (HostState(rate=2.0, cut_at=NOW - 500), 40.0, 2.0, c.WHY_CAP),  # climbed back
        (HostState(rate=2.0, override=2.0), 40.0, 2.0, c.WHY_CAP),
        (HostState(rate=40.0, until=NOW + 30), 40.0, 40.0, c.WHY_BREAKER),
        (HostState(rate=40.0, gone=NOW - 1, until=NOW + 30), 40.0, 40.0, c.WHY_GONE),
        (HostState(rate=40.0, halt="asked", gone=NOW), 40.0, 40.0, c.WHY_OPERATOR),
    ],
)
def test_why_a_host_is_paced_as_it_is(state, source_rps, ceiling, why):
    interval = host_interval(state, ceiling, NOW)
    assert host_why(state, blocked(state, NOW), ceiling, source_rps, interval) == why


def test_each_why_is_in_one_state():
    assert set(c.HOST_WHY.values()) == set(c.HOST_STATES)
    assert c.HOST_WHY[c.WHY_CUT] == c.HOST_BACKED_OFF
    assert {w for w, state in c.HOST_WHY.items() if state == c.HOST_HALTED} == {
        c.WHY_BREAKER,
        c.WHY_OPERATOR,
        c.WHY_GONE,
    }


@pytest.mark.parametrize(
    ("why", "seen", "due"),
    [
        (None, None, True),  # never written
        (c.WHY_PACE, NOW - 3, False),
        (c.WHY_CUT, NOW - 3, True),  # its state changed: at once
        (c.WHY_PACE, NOW - S.index_refresh_s, True),
        (c.WHY_PACE, NOW + 5, True),  # in the future: a clock that jumped back
    ],
)
def test_a_host_s_member_is_written_when_due(why, seen, due):
    state = HostState(rate=40.0, why=why, seen=seen)
    written = indexed(state, c.WHY_PACE, NOW, S)
    assert (written is not state) == due
    if due:
        assert (written.why, written.seen) == (c.WHY_PACE, NOW)


def test_a_source_s_round_writes_the_due_members_and_trims_their_bands():
    hosts = [
        (HostState(rate=40.0, halt="asked"), NO_REPORT, 1),
        (HostState(rate=40.0, why=c.WHY_PACE, seen=NOW - 1), NO_REPORT, 1),  # not due
        (HostState(), NO_REPORT, 1),  # new: slow start
    ]
    decided = decide_source(NOW, 40.0, None, None, hosts, 0.05, S)
    assert decided.indexed == (
        c.host_index_score(c.HOST_HALTED, NOW),
        None,
        c.host_index_score(c.HOST_PACED, NOW),
    )
    assert [state.why for state in decided.states] == [c.WHY_OPERATOR, c.WHY_PACE, c.WHY_SLOW_START]
    band = c.HOST_INDEX_BAND
    assert decided.trimmed == (
        ScoreRange(band, band + NOW - S.idle_s),
        ScoreRange(3 * band, 3 * band + NOW - S.idle_s),
    )


@pytest.mark.parametrize("state", c.HOST_STATES)
def test_an_index_score_says_the_state_and_the_time(state):
    entry = c.HostIndexEntry.of(c.host_index_score(state, NOW + 0.123))
    assert entry.state == state
    assert entry.asked_at_s == pytest.approx(NOW + 0.123, abs=1e-5)
    assert c.HostIndexEntry.of(-5.0).state is None
    assert c.HostIndexEntry.of(len(c.HOST_STATES) * c.HOST_INDEX_BAND).state is None


def test_the_fields_operators_write_are_the_rule_s():
    fields = fields_of(HostState())
    assert {c.HOST_HALT_FIELD, c.HOST_OVERRIDE_FIELD, c.HOST_EXPIRES_FIELD} <= set(fields)
    assert c.HOST_BREAKER_FIELDS == (F_FAILS, F_SINCE, F_UNTIL, F_HALTS, F_GONE)
    assert (c.HOST_HALT_FIELD, c.HOST_OVERRIDE_FIELD) == (F_HALT, F_OVERRIDE)


def test_a_host_reached_once_its_source_has_no_slot_left_is_not_read():
    # At 10/s one slot falls within the horizon: the first host takes it; the second,
    # with nothing to report, is left unread (its state as it was, asked again when the
    # source has a slot); the third, with answers to report, is read and stepped.
    hosts = [
        (HostState(rate=10.0), NO_REPORT, 1),
        (HostState(rate=10.0, fails=3), NO_REPORT, 1),
        (HostState(rate=10.0, slow=True), HostReport(clean=2, last=CLEAN), 1),
    ]
    decided = decide_source(NOW, 10.0, None, None, hosts, 0.05, S)
    assert decided.unread == (False, True, False)
    assert decided.states[1] is hosts[1][0] and decided.indexed[1] is None
    assert decided.answers[1].slots == () and decided.answers[1].interval_s == UNREAD
    assert decided.answers[1].next_s == pytest.approx(0.1 - 0.05)  # the source's next slot
    assert [len(a.slots) for a in decided.answers] == [1, 0, 0]
    assert decided.states[2].rate == 10.0  # stepped: slow start to its ceiling


def test_a_host_name_is_decoded_once_while_a_few_thousand_others_are_in_flight(monkeypatch):
    """The worker keeps more decoded host names than yarl's default (256): a long tail's
    hosts are each read again by their next requests (worker/__main__.py)."""
    decoded: list[bytes] = []
    real = idna.decode

    def counted(name: bytes) -> str:
        decoded.append(name)
        return real(name)

    monkeypatch.setattr(idna, "decode", counted)
    keep_decoded_hosts()
    try:
        hosts = [f"h{i}.decoded-once.test" for i in range(URL_HOSTS_DECODED // 4)]
        for _ in range(3):  # a new host's robots.txt, tdmrep.json and image
            assert [host_of(f"http://{host}/a.jpg") for host in hosts] == hosts
        assert len(decoded) == len(hosts)
    finally:
        yarl.cache_configure()  # yarl's defaults again for the other tests
