"""bench --long-tail: the origin's tail hosts (any name of a zone, each with a robots.txt)
and what it counts of them, dnsmasq's queries by family of names, Redis' commands over a
window, and the two crawls' costs, ratio, verdict and account of the rest."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench import report
from bench.crawl import _tasks, source_names
from bench.longtail import TAIL_ZONE, dns_queries, longtail_figures, tail_urls
from bench.redis_costs import redis_window
from bench.services import Origin, origin_stats
from bench.tail_hosts import TAIL_ROBOTS_TXT, TailRequests, family_of, tail_host
from bench.tail_origin import TailOrigin, kind_of
from crawlctl.localstack.processes import wait_until
from image_crawler import contract as c
from test.crawl_monitor.test_bench_hosts import hosts_result, http_get, three_file_corpus


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("h17.tail.test:8080", "h17.tail.test"),
        ("H17.Tail.Test", "h17.tail.test"),
        ("h17.tail.test.:80", "h17.tail.test"),
        ("tail.test", "tail.test"),
        ("a.b.tail.test:1", "a.b.tail.test"),
        ("notatail.test:80", None),  # a suffix, not a name under the zone
        ("tail.test.example:80", None),
        ("127.0.0.1:8080", None),
        ("[::1]:8080", None),
        ("", None),
        (None, None),
    ],
)
def test_a_tail_host_is_a_name_of_the_zone(header: str | None, expected: str | None) -> None:
    assert tail_host(header, "tail.test") == expected
    assert tail_host(header, ".TAIL.test.") == expected
    assert tail_host(header, "") is None


@pytest.mark.parametrize(
    ("name", "family"),
    [("h17.tail.test", "hN"), ("w0.tail.test", "wN"), ("one.tail.test", "one"), ("a1b22", "aNbN")],
)
def test_the_family_of_a_name(name: str, family: str) -> None:
    assert family_of(name) == family


def test_tail_requests_count_each_family_apart_with_each_hosts_gaps() -> None:
    tail = TailRequests()
    for host, kind, now in [
        ("h1.tail.test", "robots", 10.0),
        ("h2.tail.test", "robots", 10.5),
        ("h1.tail.test", "tdmrep", 11.0),
        ("h1.tail.test", "image", 11.25),
        ("h2.tail.test", "tdmrep", 12.5),
        ("h2.tail.test", "robots", 13.0),  # asked again: no step of ours
        ("h2.tail.test", "image", 13.5),
        ("one.tail.test", "image", 14.0),  # no robots.txt first: no robots>image
        ("one.tail.test", "image", 14.1),
    ]:
        tail.note(host, kind, now)

    summary = tail.summary()
    json.dumps(summary)  # what /_stats answers
    assert list(summary) == ["hN", "one"]
    hosts = summary["hN"]
    assert hosts["hosts"] == 2
    assert hosts["by_kind"] == {"robots": 3, "tdmrep": 2, "image": 2}
    assert hosts["requests_per_host"] == {"3": 1, "4": 1}
    assert hosts["hosts_asked_again"] == {"robots": 1}
    gaps = hosts["gaps_s"]
    assert gaps["robots>tdmrep"] == {"count": 2, "median": 2.0, "p90": 2.0}
    assert gaps["tdmrep>image"] == {"count": 1, "median": 0.25, "p90": 0.25}
    assert gaps["robots>image"] == {"count": 2, "median": 3.0, "p90": 3.0}
    one = summary["one"]
    assert (one["hosts"], one["requests_per_host"], one["gaps_s"]) == (1, {"2": 1}, {})
    assert one["hosts_asked_again"] == {"image": 1}
    assert TailRequests().summary() == {}


@pytest.fixture
def origin(tmp_path: Path) -> Iterator[Origin]:
    three_file_corpus(tmp_path / "corpus")
    with Origin(tmp_path / "corpus", tmp_path / "logs", tail_zone=TAIL_ZONE) as server:
        yield server


@pytest.mark.integration
def test_every_name_of_the_zone_is_a_site_with_a_robots_txt(origin: Origin) -> None:
    port = origin.port
    for name in ("h0.tail.test", "h99999.tail.test", "one.tail.test"):
        host = f"{name}:{port}"
        assert http_get(f"{origin.url}/robots.txt", host) == (200, TAIL_ROBOTS_TXT.encode())
        assert http_get(f"{origin.url}/4/x.jpg", host) == (200, b"body 1")
        assert http_get(f"{origin.url}{c.TDMREP_PATH}", host)[0] == 404
    # Any other host: the origin's own files, and no robots.txt.
    assert http_get(f"{origin.url}/robots.txt")[0] == 404
    assert http_get(f"{origin.url}/robots.txt", f"tail.example:{port}")[0] == 404
    assert http_get(f"{origin.url}/5/y.jpg", f"tail.example:{port}") == (200, b"body 2")

    stats = origin_stats(origin.url)
    assert stats["by_kind"] == {"robots": 5, "image": 4, "tdmrep": 3}
    tail = stats["tail"]
    assert list(tail) == ["hN", "one"]
    assert tail["hN"]["hosts"] == 2 and tail["hN"]["requests_per_host"] == {"3": 2}
    assert tail["one"]["by_kind"] == {"robots": 1, "image": 1, "tdmrep": 1}


@pytest.mark.integration
def test_nginx_answers_the_zone_as_the_origin_does_and_counts_from_its_log(
    tmp_path: Path,
) -> None:
    three_file_corpus(tmp_path / "corpus")
    with TailOrigin(tmp_path / "corpus", tmp_path / "tail", 6, TAIL_ZONE) as origin:
        assert origin.stats() == {"by_kind": {}, "tail": {}}
        port = origin.port
        for name in ("h0.tail.test", "h5.tail.test", "one.tail.test"):
            host = f"{name}:{port}"
            assert http_get(f"{origin.url}/robots.txt", host) == (200, TAIL_ROBOTS_TXT.encode())
            assert http_get(f"{origin.url}{c.TDMREP_PATH}", host)[0] == 404
            assert http_get(f"{origin.url}/4/x.jpg", host) == (200, b"body 1")
        assert http_get(f"{origin.url}/robots.txt")[0] == 404
        assert http_get(f"{origin.url}/robots.txt", f"tail.example:{port}")[0] == 404
        assert http_get(f"{origin.url}/5/y.jpg", f"tail.example:{port}") == (200, b"body 2")
        assert http_get(f"{origin.url}/6/beyond.jpg", f"h1.tail.test:{port}")[0] == 404

        def logged() -> dict[str, Any] | None:
            stats = origin.stats()
            return stats if sum(stats["by_kind"].values()) >= 13 else None

        # nginx logs a request once answered: its last line may come a moment later.
        stats = wait_until(logged, 10.0, what="13 requests in nginx's log")
    assert stats["by_kind"] == {"robots": 5, "image": 5, "tdmrep": 3}
    tail = stats["tail"]
    assert list(tail) == ["hN", "one"]
    assert tail["hN"]["hosts"] == 3 and tail["hN"]["requests_per_host"] == {"1": 1, "3": 2}
    assert tail["one"]["by_kind"] == {"robots": 1, "image": 1, "tdmrep": 1}
    assert set(tail["hN"]["gaps_s"]) == {"robots>tdmrep", "tdmrep>image", "robots>image"}


def test_kinds_of_requests_as_the_origin_counts_them() -> None:
    assert kind_of("/robots.txt", 200) == "robots"
    assert kind_of(c.TDMREP_PATH, 404) == "tdmrep"
    assert kind_of("/17/run-0000017-photos.jpg", 200) == "image"
    assert kind_of("/17/run-0000017-photos.jpg", 304) == "image_304"
    assert kind_of("/health", 200) == "other"
    assert kind_of("/x/17/", 200) == "other"


def test_the_long_tails_urls_are_one_host_each_with_the_one_hosts_paths() -> None:
    bases = tail_urls(5, 8000)
    assert bases[0] == "http://h0.tail.test:8000" and len(set(bases)) == 5
    assert tail_urls(2, 8000, label="w") == ("http://w0.tail.test:8000", "http://w1.tail.test:8000")
    tasks, _ = _tasks(source_names(1), 4, bases, "run", 0, 5)
    one, _ = _tasks(source_names(1), 4, ("http://one.tail.test:8000",), "run", 0, 5)
    urls = [c.SourceTask.from_json(v).url for _, _, v in tasks]
    assert [u.split("/")[2] for u in urls] == [f"h{i}.tail.test:8000" for i in range(5)]
    assert [t[:2] for t in tasks] == [t[:2] for t in one]
    assert [u.split("/", 3)[3] for u in urls] == [
        c.SourceTask.from_json(v).url.split("/", 3)[3] for _, _, v in one
    ]


def test_dnsmasqs_queries_are_counted_by_family_and_type() -> None:
    log = "\n".join(
        [
            "Nov 28 16:00:00 dnsmasq[1]: query[A] h1.tail.test from 127.0.0.1",
            "Nov 28 16:00:00 dnsmasq[1]: config h1.tail.test is 127.0.0.1",
            "Nov 28 16:00:00 dnsmasq[1]: query[AAAA] h1.tail.test from 127.0.0.1",
            "Nov 28 16:00:00 dnsmasq[1]: query[A] H2.tail.test from 127.0.0.1",
            "Nov 28 16:00:01 dnsmasq[1]: query[A] h1.tail.test from 127.0.0.1",
            "Nov 28 16:00:01 dnsmasq[1]: query[A] one.tail.test from 127.0.0.1",
            "Nov 28 16:00:01 dnsmasq[1]: query[A] ready.test from 127.0.0.1",
        ]
    )
    assert dns_queries(log) == {
        "hN": {"A": 3, "AAAA": 1, "names": 2},
        "one": {"A": 1, "names": 1},
    }
    assert dns_queries("") == {}


def test_redis_window_is_what_ran_between_two_readings() -> None:
    before = {"calls": {"get": 10, "evalsha": 4, "info": 7}, "used_memory": 1000, "keys": 3}
    after = {
        "calls": {"get": 30, "evalsha": 8, "hgetall": 50, "info": 9, "dbsize": 1},
        "used_memory": 5000,
        "keys": 13,
    }
    window = redis_window(before, after, images=10, top=2)
    # The first reading's own INFO x2 and DBSIZE are not the crawl's.
    assert window["commands"] == 20 + 4 + 50
    assert window["commands_per_image"] == pytest.approx(7.4)
    assert window["top"] == {
        "hgetall": {"calls": 50, "per_image": 5.0},
        "get": {"calls": 20, "per_image": 2.0},
    }
    assert (window["used_memory_grown"], window["keys_before"], window["keys_after"]) == (
        4000,
        3,
        13,
    )
    assert redis_window({}, {}, images=0)["commands_per_image"] is None


def _run(images_per_s: float, main_ms: float, redis_s: float, kinds: dict[str, int]) -> dict:
    ok = 1000
    wall_s = ok / images_per_s
    return {
        "config": {"host_urls": ok if "robots" in kinds else 1},
        "images_requested": ok,
        "finished": True,
        "images_ok": ok,
        "images_per_s": images_per_s,
        "images_per_s_steady_10_90": images_per_s * 1.1,
        "wall_s": wall_s,
        "errors": {},
        "worker_main_cpu_s_per_image": main_ms / 1000,
        "worker_children_cpu_s_per_image": 0.010,
        "other_cpu_s": {"redis": redis_s, "origin": 1.0},
        "machine_cpus": 2,
        "machine_cpu_busy_s": 1.9 * wall_s,
        "origin_requests": {
            "by_kind": kinds,
            "delayed_hosts": {
                "tail": {
                    "hN": {
                        "hosts": 1000,
                        "by_kind": {"robots": 1000, "tdmrep": 1000, "image": 1000},
                        "requests_per_host": {"3": 1000},
                        "hosts_asked_again": {},
                        "gaps_s": {"robots>tdmrep": {"count": 1000, "median": 1.0, "p90": 1.2}},
                    },
                    "one": {"hosts": 1, "by_kind": {"image": 1064},
                            "requests_per_host": {"1064": 1},
                            "hosts_asked_again": {"image": 1}, "gaps_s": {}},
                }
            },
        },
        "redis": {
            "commands_per_image": 20.0 if "robots" in kinds else 6.0,
            "top": {"evalsha": {"calls": 2000, "per_image": 2.0}},
            "used_memory_before": 1_000_000,
            "used_memory_after": 2_000_000 if "robots" in kinds else 1_010_000,
            "used_memory_grown": 1_000_000 if "robots" in kinds else 10_000,
            "keys_before": 10,
            "keys_after": 3010 if "robots" in kinds else 12,
        },
        "memory": [
            {
                "peak_rss_main_bytes": (320 if "robots" in kinds else 300) * 2**20,
                "peak_rss_pool_max_bytes": 70 * 2**20,
            }
        ],
    }  # fmt: skip


def _figures() -> dict[str, Any]:
    one = _run(160.0, 2.0, 1.0, {"image": 1000})
    tail = _run(120.0, 4.0, 3.0, {"image": 1000, "robots": 1000, "tdmrep": 1000})
    queries = {"hN": {"A": 1000, "AAAA": 1000, "names": 1000}, "one": {"A": 1, "names": 1}}
    return longtail_figures(one, tail, queries)


def _result(long_tail: dict[str, Any] | None) -> dict[str, Any]:
    return {**hosts_result(None), "long_tail": long_tail}


def test_the_costs_ratio_and_account_of_the_two_crawls() -> None:
    figures = _figures()
    assert figures["ratio"] == pytest.approx(0.75)
    assert (figures["urls"], figures["hosts"]) == (1000, 1000)
    # The one host's crawl grew Redis by 10,000 bytes: the images', not the hosts'.
    assert figures["redis_bytes_per_host"] == pytest.approx(990.0)
    assert figures["redis_bytes_per_host_gross"] == pytest.approx(1000.0)
    assert figures["worker_rss_bytes_per_host"] == pytest.approx(20 * 2**20 / 1000)
    tail = figures["costs"]["long_tail"]
    assert tail["requests_per_image"] == {"image": 1.0, "robots": 1.0, "tdmrep": 1.0}
    assert tail["requests_per_s"] == pytest.approx(360.0)
    assert tail["cpu_s_per_image"] == pytest.approx(
        {"worker_main": 0.004, "worker_pool": 0.010, "origin": 0.001, "redis": 0.003}
    )
    assert tail["cpu_s_per_image_total"] == pytest.approx(0.018)
    # 18 ms an image at 120 images/s: 2.16 CPU s a second of 2 CPUs.
    assert tail["cpu_share_ours"] == pytest.approx(1.08)
    assert tail["cpu_share_machine"] == pytest.approx(0.95)
    account = figures["shortfall"]
    assert account["cpu_s_per_image_more"] == pytest.approx(
        {"worker_main": 0.002, "redis": 0.002, "worker_pool": 0.0, "origin": 0.0}
    )
    assert list(account["cpu_s_per_image_more"])[:2] == ["worker_main", "redis"]
    assert account["share_of_more"]["redis"] == pytest.approx(0.5)
    assert account["ratio_cpu_bound"] == pytest.approx(0.014 / 0.018)
    assert account["ratio_cpu_bound_without_origin"] == pytest.approx(0.013 / 0.017)
    # The two factors of the ratio: the CPU per image, and the share of the CPUs got.
    assert account["ratio_cpu_share"] == pytest.approx(1.08 / (0.014 * 160 / 2))
    assert account["ratio_cpu_bound"] * account["ratio_cpu_share"] == pytest.approx(0.75)
    # The image processes' work is the same in both: the machine ran as fast in both.
    assert account["pool_cpu_long_tail_over_one_host"] == pytest.approx(1.0)
    assert account["requests_per_image_more"] == {"image": 0.0, "robots": 1.0, "tdmrep": 1.0}
    assert account["redis_commands_per_image_more"] == pytest.approx(14.0)


def test_the_verdict_and_rows_of_the_long_tail() -> None:
    figures = _figures()
    (verdict,) = report.verdicts(_result(figures))
    assert not verdict["ok"] and verdict["shown"] == "0.75" and verdict["limit"] == ">= 0.8"
    assert verdict["target"] == "throughput 1,000 new hosts / 1 host (whole run)"

    result = _result(figures)
    result["verdicts"] = report.verdicts(result)
    text = report.render_text(result)
    for figure in (
        "[1,000 hosts] images/s whole run / 10%-90%; errors",
        "120.0 / 132.0; none",
        "image 1,000 (1.00/image, 120.0/s), robots 1,000 (1.00/image, 120.0/s)",
        "2,000 (A 1,000, AAAA 1,000) for 1,000 names; 2.00/image",
        "1 (A 1) for 1 names; 0.00/image",
        "20.00 (evalsha 2.00)",
        "+1,000,000 bytes; keys 10 -> 3010",
        "320 / 70 MiB",
        "20,972 bytes",
        "18.00 ms: worker_main 4.00, worker_pool 10.00, origin 1.00, redis 3.00",
        "108% / 95%",
        "1,000; 3 requests: 1,000",
        "robots>tdmrep 1.000 / 1.200 s",
        "0.75 (0.75)",
        "4.00 ms: worker_main +2.00 (50%), redis +2.00 (50%)",
        "robots +1.00, tdmrep +1.00",
        "990 (1,000)",
        "0.78; without the origin's CPU (the servers' work) 0.76",
        "bench.origin (aiohttp)",
        "FAIL  throughput 1,000 new hosts / 1 host (whole run): 0.75 (>= 0.8)",
    ):
        assert figure in text, figure
    assert "[1 host]   by kind (per image, per s)" in text
    rows = dict(report.table(result))
    assert rows["  the share of the CPUs our processes got (long tail's / one host's)"] == "0.96"
    assert "robots 0" not in text

    fast = copy.deepcopy(figures)
    fast["ratio"] = 0.85
    fast["long_tail"]["errors"] = {"DnsError": 2}
    (verdict,) = report.verdicts(_result(fast))
    assert verdict["ok"] and verdict["target"].endswith(", 2 errors")
    # Another workload on the machine: the verdict says how much, and what the CPU allows.
    fast["costs"]["one_host"]["cpu_share_machine"] = 0.99
    fast["costs"]["one_host"]["cpu_share_ours"] = 0.75
    (verdict,) = report.verdicts(_result(fast))
    assert verdict["target"].endswith(
        ", 2 errors, other processes busy 24% / 0% of the CPUs (CPU alone allows 0.78)"
    )
    # A crawl whose window closed at its timeout: its rows and the verdict say so.
    slow = copy.deepcopy(figures)
    slow["costs"]["long_tail"].update(finished=False, images_ok=700)
    (verdict,) = report.verdicts(_result(slow))
    assert verdict["target"].endswith(", timed out after 700 of 1,000 images (8 s)")
    rows = dict(report.table(_result(slow)))
    assert rows["[1,000 hosts] images/s whole run / 10%-90%; errors"].endswith(
        "; none; timed out after 700 of 1,000 images (8 s)"
    )
    assert report.verdicts(_result(None)) == []
    assert report.table(_result(None))[-1][0] == "kernel CPU per image"
