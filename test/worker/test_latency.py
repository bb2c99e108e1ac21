"""The per-source response-time watch: what counts as much slower than usual (pure)."""

from __future__ import annotations

import math

import pytest

from worker.politeness.latency import Baseline, LatencyPolicy, LatencyWatch, judge

POLICY = LatencyPolicy()  # factor 3, margin 1 s, 10 samples before any verdict


def _warm(watch: LatencyWatch, source: str, response_s: float, n: int = 10) -> None:
    for _ in range(n):
        assert not watch.observe(source, response_s)


@pytest.mark.parametrize(
    ("baseline_s", "response_s", "slow"),
    [
        # Fast sources: the margin draws the line (max(0.3, 1.1) = 1.1 s).
        (0.1, 0.3, False),
        (0.1, 1.1, False),
        (0.1, 1.2, True),
        (0.01, 0.9, False),  # 90 times the usual, but under a second: no signal
        (0.0, 1.01, True),
        # Slow sources: the factor does (max(6, 3) = 6 s).
        (2.0, 3.5, False),
        (2.0, 6.0, False),
        (2.0, 6.1, True),
        (0.5, 1.5, False),  # the two lines meet at 0.5 s
        (0.5, 1.51, True),
    ],
)
def test_the_slow_line(baseline_s, response_s, slow):
    verdict = judge(Baseline(baseline_s, POLICY.min_samples), response_s, POLICY)
    assert verdict.slow is slow


@pytest.mark.parametrize("samples", range(10))
def test_no_verdict_before_enough_samples(samples):
    verdict = judge(Baseline(0.1, samples), 100.0, POLICY)
    assert not verdict.slow
    assert verdict.baseline.samples == samples + 1


def test_the_first_samples_are_a_plain_mean():
    watch = LatencyWatch()
    for t in (1.0, 2.0, 3.0, 4.0):
        watch.observe("s", t)
    assert watch.baseline("s") == Baseline(2.5, 4)


def test_a_cold_source_warms_up_then_gets_verdicts():
    watch = LatencyWatch()
    _warm(watch, "s", 0.1)
    assert watch.observe("s", 5.0)
    assert not watch.observe("s", 0.12)


def test_one_outlier_barely_moves_the_baseline():
    watch = LatencyWatch()
    _warm(watch, "s", 0.1)
    before = watch.baseline("s")
    assert before is not None
    assert watch.observe("s", 60.0)
    after = watch.baseline("s")
    assert after is not None
    # Counted as if it had come at the slow line (1.1 s), with the slow weight (0.05).
    assert after.mean_s == pytest.approx(before.mean_s + 0.05 * 1.0)
    assert not watch.observe("s", 1.1)


@pytest.mark.parametrize(("new_level_s", "most_signals"), [(2.0, 15), (10.0, 35), (60.0, 55)])
def test_a_lasting_rise_becomes_the_new_normal(new_level_s, most_signals):
    watch = LatencyWatch()
    _warm(watch, "s", 0.1)
    verdicts = [watch.observe("s", new_level_s) for _ in range(500)]
    signals = sum(verdicts)
    # Signals first (the monitor cuts the rate), then none: the rise is the usual now.
    assert 5 <= signals <= most_signals, signals
    assert verdicts == [True] * signals + [False] * (500 - signals)
    baseline = watch.baseline("s")
    assert baseline is not None and baseline.mean_s == pytest.approx(new_level_s, rel=0.01)


def test_a_fall_is_learnt_at_the_normal_weight():
    watch = LatencyWatch()
    _warm(watch, "s", 2.0)
    for _ in range(60):
        assert not watch.observe("s", 0.1)
    baseline = watch.baseline("s")
    assert baseline is not None and baseline.mean_s < 0.11
    assert watch.observe("s", 1.5)  # slow again against the new, faster usual


@pytest.mark.parametrize("response_s", [math.nan, math.inf, -0.5])
def test_times_that_are_not_measurements_are_ignored(response_s):
    watch = LatencyWatch()
    _warm(watch, "s", 0.1)
    before = watch.baseline("s")
    assert not watch.observe("s", response_s)
    assert watch.baseline("s") == before
    assert watch.baseline("new") is None
    assert not watch.observe("new", response_s)
    assert watch.baseline("new") == Baseline()


def test_sources_are_judged_by_their_own_usual():
    watch = LatencyWatch()
    _warm(watch, "fast", 0.05)
    _warm(watch, "slow", 3.0)
    assert watch.observe("fast", 2.0)
    assert not watch.observe("slow", 2.0)


def test_memory_is_one_small_record_per_source():
    watch = LatencyWatch()
    for i in range(10_000):
        watch.observe("s", 0.1 + (i % 7) / 100)
    baseline = watch.baseline("s")
    assert baseline is not None and baseline.samples == POLICY.min_samples  # never grows
    for source in ("a", "b", "c"):
        watch.observe(source, 0.1)
    assert len(watch) == 4
    watch.forget("a")
    watch.forget("never seen")
    assert len(watch) == 3 and watch.baseline("a") is None


def test_the_policy_is_configurable():
    policy = LatencyPolicy(factor=2.0, margin_s=0.0, min_samples=1)
    assert judge(Baseline(1.0, 1), 2.5, policy).slow
    assert not judge(Baseline(1.0, 1), 2.0, policy).slow


@pytest.mark.parametrize(
    "kwargs",
    [
        {"factor": 0.5},
        {"factor": math.nan},
        {"margin_s": -1.0},
        {"min_samples": 0},
        {"weight": 0.0},
        {"weight": 1.5},
        {"slow_weight": -0.1},
    ],
)
def test_nonsense_policies_are_refused(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        LatencyPolicy(**kwargs)
