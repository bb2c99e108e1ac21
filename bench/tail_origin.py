"""nginx as the long tail's origin (``python -m bench --long-tail``, the default
``--tail-origin nginx``): Debian's nginx, one process, answering every host name the
same way ``bench.origin --tail-zone`` does, at the cost of a real web server.

Why not ``bench.origin``: the origin runs on the crawler's machine, and its CPU is taken
from the crawl's. The aiohttp origin spends about 0.2 ms of CPU on a small answer and
more on each new connection, so the long tail's robots.txt and tdmrep.json, and its
connection per host, cost it 0.48-0.57 ms an image more than the one host's image alone
(the 100,000-URL runs of 2026-11-29, ``bench/README.md``): 2-3 % of the machine,
counted against the long tail only. A web server of the open web does that work on its
own machine; nginx does it here at a third of the cost (a scratch client, 3,000 hosts
of three requests each: 0.16-0.20 ms an image against 0.53-0.55; an image on a
kept-alive connection, 0.20-0.22 against 0.35-0.40), so that what is measured is mostly
the crawler. ``--tail-origin aiohttp`` measures with ``bench.origin`` as before.

What it serves (``TailOrigin.root``): ``/robots.txt``, a file that allows everything
(``TAIL_ROBOTS_TXT``); ``/{i}/{anything}`` the corpus file ``i % files`` (a symbolic link
``img/{i}.jpg`` per URL index, made at start); ``/.well-known/tdmrep.json`` a 404, like
any other path; a host name outside the zone (or an address) has no robots.txt (404).
nginx's own ``ETag`` and ``Last-Modified`` go with each image; ``sendfile`` and
``tcp_nopush`` are on, as in Debian's default nginx.conf.

What it was asked (``stats``): nginx's access log (test/harness/nginx.py: a JSON object a
request), read on from where the last call stopped, by kind (``image``, ``image_304``,
``robots``, ``tdmrep``, ``other``) and for the names of the zone by host
(``TailRequests``): the shape of ``bench.origin``'s ``/_stats``, what ``bench.crawl``
reads before and after each measured window.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Final, Self

from bench.origin import manifest_names
from bench.tail_hosts import TAIL_ROBOTS_TXT, TailRequests, tail_host
from image_crawler.contract import TDMREP_PATH
from test.harness.nginx import AccessLogEntry, Nginx

_IMAGE_PATH: Final = re.compile(r"^/\d+/")
# The crawl's connections at once are bounded by the worker's pool; idle ones of finished
# hosts are kept by both sides for a while (aiohttp 15 s): thousands on a long tail.
WORKER_CONNECTIONS: Final = 16_384
# A kept-alive connection is never closed for the number of requests it carried (nginx
# closes after 1,000 by default; ``bench.origin`` never does).
_HTTP_CONFIG: Final = """\
    sendfile on;
    tcp_nopush on;
    keepalive_requests 1000000;
"""


def _server_config(zone: str) -> str:
    """URL index ``i``'s image; the robots.txt only for names of ``zone`` (any other host:
    404, as ``bench.origin`` answers)."""
    names = "(^|\\.)" + re.escape(zone.strip(".").lower()) + "$"
    return f"""
        location ~ "^/(\\d+)/" {{
            try_files /img/$1.jpg =404;
        }}
        location = /robots.txt {{
            if ($host !~* "{names}") {{
                return 404;
            }}
        }}
"""


def kind_of(path: str, status: int) -> str:
    """A request's kind as ``bench.origin`` counts it."""
    if path == "/robots.txt":
        return "robots"
    if path == TDMREP_PATH:
        return "tdmrep"
    if _IMAGE_PATH.match(path):
        return "image_304" if status == 304 else "image"
    return "other"


class TailOrigin:
    """nginx answering every name of ``zone`` as a site with a robots.txt, serving URL
    indexes below ``urls`` from ``corpus_dir`` (its manifest's order), its files in
    ``work_dir``; a context manager (started on entry, stopped on exit)."""

    def __init__(self, corpus_dir: Path, work_dir: Path, urls: int, zone: str) -> None:
        self.tail_zone = zone
        self.work_dir = work_dir
        self.root = work_dir / "root"
        self._names = manifest_names(corpus_dir)
        self._corpus_dir = corpus_dir.resolve()
        self._urls = urls
        self._nginx = Nginx(
            self.root,
            work_dir=work_dir / "nginx",
            server_config=_server_config(zone),
            http_config=_HTTP_CONFIG,
            worker_connections=WORKER_CONNECTIONS,
        )
        self._read_to = 0  # bytes of the access log already counted
        self._by_kind: dict[str, int] = {}
        self._tail = TailRequests()

    def _make_root(self) -> None:
        images = self.root / "img"
        images.mkdir(parents=True, exist_ok=True)
        (self.root / "robots.txt").write_text(TAIL_ROBOTS_TXT)
        files = [self._corpus_dir / name for name in self._names]
        for i in range(self._urls):
            link = images / f"{i}.jpg"
            if not link.is_symlink():
                link.symlink_to(files[i % len(files)])

    def start(self) -> Self:
        self._make_root()
        self._nginx.start()
        return self

    def stop(self) -> None:
        self._nginx.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return self._nginx.base_url

    @property
    def port(self) -> int:
        return self._nginx.port

    @property
    def pid(self) -> int | None:
        return self._nginx.pid

    def stats(self) -> dict[str, Any]:
        """What was asked so far, as ``bench.origin``'s ``/_stats`` (``by_kind``, and
        ``tail``: ``TailRequests.summary``); reads only the lines logged since the last
        call (each line is one write: a last one without its newline is left for the
        next)."""
        with self._nginx.access_log_path.open("rb") as log:
            log.seek(self._read_to)
            data = log.read()
        whole = data[: data.rfind(b"\n") + 1]
        self._read_to += len(whole)
        for line in whole.decode(errors="replace").splitlines():
            if line:
                self._note(AccessLogEntry.from_line(line))
        return {"by_kind": dict(self._by_kind), "tail": self._tail.summary()}

    def _note(self, entry: AccessLogEntry) -> None:
        kind = kind_of(entry.path, entry.status)
        self._by_kind[kind] = self._by_kind.get(kind, 0) + 1
        name = tail_host(entry.host, self.tail_zone)
        if name is not None and entry.time_s is not None:
            self._tail.note(name, kind, entry.time_s)
