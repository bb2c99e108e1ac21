"""A long tail of hosts (issue 38, point 3): ``python -m bench --long-tail --urls 100000``.

Two crawls of the same ``--urls`` images (the same paths, so the same bodies, partitions
and order), one after the other in the same run, with the same workers and settings, one
source at ``--rate`` (so that the source's rate is never the limit, and no host has a
ceiling below it: ``MAX_HOST_RATE`` unset):

1. **one host**: every URL on ``one.tail.test``, whose robots.txt and tdmrep.json the
   warm-up has already asked for;
2. **long tail**: URL ``i`` on ``h{i}.tail.test``, a host of its own each, new to the
   crawl (the warm-up's URLs are on hosts of their own, ``w{i}.tail.test``): every image
   costs a DNS lookup, a robots.txt and a tdmrep.json request first, and pacing's slow
   start of a new host.

Every name is of the wildcard zone ``tail.test`` of a local dnsmasq
(test/harness/dnsmasq.py: Debian's dnsmasq on loopback, logging every query), which
answers 127.0.0.1 for all of them; the workers resolve through it (``DNS_SERVERS``), and
the origin (``bench.origin --tail-zone tail.test``) answers any of those names as a site
with a robots.txt that allows everything and no tdmrep.json (a 404). The origin counts
what each name was asked (``bench.tail_hosts``), dnsmasq's log what it was asked, and
every crawl reads redis-server's commands and memory, every process's CPU and the whole
machine's over its measured window (bench/crawl.py). ``longtail_figures`` puts the two
side by side, with the account of where the long tail's shortfall goes.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections import Counter
from collections.abc import Mapping
from typing import Any, Final

from bench.crawl import RunConfig, run_crawl
from bench.services import Origin
from bench.tail_hosts import family_of, tail_host
from bench.tail_origin import TailOrigin
from test.harness.dnsmasq import Dnsmasq

# test.harness.dnsmasq's wildcard zone: every name of it is 127.0.0.1.
TAIL_ZONE: Final = "tail.test"
# The families (bench.tail_hosts.family_of) of the measured runs' names; the long tail's
# warm-up has names of its own, of family "wN" (``tail_urls(..., label="w")``).
ONE_HOST_FAMILY: Final = "one"
TAIL_FAMILY: Final = "hN"
# The origin's and dnsmasq's CPU is read over each window with the stack's processes.
ORIGIN: Final = "origin"
DNSMASQ: Final = "dnsmasq"

_QUERY = re.compile(r"query\[(\w+)\] (\S+) from ")


def tail_urls(count: int, port: int, label: str = "h") -> tuple[str, ...]:
    """``count`` base URLs, each on a name of its own: ``http://{label}{i}.tail.test:PORT``."""
    return tuple(f"http://{label}{i}.{TAIL_ZONE}:{port}" for i in range(count))


def dns_queries(log_text: str) -> dict[str, dict[str, int]]:
    """dnsmasq's logged queries (``log-queries``) of names of ``TAIL_ZONE``, by family
    of names, then by query type (``A``, ``AAAA``...), with ``names``: the distinct
    names asked."""
    counts: dict[str, Counter[str]] = {}
    names: dict[str, set[str]] = {}
    for qtype, name in _QUERY.findall(log_text):
        host = tail_host(name, TAIL_ZONE)
        if host is None:
            continue
        family = family_of(host)
        counts.setdefault(family, Counter())[qtype] += 1
        names.setdefault(family, set()).add(host)
    return {
        family: {**dict(sorted(by_type.items())), "names": len(names[family])}
        for family, by_type in sorted(counts.items())
    }


def _configs(
    config: RunConfig, origin: Origin | TailOrigin, dns: Dnsmasq
) -> tuple[RunConfig, RunConfig]:
    """The one-host crawl's configuration and the long tail's."""
    port = origin.port
    assert port is not None and origin.pid is not None and dns.pid is not None
    one = dataclasses.replace(
        config,
        log_dir=config.log_dir / "one-host",
        recheck=False,
        host_urls=(f"http://{ONE_HOST_FAMILY}.{TAIL_ZONE}:{port}",),
        worker_env={**config.worker_env, "DNS_SERVERS": dns.server},
        watch_pids={ORIGIN: origin.pid, DNSMASQ: dns.pid},
        origin_stats=origin.stats if isinstance(origin, TailOrigin) else None,
    )
    warmup = max(config.warmup, config.sources * config.partitions)
    tail = dataclasses.replace(
        one,
        log_dir=config.log_dir / "long-tail",
        host_urls=tail_urls(config.images, port),
        warmup_host_urls=tail_urls(warmup, port, label="w"),
    )
    return one, tail


async def measure_long_tail(
    config: RunConfig, origin: Origin | TailOrigin, files: int
) -> dict[str, Any]:
    """Crawl ``config.images`` URLs on one host, then the same on as many hosts, names of
    a local dnsmasq's wildcard zone; ``origin`` must answer that zone (``tail_zone``):
    nginx (``TailOrigin``) or ``bench.origin``."""
    if origin.tail_zone != TAIL_ZONE:
        raise ValueError(f"the origin must answer {TAIL_ZONE} (Origin(tail_zone=...))")
    config.log_dir.mkdir(parents=True, exist_ok=True)
    with Dnsmasq(config.log_dir / "dnsmasq") as dns:
        one_config, tail_config = _configs(config, origin, dns)
        print(f"long tail: {config.images} images on one host", file=sys.stderr)
        one = await run_crawl(one_config, origin.url, files)
        print(f"long tail: the same images on {config.images} hosts", file=sys.stderr)
        tail = await run_crawl(tail_config, origin.url, files)
        queries = dns_queries(dns.query_log_path.read_text(errors="replace"))
    figures = longtail_figures(one, tail, queries)
    figures["origin"] = "nginx" if isinstance(origin, TailOrigin) else "bench.origin (aiohttp)"
    return figures


def _tail_of(run: Mapping[str, Any], family: str) -> dict[str, Any]:
    """The origin's counts of a family of tail names (the origin's life so far)."""
    seen = (run.get("origin_requests") or {}).get("delayed_hosts") or {}
    return dict((seen.get("tail") or {}).get(family) or {})


def _per_image(value: float | None, images: int) -> float | None:
    return value / images if value is not None and images else None


def run_costs(run: Mapping[str, Any], family: str) -> dict[str, Any]:
    """One crawl's costs per image: requests by kind, DNS queries, Redis commands, CPU of
    every process (the worker's main process and pool apart), and how busy the machine
    was over the window."""
    ok = run["images_ok"]
    wall_s = run["wall_s"]
    requests = (run.get("origin_requests") or {}).get("by_kind", {})
    cpu = {
        "worker_main": run["worker_main_cpu_s_per_image"],
        "worker_pool": run["worker_children_cpu_s_per_image"],
        **{name: _per_image(s, ok) for name, s in sorted(run.get("other_cpu_s", {}).items())},
    }
    ours_s = sum(v for v in cpu.values() if v is not None) * ok
    cpus = run.get("machine_cpus") or 1
    busy_s = run.get("machine_cpu_busy_s")
    redis = run.get("redis") or {}
    return {
        "images_ok": ok,
        # False: the window closed at the crawl's timeout with images still to come.
        "finished": run.get("finished", True),
        "images_requested": run["images_requested"],
        "images_per_s": run["images_per_s"],
        "images_per_s_steady_10_90": run["images_per_s_steady_10_90"],
        "wall_s": wall_s,
        "errors": run["errors"],
        "requests": dict(requests),
        "requests_per_s": sum(requests.values()) / wall_s if wall_s else None,
        "requests_per_image": {k: _per_image(n, ok) for k, n in requests.items()},
        "redis_commands_per_image": redis.get("commands_per_image"),
        "cpu_s_per_image": cpu,
        "cpu_s_per_image_total": _per_image(ours_s, ok),
        # Of the machine's CPUs over the window: ours, and everything (others' included).
        "cpu_share_ours": ours_s / (wall_s * cpus) if wall_s else None,
        "cpu_share_machine": busy_s / (wall_s * cpus) if busy_s is not None and wall_s else None,
        # Where the rest went: the machine's CPUs over the window by kind (idle, steal,
        # softirq: the kernel's network work, charged to no process, ...).
        "machine_share_by_kind": (
            {k: round(s / (wall_s * cpus), 5) for k, s in run["machine_cpu_s_by_kind"].items()}
            if wall_s and "machine_cpu_s_by_kind" in run
            else {}
        ),
        "harness_share": (run.get("harness_cpu_s") or 0.0) / (wall_s * cpus) if wall_s else None,
        "origin_tail": _tail_of(run, family),
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _without_origin(costs: Mapping[str, Any]) -> float | None:
    total = costs["cpu_s_per_image_total"]
    origin = costs["cpu_s_per_image"].get(ORIGIN)
    return total - origin if total is not None and origin is not None else total


def shortfall(one: Mapping[str, Any], tail: Mapping[str, Any]) -> dict[str, Any]:
    """Where the long tail's throughput goes, from the two runs' ``run_costs``: the CPU
    per image each process spends more on the long tail (its share of all that more),
    and the ratio the machine's CPU alone would allow (one host's CPU per image over the
    long tail's): when the two runs kept the CPUs as busy, that is the ratio measured,
    and what is missing beyond it was waiting, not work. The same without the origin's
    CPU: the web servers' work, which a real crawl's machine does not do. The ratio is
    the product of that one and ``ratio_cpu_share``, the long tail's share of the
    machine's CPUs over the one host's: below 1, our processes waited (or, on a shared
    machine, others took more of it)."""
    more = {
        name: (tail["cpu_s_per_image"].get(name) or 0.0) - (s or 0.0)
        for name, s in one["cpu_s_per_image"].items()
    }
    for name, s in tail["cpu_s_per_image"].items():
        more.setdefault(name, s or 0.0)
    total = sum(more.values())
    return {
        "cpu_s_per_image_more": dict(sorted(more.items(), key=lambda item: -item[1])),
        "cpu_s_per_image_more_total": total,
        "share_of_more": {k: v / total for k, v in more.items()} if total > 0 else {},
        "ratio_cpu_bound": _ratio(one["cpu_s_per_image_total"], tail["cpu_s_per_image_total"]),
        "ratio_cpu_bound_without_origin": _ratio(_without_origin(one), _without_origin(tail)),
        # The other factor of the ratio: how much of the machine our processes got.
        "ratio_cpu_share": _ratio(tail["cpu_share_ours"], one["cpu_share_ours"]),
        # The image processes do the same work in both crawls (the same bodies): above 1,
        # the machine ran slower during the long tail's (a shared VM's speed drifts by a
        # few per cent over minutes), which lowers the ratio without any cost of hosts.
        "pool_cpu_long_tail_over_one_host": _ratio(
            tail["cpu_s_per_image"].get("worker_pool"), one["cpu_s_per_image"].get("worker_pool")
        ),
        "requests_per_image_more": {
            kind: (n or 0.0) - (one["requests_per_image"].get(kind) or 0.0)
            for kind, n in tail["requests_per_image"].items()
        },
        "redis_commands_per_image_more": (tail["redis_commands_per_image"] or 0.0)
        - (one["redis_commands_per_image"] or 0.0),
    }


def longtail_figures(
    one: dict[str, Any], tail: dict[str, Any], queries: Mapping[str, Mapping[str, int]]
) -> dict[str, Any]:
    """The two crawls' figures (``run_crawl``'s), their costs side by side, dnsmasq's
    queries by family of names, the throughput ratio and the account of the rest."""
    one_costs, tail_costs = run_costs(one, ONE_HOST_FAMILY), run_costs(tail, TAIL_FAMILY)
    hosts = tail["config"]["host_urls"]
    grown = (tail.get("redis") or {}).get("used_memory_grown")
    # The one host's crawl grows Redis too (the statistics' windows keep every status of
    # the last 12 hours): what the hosts cost is the long tail's growth beyond it.
    images_grown = (one.get("redis") or {}).get("used_memory_grown")
    rss = [(run.get("memory") or [{}])[0].get("peak_rss_main_bytes") for run in (one, tail)]
    return {
        "urls": tail["images_requested"],
        "hosts": hosts,
        # The worker's main process at its peak, beyond the one host's crawl, per host.
        "worker_rss_bytes_per_host": (rss[1] - rss[0]) / hosts
        if None not in rss and hosts
        else None,
        "ratio": _ratio(tail["images_per_s"], one["images_per_s"]),
        "ratio_steady_10_90": _ratio(
            tail["images_per_s_steady_10_90"], one["images_per_s_steady_10_90"]
        ),
        "dns_queries": {family: dict(counts) for family, counts in queries.items()},
        "redis_bytes_per_host_gross": grown / hosts if grown is not None and hosts else None,
        "redis_bytes_per_host": (grown - images_grown) / hosts
        if grown is not None and images_grown is not None and hosts
        else None,
        "costs": {"one_host": one_costs, "long_tail": tail_costs},
        "shortfall": shortfall(one_costs, tail_costs),
        "one_host": one,
        "long_tail": tail,
    }
