"""The campaign's invariants, checked on what the ledger and the origin recorded (pure
functions: no service is asked anything here).

- Every uuid produced ended, at least once, in the topic its URL's kind calls for, and
  each resolution's thumbnail is in the store.
- No host and no source got more than its pacing bound, ``rate x w + 1`` requests in any
  window of ``w`` (``WIDTHS_S``) less ``LATENESS_S``, as the origin saw them: robots.txt
  and tdmrep.json requests count, they take pacing slots like images. A window one
  request over is reported; more fail (``REPORTED_OVER``).
- No request reached a host inside a Retry-After it had been given, nor a halted source's
  host while it was halted, later than ``REACTION_S`` after the answer (or the halt): a
  request already under way when the answer left the origin cannot have known of it.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from chaos import plan
from test.harness.windows import busiest_gaps_ms, max_in_window, paced_bound

WIDTHS_S: Final = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
# The pacer starts a request up to 10 ms late by design (worker/politeness/pacing.py,
# late_limit: LATE_FLOOR_S), and may then be as close to the next as that: the bound is
# held in each window less this. Windows as measured are counted too (``strict``).
LATENESS_S: Final = 0.01
# A window one request over its bound is reported, not failed: on the 2-core machine
# where a dozen processes run the campaign, a worker's loop or the origin's can still
# lag past the pacer's checks, and one request then lands next to another (the campaign
# runs of 28 Nov: 0-2 such pairs in 5 minutes, each one request over in windows of
# 0.1 s). Two or more over (a burst) fail it.
REPORTED_OVER: Final = 1
# How long after an answer (a 429) or an operator's halt a request may still arrive: one
# granted ahead of its slot (the pacer's horizon, 50 ms) that was already on its way.
REACTION_S: Final = 0.5

Request = tuple[float, str, str, int, int]  # unix time, host, path, status, retry-after s


@dataclasses.dataclass(frozen=True, slots=True)
class Ends:
    lost: list[str]
    wrong: list[tuple[str, str, str]]  # uuid, expected topic, topics seen
    duplicates: int  # uuids that ended more than once
    deliveries: int  # end messages in all


def check_ends(
    produced: Mapping[str, plan.Url], ends: Mapping[str, Sequence[tuple[str, float, int]]]
) -> Ends:
    lost, wrong, duplicates, deliveries = [], [], 0, 0
    for uuid, url in produced.items():
        seen = ends.get(uuid, [])
        deliveries += len(seen)
        if not seen:
            lost.append(uuid)
            continue
        duplicates += len(seen) > 1
        expected = plan.EXPECTED_TOPIC[url.kind]
        topics = sorted({topic for topic, _, _ in seen})
        if topics != [expected]:
            wrong.append((uuid, expected, ",".join(topics)))
    return Ends(sorted(lost), wrong, duplicates, deliveries)


@dataclasses.dataclass(frozen=True, slots=True)
class Window:
    """The busiest window of one host or source, against its bound."""

    who: str
    width_s: float
    seen: int  # in the window less LATENESS_S: what the check holds to the bound
    bound: int
    gaps_ms: tuple[float, ...] = ()  # between the requests of a window over its bound
    strict: int = 0  # in the whole window, as measured

    @property
    def share(self) -> float:
        return self.seen / self.bound

    def __str__(self) -> str:
        gaps = f" (gaps {list(self.gaps_ms)} ms)" if self.gaps_ms else ""
        return f"{self.who} {self.seen}/{self.bound} in {self.width_s:g} s{gaps}"


def pacing_windows(requests: Iterable[Request]) -> list[Window]:
    """For each host and each source, its busiest window of each width."""
    times: dict[str, list[float]] = defaultdict(list)
    for t, host, _path, _status, _ra in requests:
        if host in plan.HOSTS:
            times[f"host {host}"].append(t)
            times[f"source {plan.HOSTS[host].source}"].append(t)
    windows = []
    for who, found in times.items():
        found.sort()
        kind, name = who.split(" ", 1)
        source = plan.SOURCES_BY_NAME[plan.HOSTS[name].source if kind == "host" else name]
        rate = plan.HOSTS[name].bound_rps(source.rate_rps) if kind == "host" else source.rate_rps
        for width in WIDTHS_S:
            bound = paced_bound(rate, width)
            seen, strict = max_in_window(found, width - LATENESS_S), max_in_window(found, width)
            gaps = tuple(busiest_gaps_ms(found, width - LATENESS_S)) if seen > bound else ()
            windows.append(Window(who, width, seen, bound, gaps, strict))
    return windows


def worst_window(windows: Sequence[Window]) -> Window | None:
    return max(windows, key=lambda w: (w.share, w.width_s), default=None)


def retry_after_broken(requests: Sequence[Request]) -> list[str]:
    """Requests that reached a host inside a Retry-After it had answered."""
    by_host: dict[str, list[float]] = defaultdict(list)
    for t, host, *_ in requests:
        by_host[host].append(t)
    broken = []
    for t, host, path, status, retry_after in requests:
        if status not in (429, 503) or retry_after <= 0:
            continue
        times = by_host[host]
        start = bisect.bisect_right(times, t + REACTION_S)
        end = bisect.bisect_left(times, t + retry_after)
        for inside in times[start:end]:
            broken.append(
                f"{host}: {path} answered {status} at {t:.3f} with Retry-After "
                f"{retry_after}, a request came {inside - t:.3f} s later"
            )
    return broken


def requests_while_halted(
    requests: Iterable[Request], source: str, halted: Sequence[tuple[float, float]]
) -> list[str]:
    """Requests to ``source``'s hosts inside one of its ``halted`` spans (unix times)."""
    found = []
    for t, host, path, *_ in requests:
        if host in plan.HOSTS and plan.HOSTS[host].source == source:
            for start, end in halted:
                if start + REACTION_S < t < end:
                    found.append(f"{host}{path} at +{t - start:.3f} s into the halt")
    return found


def statuses(requests: Iterable[Request]) -> Counter[int]:
    return Counter(status for _, _, _, status, _ in requests)


def uuid_of(path: str) -> str:
    """The uuid of an image path (``/ok/UUID.jpg``)."""
    return path.rsplit("/", 1)[-1].split(".", 1)[0]


def duplicates_beyond_copies(
    ends: Mapping[str, Sequence[tuple[str, float, int]]], copies: Mapping[str, int]
) -> int:
    """The uuids that ended more often than their message is in ``inbound_images``: a
    send the feeder saw time out while the broker was paused was written all the same, and
    sent again (tansu has no idempotent producer), so some URLs are queued twice, and each
    copy is crawled, as any producer's duplicate is. What is beyond is the crawler's."""
    return sum(len(seen) > copies.get(uuid, 1) for uuid, seen in ends.items())


def requests_per_copy(requests: Iterable[Request], copies: Mapping[str, int]) -> float | None:
    """Image requests over the copies of their messages in ``inbound_images`` (None before
    any): ``requests_per_image`` with the producer's own duplicates taken out."""
    per_path = Counter(path for _, _, path, _, _ in requests if plan.kind_of(path))
    queued = sum(copies.get(uuid_of(path), 1) for path in per_path)
    return round(sum(per_path.values()) / queued, 4) if queued else None


def fetches_per_image(requests: Iterable[Request]) -> Counter[int]:
    """How many images were requested once, twice, ...: what the crawl did again after
    its faults (a rebalance runs again what was not committed), a 429 or 503 included."""
    per_path = Counter(path for _, _, path, _, _ in requests if plan.kind_of(path))
    return Counter(per_path.values())


def requests_per_image(fetches: Counter[int]) -> float | None:
    """Image requests over the images requested, from ``fetches_per_image`` (None before
    any): issue 53's figure, a 429 or 503 asked again included."""
    images = sum(fetches.values())
    return round(sum(n * k for n, k in fetches.items()) / images, 4) if images else None


def fetched_again_after_success(
    requests: Iterable[Request], copies: Mapping[str, int] | None = None
) -> int:
    """Image requests made after the image had been served whole (a 200) once, or as
    often as its message is in ``inbound_images`` (``copies``): finished work done
    again, which a rebalance should no longer cost."""
    served: Counter[str] = Counter()
    again = 0
    for _, _, path, status, _ in sorted(requests):
        if not plan.kind_of(path):
            continue
        again += served[path] >= (copies or {}).get(uuid_of(path), 1)
        if status == 200:
            served[path] += 1
    return again
