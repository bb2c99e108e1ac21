"""The origin's long-tail hosts (``python -m bench --long-tail``, issue 38): any host name
of one DNS zone, each a site of its own with a robots.txt, all answered by one process.

``bench.origin --tail-zone tail.test`` serves every request whose ``Host`` is a name of
that zone (``tail_host``) as it serves its own address, and answers their
``/robots.txt`` with ``TAIL_ROBOTS_TXT`` (a file that allows everything: what most of the
open web's hosts have, and 200 rather than 404 so that each host's entry holds a file,
as a real crawl's do). ``TailRequests`` counts what those hosts were asked, by *family*:
a name's first label with its digits replaced by ``N`` (``h17.tail.test`` is of family
``hN``), so that the benchmark's runs, which each use names of their own (the long
tail's ``hN``, its warm-up's ``wN``, the one-host run's ``one``), are told apart in one
origin's counts without a reset between them.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from typing import Any, Final

# A file that allows every path to every crawler, as most hosts' robots.txt do.
TAIL_ROBOTS_TXT: Final = "User-agent: *\nAllow: /\n"

_DIGITS = re.compile(r"\d+")


def tail_host(host_header: str | None, zone: str) -> str | None:
    """The host name of a request's ``Host`` header (lower-cased, without its port or a
    final dot) when it is ``zone`` or a name under it; else None (an address, another
    name, no header)."""
    if not host_header or not zone or host_header.startswith("["):
        return None
    name, colon, port = host_header.rpartition(":")
    if not colon or not port.isdigit():
        name = host_header
    name = name.rstrip(".").lower()
    zone = zone.strip(".").lower()
    return name if name == zone or name.endswith("." + zone) else None


def family_of(name: str) -> str:
    """A tail host's family: its first label, digits replaced by ``N`` (``h17.tail.test``
    -> ``hN``, ``one.tail.test`` -> ``one``)."""
    return _DIGITS.sub("N", name.split(".", 1)[0])


# Transitions between a host's consecutive requests whose gaps are kept: a new host's
# robots.txt, then its tdmrep.json, then its image (what pacing's slow start spaces out).
_STEPS: Final = ("robots>tdmrep", "tdmrep>image")


@dataclasses.dataclass(slots=True)
class TailRequests:
    """What the tail hosts were asked: per host, its requests by kind; and how long each
    host took from its first request (its robots.txt, normally) to each later kind
    (``note``'s ``now``: seconds, wall clock)."""

    by_host: dict[str, Counter[str]] = dataclasses.field(default_factory=dict)
    first: dict[str, tuple[float, str]] = dataclasses.field(default_factory=dict)
    last: dict[str, tuple[float, str]] = dataclasses.field(default_factory=dict)
    # (family, "kind>kind") -> gaps, s, between a host's consecutive requests of those kinds,
    # and "robots>image": from its robots.txt to its first image.
    gaps_s: dict[tuple[str, str], list[float]] = dataclasses.field(default_factory=dict)

    def note(self, host: str, kind: str, now: float) -> None:
        """One request of ``kind`` to the tail host ``host`` (a ``tail_host`` name)."""
        counts = self.by_host.get(host)
        if counts is None:
            counts = self.by_host[host] = Counter()
            self.first[host] = (now, kind)
        first_image = kind == "image" and not counts["image"]
        counts[kind] += 1
        family = family_of(host)
        last = self.last.get(host)
        self.last[host] = (now, kind)
        if last is not None and f"{last[1]}>{kind}" in _STEPS:
            self.gaps_s.setdefault((family, f"{last[1]}>{kind}"), []).append(now - last[0])
        started, first_kind = self.first[host]
        if first_image and first_kind == "robots":
            self.gaps_s.setdefault((family, "robots>image"), []).append(now - started)

    def summary(self) -> dict[str, Any]:
        """Per family: hosts asked, requests by kind, how many hosts were asked how many
        times (``{"3": 99_000, "4": 12}``; a key per distinct count), how many hosts were
        asked each kind more than once, and the gaps' median and 90th percentile."""
        families: dict[str, dict[str, Any]] = {}
        for host, counts in self.by_host.items():
            figures = families.setdefault(family_of(host), _empty())
            figures["hosts"] += 1
            figures["by_kind"].update(counts)
            figures["requests_per_host"][str(sum(counts.values()))] += 1
            for kind, n in counts.items():
                if n > 1:
                    figures["hosts_asked_again"][kind] += 1
        for (family, step), gaps in self.gaps_s.items():
            if family in families:
                families[family]["gaps_s"][step] = _spread(gaps)
        return {
            family: {
                **figures,
                "by_kind": dict(figures["by_kind"]),
                "requests_per_host": dict(sorted(figures["requests_per_host"].items())),
                "hosts_asked_again": dict(figures["hosts_asked_again"]),
            }
            for family, figures in sorted(families.items())
        }


def _empty() -> dict[str, Any]:
    return {
        "hosts": 0,
        "by_kind": Counter(),
        "requests_per_host": Counter(),
        "hosts_asked_again": Counter(),
        "gaps_s": {},
    }


def _spread(gaps: list[float]) -> dict[str, float]:
    ordered = sorted(gaps)
    return {
        "count": len(ordered),
        "median": ordered[len(ordered) // 2],
        "p90": ordered[min(len(ordered) - 1, len(ordered) * 9 // 10)],
    }
