"""The benchmark's image origin: ``python -m bench.origin CORPUS_DIR [--kind KIND] PORT``.

A separate process, so that its CPU is neither counted as the worker's nor competes
inside the worker's event loop. Every corpus file is read into memory at start;
``GET /{index}/{anything}.jpg`` answers file ``index % files`` with keep-alive (aiohttp's
default), so distinct URLs can share a few hundred bodies. ``GET /health`` answers the
number of files once the corpus is loaded. No access log: it would cost more CPU than the
requests. ``--kind mixed`` serves only the manifest's files of that kind (in manifest
order), so ``index % files`` walks that subset: the comparison with img2dataset.
``--opt-outs`` sends every image with X-Robots-Tag and TDMRep headers the worker reads
(and publishes as opt-outs), so that a crawl measures what reading them costs.

Every file has a strong ``ETag`` (the quoted hex of a hash of its index and bytes) and a
``Last-Modified`` (the manifest's modification time: the corpus's date, the same in every
origin process), both computed once at load. A GET whose ``If-None-Match`` names the
file's ETag (weak comparison, or ``*``), or that carries no If-None-Match and an
``If-Modified-Since`` not older than the Last-Modified, is answered 304 with those two
headers and no body: what a re-check of an unchanged image meets (``--recheck``). A
request without either header costs two header lookups more than before.

``--hosts N`` answers on N more loopback addresses (``host_addresses``: 127.1.0.1
onwards, the same port; never 0.0.0.0), the same files on each, and each of them answers
``/robots.txt`` with ``User-agent: *`` and ``Crawl-delay: --crawl-delay`` (1 s): one
source spread over N hosts, each limited by its robots.txt. 127.0.0.1 keeps no
robots.txt (a 404: nothing limits it). ``GET /_stats`` answers what was asked so far
(``Requests``): requests by kind (``image``, ``image_304``, ``robots``, ``tdmrep``,
``other``), and for the N hosts how many of them were asked, and how many of the gaps
between two requests to one host (arrival times here) were shorter than the Crawl-delay.

``--tail-zone ZONE`` answers any host name of ``ZONE`` (as the benchmark's dnsmasq
resolves every name of ``tail.test`` to 127.0.0.1) as a site of its own: its
``/robots.txt`` allows everything (``bench.tail_hosts``), and ``/_stats`` adds ``tail``,
what those hosts were asked (``TailRequests.summary``).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from email.utils import formatdate, parsedate_to_datetime
from pathlib import Path

from aiohttp import web

from bench.tail_hosts import TAIL_ROBOTS_TXT, TailRequests, tail_host
from image_crawler.contract import TDMREP_PATH

# The address every origin answers on; ``--hosts`` adds host_addresses(N).
PRIMARY_ADDRESS = "127.0.0.1"
# Linux answers on all of 127.0.0.0/8 without configuration; this range is apart from
# the tests' (127.0.0.x) and bench.robots' (127.0.3.x).
_HOSTS_NET = "127.1"
_PER_BLOCK = 250  # addresses .1 to .250 of each 127.1.b.0/24
MAX_HOSTS = 256 * _PER_BLOCK

# Two X-Robots-Tag instances (one for another crawler) and a reservation with its policy:
# every part of the worker's reading of them runs, and none keeps the image out.
OPT_OUT_HEADERS = (
    ("X-Robots-Tag", "otherbot: noindex, nofollow"),
    ("X-Robots-Tag", "noarchive, noai, noimageai, max-image-preview: large"),
    ("tdm-reservation", "1"),
    ("tdm-policy", "https://rights.example.org/tdm-policy.json"),
)


@dataclasses.dataclass(frozen=True, slots=True)
class File:
    """One body and its validators, as served."""

    body: bytes
    etag: str
    last_modified: str  # an HTTP date
    last_modified_s: int  # the same, Unix seconds


def etag_of(index: int, body: bytes) -> str:
    """The strong ETag of file ``index``: a quoted hex digest of its index and bytes."""
    digest = hashlib.blake2b(index.to_bytes(8, "big") + body, digest_size=16)
    return f'"{digest.hexdigest()}"'


def _opaque_tag(tag: str) -> str:
    tag = tag.strip()
    return tag[2:] if tag.startswith("W/") else tag


def not_modified(if_none_match: str | None, if_modified_since: str | None, file: File) -> bool:
    """Whether a GET with these request headers is answered 304 (RFC 9110, 13.1.2 and
    13.1.3): If-None-Match, when present, decides alone (weak comparison, ``*`` matches
    any file); otherwise an If-Modified-Since date not older than the Last-Modified. A
    date that does not parse is ignored."""
    if if_none_match is not None:
        if if_none_match.strip() == "*":
            return True
        return any(_opaque_tag(tag) == file.etag for tag in if_none_match.split(","))
    if if_modified_since is None:
        return False
    try:
        since = parsedate_to_datetime(if_modified_since)
    except (TypeError, ValueError, IndexError):
        return False
    if since.tzinfo is None:
        since = since.replace(tzinfo=UTC)
    return since.timestamp() >= file.last_modified_s


def host_addresses(count: int) -> list[str]:
    """The ``count`` loopback addresses of ``--hosts``: 127.1.0.1 to 127.1.0.250, then
    127.1.1.1 and on (no .0 or .255 in any block)."""
    if not 0 <= count <= MAX_HOSTS:
        raise ValueError(f"between 0 and {MAX_HOSTS} hosts, not {count}")
    return [f"{_HOSTS_NET}.{i // _PER_BLOCK}.{i % _PER_BLOCK + 1}" for i in range(count)]


def robots_txt(crawl_delay_s: float) -> str:
    """The robots.txt of every ``--hosts`` address: no rule but the Crawl-delay."""
    return f"User-agent: *\nCrawl-delay: {crawl_delay_s:g}\n"


@dataclasses.dataclass(frozen=True, slots=True)
class TooSoon:
    """Two requests to one host closer than 0.9 of its Crawl-delay: the shortest such gap
    of that host, the kinds of the two requests, and when the second arrived."""

    gap_s: float
    after: str
    kind: str
    at: str  # ISO 8601, UTC: to find beside the worker's log events


@dataclasses.dataclass(slots=True)
class Requests:
    """What the origin was asked: requests by kind, and for the delayed hosts, how far
    apart each host's requests arrived (``note``'s ``now``: wall-clock seconds, which a
    run of minutes may take as steady; it names when, for the logs)."""

    crawl_delay_s: float
    by_kind: Counter[str] = dataclasses.field(default_factory=Counter)
    by_host: Counter[str] = dataclasses.field(default_factory=Counter)
    last: dict[str, tuple[float, str]] = dataclasses.field(default_factory=dict)
    gaps_s: list[float] = dataclasses.field(default_factory=list)  # 8 bytes a request
    too_soon: dict[str, TooSoon] = dataclasses.field(default_factory=dict)
    # Gaps under the Crawl-delay by the kinds of their two requests ("robots>tdmrep").
    under_delay_kinds: Counter[str] = dataclasses.field(default_factory=Counter)

    def note(self, kind: str, host: str | None, now: float) -> None:
        """One request of ``kind``; ``host`` is a delayed host's address, else None."""
        self.by_kind[kind] += 1
        if host is None:
            return
        self.by_host[host] += 1
        last = self.last.get(host)
        self.last[host] = (now, kind)
        if last is None:
            return
        gap = now - last[0]
        self.gaps_s.append(gap)
        if gap < self.crawl_delay_s:
            self.under_delay_kinds[f"{last[1]}>{kind}"] += 1
        if gap < 0.9 * self.crawl_delay_s and gap < self.too_soon.get(host, _NEVER).gap_s:
            at = datetime.fromtimestamp(now, UTC).isoformat(timespec="milliseconds")
            self.too_soon[host] = TooSoon(gap, last[1], kind, at)

    def summary(self) -> dict[str, object]:
        counts = self.by_host.values()
        gaps = sorted(self.gaps_s)
        marks = (0.01, 0.05, 0.25, 0.5)
        soonest = sorted(self.too_soon.items(), key=lambda item: item[1].gap_s)
        return {
            "by_kind": dict(self.by_kind),
            "hosts_asked": len(self.by_host),
            "requests_per_host_min": min(counts, default=None),
            "requests_per_host_max": max(counts, default=None),
            "crawl_delay_s": self.crawl_delay_s,
            "gaps": len(gaps),
            "gaps_under_delay": sum(1 for g in gaps if g < self.crawl_delay_s),
            "gaps_under_delay_by_kinds": dict(self.under_delay_kinds),
            "gaps_under_90_percent": sum(1 for g in gaps if g < 0.9 * self.crawl_delay_s),
            "hosts_under_90_percent": len(self.too_soon),
            # The (up to) 10 hosts asked soonest again: to find in the worker's log.
            "hosts_under_90_percent_examples": {
                host: dataclasses.asdict(too_soon) for host, too_soon in soonest[:10]
            },
            "min_gap_s": gaps[0] if gaps else None,
            # The shortest gaps: at 1 %, 5 %, 25 % and 50 % of them.
            "gap_s_at": {f"{m:.0%}": gaps[int(m * (len(gaps) - 1))] for m in marks} if gaps else {},
        }


_NEVER = TooSoon(float("inf"), "", "", "")


def _local_address(request: web.Request) -> str | None:
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    return str(sockname[0]) if sockname else None


def _file_response(
    file: File, asked: Mapping[str, str], headers: Sequence[tuple[str, str]]
) -> web.Response:
    """304 to a GET whose validators (``asked``) match ``file``, else its body with
    ``headers`` added."""
    if_none_match = asked.get("If-None-Match")
    if_modified_since = asked.get("If-Modified-Since")
    if (if_none_match is not None or if_modified_since is not None) and not_modified(
        if_none_match, if_modified_since, file
    ):
        return web.Response(
            status=304, headers={"ETag": file.etag, "Last-Modified": file.last_modified}
        )
    response = web.Response(body=file.body, content_type="image/jpeg")
    response.headers["ETag"] = file.etag
    response.headers["Last-Modified"] = file.last_modified
    for name, value in headers:
        response.headers.add(name, value)
    return response


@dataclasses.dataclass(slots=True)
class _Asked:
    """Every request the origin answers, counted: ``Requests`` for the Crawl-delayed
    addresses (``delayed``), ``TailRequests`` for the names of ``tail_zone``."""

    delayed: frozenset[str]
    tail_zone: str
    requests: Requests
    tail: TailRequests = dataclasses.field(default_factory=TailRequests)

    def note(self, kind: str, request: web.Request) -> str | None:
        """Counts the request; returns its tail host's name, if it is one's."""
        now = time.time()
        address = _local_address(request) if self.delayed else None
        self.requests.note(kind, address if address in self.delayed else None, now)
        zone = self.tail_zone
        name = tail_host(request.headers.get("Host"), zone) if zone else None
        if name is not None:
            self.tail.note(name, kind, now)
        return name

    def summary(self) -> dict[str, object]:
        summary = self.requests.summary()
        if self.tail_zone:
            summary["tail"] = self.tail.summary()
        return summary


def make_app(
    files: list[File],
    opt_outs: bool = False,
    delayed: frozenset[str] = frozenset(),
    crawl_delay_s: float = 1.0,
    tail_zone: str = "",
) -> web.Application:
    """The origin's routes; ``delayed``: the addresses whose robots.txt has a Crawl-delay
    of ``crawl_delay_s``; ``tail_zone``: a DNS zone whose every name is a host with a
    robots.txt that allows everything (every other host answers 404 for it)."""
    headers = OPT_OUT_HEADERS if opt_outs else ()
    asked = _Asked(delayed, tail_zone, Requests(crawl_delay_s))
    note = asked.note
    robots = robots_txt(crawl_delay_s)

    async def robots_file(request: web.Request) -> web.Response:
        if note("robots", request) is not None:
            return web.Response(text=TAIL_ROBOTS_TXT)
        if delayed and _local_address(request) in delayed:
            return web.Response(text=robots)
        raise web.HTTPNotFound()

    async def tdmrep(request: web.Request) -> web.Response:
        note("tdmrep", request)
        raise web.HTTPNotFound()

    async def image(request: web.Request) -> web.Response:
        try:
            index = int(request.match_info["index"])
        except ValueError:
            note("other", request)
            raise web.HTTPNotFound() from None
        response = _file_response(files[index % len(files)], request.headers, headers)
        note("image_304" if response.status == 304 else "image", request)
        return response

    async def health(_: web.Request) -> web.Response:
        return web.Response(text=str(len(files)))

    async def stats(_: web.Request) -> web.Response:
        return web.json_response(asked.summary())

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/_stats", stats)
    app.router.add_get("/robots.txt", robots_file)
    app.router.add_get(TDMREP_PATH, tdmrep)
    app.router.add_get("/{index}/{name}", image)
    return app


def manifest_names(directory: Path, kind: str | None = None) -> list[str]:
    """The manifest's file names in its order (only those of ``kind`` when given): URL
    index ``i`` is file ``i % len(names)``."""
    manifest = json.loads((directory / "manifest.json").read_text())
    names = [f["name"] for f in manifest["files"] if kind is None or f["kind"] == kind]
    if not names:
        raise SystemExit(f"no corpus file of kind {kind!r} in {directory}")
    return names


def load(directory: Path, kind: str | None = None) -> list[File]:
    """The manifest's files (only those of ``kind`` when given), with their validators."""
    names = manifest_names(directory, kind)
    manifest_path = directory / "manifest.json"
    modified_s = int(manifest_path.stat().st_mtime)
    modified = formatdate(modified_s, usegmt=True)
    files = []
    for index, name in enumerate(names):
        body = (directory / name).read_bytes()
        files.append(File(body, etag_of(index, body), modified, modified_s))
    return files


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.origin")
    parser.add_argument("directory", type=Path)
    parser.add_argument("port", type=int)
    parser.add_argument("--kind", default=None, help="serve only the files of this kind")
    parser.add_argument(
        "--opt-outs", action="store_true", help="send opt-out headers with every image"
    )
    parser.add_argument(
        "--hosts", type=int, default=0, help="answer on this many more loopback addresses"
    )
    parser.add_argument(
        "--crawl-delay", type=float, default=1.0, help="the Crawl-delay of those hosts, s"
    )
    parser.add_argument(
        "--tail-zone", default="", help="answer every host name of this DNS zone as a site"
    )
    args = parser.parse_args()
    hosts = host_addresses(args.hosts)
    web.run_app(
        make_app(
            load(args.directory, args.kind),
            args.opt_outs,
            frozenset(hosts),
            args.crawl_delay,
            args.tail_zone,
        ),
        # Sites start in this order, and the probe asks the primary address: once it
        # answers, every host does.
        host=[*hosts, PRIMARY_ADDRESS],
        port=args.port,
        access_log=None,
        print=None,
        # Up to MAX_TASKS x workers connections at once (on each address).
        backlog=4096,
    )


if __name__ == "__main__":
    main()
