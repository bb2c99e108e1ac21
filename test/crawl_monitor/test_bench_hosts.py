"""bench --hosts: the origin's loopback hosts and their robots.txt Crawl-delay, what it
counts of the requests it was asked, the URLs spread over the hosts, and the ratio of
the many-host crawl's throughput to the one-host crawl's with its verdict and rows."""

from __future__ import annotations

import copy
import dataclasses
import ipaddress
import json
import os
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench import report
from bench.corpus import CorpusFile
from bench.crawl import _tasks, origin_requests, source_names
from bench.hosts import hosts_figures
from bench.origin import MAX_HOSTS, Requests, host_addresses, robots_txt
from bench.services import Origin, origin_stats
from image_crawler import contract as c


@pytest.mark.parametrize(
    ("count", "first", "last"),
    [
        (1, "127.1.0.1", "127.1.0.1"),
        (250, "127.1.0.1", "127.1.0.250"),
        (251, "127.1.0.1", "127.1.1.1"),
        (1000, "127.1.0.1", "127.1.3.250"),
        (MAX_HOSTS, "127.1.0.1", "127.1.255.250"),
    ],
)
def test_host_addresses_are_distinct_loopback_addresses(count: int, first: str, last: str) -> None:
    addresses = host_addresses(count)
    assert (len(addresses), addresses[0], addresses[-1]) == (count, first, last)
    assert len(set(addresses)) == count
    parsed = [ipaddress.ip_address(a) for a in addresses]
    assert all(a in ipaddress.ip_network("127.0.0.0/8") for a in parsed)
    assert "127.0.0.1" not in addresses
    assert not any(a.endswith((".0", ".255")) for a in addresses)


def test_host_addresses_are_bounded() -> None:
    assert host_addresses(0) == []
    for wrong in (-1, MAX_HOSTS + 1):
        with pytest.raises(ValueError, match="hosts"):
            host_addresses(wrong)


def test_the_robots_txt_says_only_the_crawl_delay() -> None:
    assert robots_txt(1.0) == "User-agent: *\nCrawl-delay: 1\n"
    assert robots_txt(0.5) == "User-agent: *\nCrawl-delay: 0.5\n"


def test_requests_count_kinds_and_the_gaps_of_each_delayed_host() -> None:
    requests = Requests(crawl_delay_s=1.0)
    # (kind, host or None for the unlimited address, arrival time)
    for kind, host, now in [
        ("robots", "127.1.0.1", 10.0),
        ("image", None, 10.1),  # the unlimited host: no gaps counted
        ("image", None, 10.2),
        ("tdmrep", "127.1.0.1", 11.0),  # 1.0 s: not under the delay
        ("image", "127.1.0.2", 11.1),
        ("image", "127.1.0.1", 11.95),  # 0.95 s: under the delay, not under 0.9 of it
        ("image", "127.1.0.2", 11.5),  # 0.4 s
        ("image_304", "127.1.0.1", 13.0),
    ]:
        requests.note(kind, host, now)

    summary = requests.summary()
    assert summary["by_kind"] == {"robots": 1, "image": 5, "tdmrep": 1, "image_304": 1}
    assert summary["hosts_asked"] == 2
    assert (summary["requests_per_host_min"], summary["requests_per_host_max"]) == (2, 4)
    assert (summary["gaps"], summary["gaps_under_delay"], summary["gaps_under_90_percent"]) == (
        4,
        2,
        1,
    )
    assert summary["min_gap_s"] == pytest.approx(0.4)
    assert summary["hosts_under_90_percent"] == 1
    (example,) = summary["hosts_under_90_percent_examples"].items()
    assert example[0] == "127.1.0.2"
    assert example[1]["gap_s"] == pytest.approx(0.4)
    assert (example[1]["after"], example[1]["kind"]) == ("image", "image")
    assert example[1]["at"] == "1970-01-01T00:00:11.500+00:00"
    gaps = [0.4, 0.95, 1.0, 2.0]
    assert summary["gap_s_at"] == pytest.approx(
        {"1%": gaps[0], "5%": gaps[0], "25%": gaps[0], "50%": gaps[1]}
    )
    json.dumps(summary)  # what /_stats answers

    empty = Requests(crawl_delay_s=1.0).summary()
    assert (empty["hosts_asked"], empty["min_gap_s"], empty["requests_per_host_min"]) == (
        0,
        None,
        None,
    )


def test_origin_requests_are_those_of_the_window() -> None:
    before = {"by_kind": {"robots": 64, "tdmrep": 64, "image": 64}, "hosts_asked": 64}
    after = {
        "by_kind": {"robots": 1000, "tdmrep": 1000, "image": 2064, "other": 3},
        "hosts_asked": 1000,
        "gaps": 3000,
    }
    seen = origin_requests(before, after, wall_s=4.0)
    assert seen["by_kind"] == {"image": 2000, "other": 3, "robots": 936, "tdmrep": 936}
    assert seen["per_s"] == {"image": 500.0, "other": 0.75, "robots": 234.0, "tdmrep": 234.0}
    # The hosts' figures are the origin's so far (a host's gaps span the windows).
    assert seen["delayed_hosts"] == {"hosts_asked": 1000, "gaps": 3000}
    assert origin_requests({}, {}, wall_s=0.0) == {"by_kind": {}, "per_s": {}, "delayed_hosts": {}}


def test_the_urls_are_spread_round_robin_over_the_hosts() -> None:
    hosts = tuple(f"http://{a}:8000" for a in host_addresses(3))
    tasks, uuids = _tasks(source_names(1), 4, hosts, "run", 0, 7)
    urls = [c.SourceTask.from_json(value).url for _, _, value in tasks]
    assert [u.split("/")[2] for u in urls] == [
        "127.1.0.1:8000",
        "127.1.0.2:8000",
        "127.1.0.3:8000",
        "127.1.0.1:8000",
        "127.1.0.2:8000",
        "127.1.0.3:8000",
        "127.1.0.1:8000",
    ]
    # The same path (and so the same body) as on one host: only the host differs.
    one, _ = _tasks(source_names(1), 4, ("http://127.0.0.1:8000",), "run", 0, 7)
    assert [t[:2] for t in tasks] == [t[:2] for t in one]
    for url, (_, _, value) in zip(urls, one, strict=True):
        assert url.split("/", 3)[3] == c.SourceTask.from_json(value).url.split("/", 3)[3]
    assert len(set(uuids)) == 7


def _run(steady: float, whole: float, errors: dict[str, int] | None = None) -> dict[str, Any]:
    return {
        "images_requested": 10_000,
        "images_per_s_steady_10_90": steady,
        "images_per_s": whole,
        "worker_cpu_s_per_image": 0.0111,
        "worker_main_cpu_s_per_image": 0.0021,
        "worker_children_cpu_s_per_image": 0.009,
        "completed_by_s": {"1%": 2.5, "100%": 70.0},
        "errors": errors or {},
        "worker_log_warnings": [{"warning:redis_unavailable": 3}] if errors else [{}],
        "origin_requests": {
            "by_kind": {"image": 10_000, "robots": 1_000, "tdmrep": 1_000},
            "per_s": {"image": 142.9, "robots": 14.3, "tdmrep": 14.3},
            "delayed_hosts": {
                "hosts_asked": 1000,
                "requests_per_host_min": 12,
                "requests_per_host_max": 13,
                "gaps": 11_000,
                "gaps_under_delay": 3,
                "gaps_under_90_percent": 0,
                "hosts_under_90_percent": 0,
                "min_gap_s": 0.987,
                "gap_s_at": {"1%": 0.991, "5%": 0.996, "25%": 1.0, "50%": 1.002},
            },
        },
    }


def hosts_result(hosts: dict[str, Any] | None) -> dict[str, Any]:
    """A benchmark's result around its ``hosts`` figures (bench --long-tail's tests put
    theirs in it too)."""
    return {
        "started": "2026-11-28T06:00:00+00:00",
        "machine": {"cpus": 2, "cpu_model": "x", "load_average_at_start": [0.5, 0.5, 0.5]},
        "corpus": {
            "files": 300,
            "photographs": 30,
            "size_bytes": {"median": 1_020_000},
            "share_1_to_3_mb": 0.55,
        },
        "kernel": {"cpu_s_per_image": 0.0095},
        "kernel_measurements": [{"cpu_s_per_image": 0.0095}],
        "runs": [],
        "hosts": hosts,
        "monitor": [],
        "comparison": None,
        "quality": None,
    }


def test_hosts_figures_and_their_verdict() -> None:
    hosts = hosts_figures(_run(160.0, 150.0), _run(152.0, 135.0), 1000, 1.0)
    assert hosts["ratio_steady_10_90"] == pytest.approx(0.95)
    assert hosts["ratio_whole_run"] == pytest.approx(0.90)
    assert (hosts["hosts"], hosts["images"], hosts["images_per_host"]) == (1000, 10_000, 10.0)

    result = hosts_result(hosts)
    result["verdicts"] = report.verdicts(result)
    (verdict,) = result["verdicts"]
    assert verdict["ok"] and verdict["shown"] == "0.95" and verdict["limit"] == ">= 0.9"
    assert verdict["target"] == (
        "throughput 1,000 hosts at Crawl-delay 1 s / 1 unlimited host (10%-90% of outputs)"
    )
    text = report.render_text(result)
    for figure in (
        "[1 unlimited host] throughput 10%-90% / whole run",
        "160.0 / 150.0 images/s",
        "[1,000 hosts, Crawl-delay 1 s] worker CPU per image (main + pool)",
        "11.1 ms (2.1 ms + 9.0 ms)",
        "image 10,000 (142.9/s), robots 1,000 (14.3/s), tdmrep 1,000 (14.3/s)",
        "1,000 of 1,000; 12-13",
        "3 / 0 of 11,000 (at 0 hosts); 0.987 s",
        "at 1% / 5% / 25% / 50% of them",
        "0.991 / 0.996 / 1.000 / 1.002 s",
        "hosts / one host: throughput 10%-90% (whole run)",
        "0.95 (0.90)",
        "PASS  throughput 1,000 hosts",
    ):
        assert figure in text, figure
    assert "| throughput 1,000 hosts at Crawl-delay 1 s" in report.render_markdown(result)


def test_a_shortfall_or_errors_fail_the_verdict() -> None:
    slow = hosts_figures(_run(160.0, 150.0), _run(140.0, 120.0, {"Timeout": 2}), 1000, 1.0)
    (verdict,) = report.verdicts(hosts_result(slow))
    assert not verdict["ok"] and verdict["shown"] == "0.88"
    assert verdict["target"].endswith(", 2 errors")
    rows = dict(report.table(hosts_result(slow)))
    assert rows["[1,000 hosts, Crawl-delay 1 s] worker log warnings and errors"] == (
        "warning:redis_unavailable 3"
    )
    assert "[1 unlimited host] worker log warnings and errors" not in rows

    unmeasured = copy.deepcopy(slow)
    unmeasured["ratio_steady_10_90"] = None  # fewer than 20 outputs
    assert report.verdicts(hosts_result(unmeasured)) == []
    assert report.verdicts(hosts_result(None)) == []
    assert "hosts / one host" not in report.render_text({**hosts_result(None), "verdicts": []})


def three_file_corpus(directory: Path) -> None:
    """A corpus of three tiny files (``body 0``..``body 2``) the origin serves as it
    serves the benchmark's; bench --long-tail's tests use it too."""
    directory.mkdir()
    files = []
    for i in range(3):
        name = f"{i:04d}-p-mixed.jpg"
        (directory / name).write_bytes(f"body {i}".encode())
        files.append(CorpusFile(name, "p", "mixed", 1024, 768, 80, "4:2:0", 0.0, "none", 6))
    manifest = {"files": [dataclasses.asdict(f) for f in files]}
    (directory / "manifest.json").write_text(json.dumps(manifest))
    os.utime(directory / "manifest.json", (1767323045, 1767323045))


@pytest.fixture
def origin(tmp_path: Path) -> Iterator[Origin]:
    three_file_corpus(tmp_path / "corpus")
    with Origin(tmp_path / "corpus", tmp_path / "logs", hosts=4, crawl_delay_s=1.0) as server:
        yield server


def http_get(url: str, host: str | None = None) -> tuple[int, bytes]:
    """The status and body of GET ``url``, with ``host`` as its Host header if given."""
    request = urllib.request.Request(url, headers={"Host": host} if host else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as answer:
        with answer:
            return answer.code, answer.read()


@pytest.mark.integration
def test_every_host_has_a_crawl_delay_and_the_same_files(origin: Origin) -> None:
    assert origin.host_urls == tuple(f"http://{a}:{origin.port}" for a in host_addresses(4))
    for base in origin.host_urls:
        assert http_get(f"{base}/robots.txt") == (200, b"User-agent: *\nCrawl-delay: 1\n")
        assert http_get(f"{base}/4/x.jpg") == (200, b"body 1")
        assert http_get(f"{base}{c.TDMREP_PATH}")[0] == 404
    # The origin's own address: nothing limits it.
    assert http_get(f"{origin.url}/robots.txt")[0] == 404
    assert http_get(f"{origin.url}/4/x.jpg") == (200, b"body 1")
    assert http_get(f"{origin.url}/x/y.jpg")[0] == 404

    stats = origin_stats(origin.url)
    assert Counter(stats["by_kind"]) == Counter(robots=5, image=5, tdmrep=4, other=1)
    assert (stats["hosts_asked"], stats["requests_per_host_min"]) == (4, 3)
    # Three requests to each host within moments: two gaps each, all under the delay.
    assert (stats["gaps"], stats["gaps_under_delay"]) == (8, 8)
    assert stats["crawl_delay_s"] == 1.0


def test_a_host_asked_too_soon_twice_keeps_its_shortest_gap() -> None:
    requests = Requests(crawl_delay_s=2.0)
    for kind, now in [("robots", 0.0), ("tdmrep", 1.0), ("image", 1.2), ("image", 2.0)]:
        requests.note(kind, "127.1.0.1", now)
    examples = requests.summary()["hosts_under_90_percent_examples"]
    assert examples == {
        "127.1.0.1": {
            "gap_s": pytest.approx(0.2),
            "after": "tdmrep",
            "kind": "image",
            "at": "1970-01-01T00:00:01.200+00:00",
        }
    }
