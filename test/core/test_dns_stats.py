"""The workers' DNS figures as operators read them (image_crawler/dns_stats.py): a report
and its JSON, what a field that is none reads as, the sum over the workers reporting
now, and the hit ratio."""

from __future__ import annotations

import json

import pytest

from image_crawler import contract as c
from image_crawler.dns_stats import (
    DnsFigures,
    DnsReport,
    crawl_dns,
    figures,
    parse_report,
    parse_reports,
)

NOW = 1_800_000_000.0


def test_a_report_reads_back_as_itself() -> None:
    report = DnsReport("host:12", figures(7, 93, {"timeout": 1, "nxdomain": 2}, 50), NOW)
    assert parse_report("host:12", report.to_json()) == report
    # Failures in the kinds' order, whatever order they were counted in.
    assert list(report.figures.failures) == ["nxdomain", "timeout"]


@pytest.mark.parametrize(
    "raw",
    [
        "not json",
        "[]",
        json.dumps({"queries": 1, "hits": 2}),  # no time
        json.dumps({"queries": -1, "hits": 2, "at": NOW}),
        json.dumps({"queries": "1", "hits": 2, "at": NOW}),
        json.dumps({"queries": True, "hits": 2, "at": NOW}),
        json.dumps({"queries": 1, "hits": 2, "at": "later"}),
        json.dumps({"queries": 1, "hits": 2, "at": NOW, "failures": {"nxdomain": "x"}}),
        json.dumps({"queries": 1, "hits": 2, "at": NOW, "failures": [1]}),
        '{"queries": 1, "hits": 2, "at": Infinity}',
    ],
)
def test_a_field_that_is_no_report_reads_as_none(raw: str) -> None:
    assert parse_report("w", raw) is None


def test_the_fields_read_as_reports_by_name_leaving_out_the_others() -> None:
    one = DnsReport("b:1", figures(1, 1, {}, 1), NOW)
    two = DnsReport("a:2", figures(2, 0, {}, 2), NOW)
    fields = {b"b:1": one.to_json(), "a:2": two.to_json().encode(), "c:3": "{}"}
    assert parse_reports(fields) == (two, one)


def test_the_crawl_s_figures_are_the_sum_of_the_workers_reporting_now() -> None:
    reports = [
        DnsReport("a:1", figures(100, 900, {"nxdomain": 4}, 80), NOW - 3),
        DnsReport("b:2", figures(50, 150, {"nxdomain": 1, "servfail": 2}, 40), NOW - 10),
        # Stopped reporting: shown as such, counted nowhere.
        DnsReport("c:3", figures(999, 0, {"timeout": 9}, 9), NOW - c.DNS_STALE_S - 0.1),
    ]
    total = crawl_dns(reports, NOW)
    assert total == DnsFigures(150, 1050, {"nxdomain": 5, "servfail": 2}, 120)
    assert total is not None
    assert (total.lookups, total.failed) == (1200, 7)
    assert total.hit_ratio == pytest.approx(1050 / 1200)
    assert [r.stale(NOW) for r in reports] == [False, False, True]
    assert reports[2].age_s(NOW) == pytest.approx(c.DNS_STALE_S + 0.1)
    # None reporting: no figures, which is not the same as zeros.
    assert crawl_dns(reports[2:], NOW) is None
    assert crawl_dns([], NOW) is None


def test_no_lookup_yet_is_no_ratio_and_a_clock_a_little_behind_no_negative_age() -> None:
    assert DnsFigures().hit_ratio is None
    assert DnsReport("w", DnsFigures(), NOW + 0.5).age_s(NOW) == 0.0
