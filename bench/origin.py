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
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
from datetime import UTC
from email.utils import formatdate, parsedate_to_datetime
from pathlib import Path

from aiohttp import web

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


def make_app(files: list[File], opt_outs: bool = False) -> web.Application:
    headers = OPT_OUT_HEADERS if opt_outs else ()

    async def image(request: web.Request) -> web.Response:
        try:
            index = int(request.match_info["index"])
        except ValueError:
            raise web.HTTPNotFound() from None
        file = files[index % len(files)]
        asked = request.headers
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

    async def health(_: web.Request) -> web.Response:
        return web.Response(text=str(len(files)))

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/{index}/{name}", image)
    return app


def load(directory: Path, kind: str | None = None) -> list[File]:
    """The manifest's files (only those of ``kind`` when given), with their validators."""
    manifest_path = directory / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    names = [f["name"] for f in manifest["files"] if kind is None or f["kind"] == kind]
    if not names:
        raise SystemExit(f"no corpus file of kind {kind!r} in {directory}")
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
    args = parser.parse_args()
    web.run_app(
        make_app(load(args.directory, args.kind), args.opt_outs),
        host="127.0.0.1",
        port=args.port,
        access_log=None,
        print=None,
        # Up to MAX_TASKS x workers connections at once.
        backlog=4096,
    )


if __name__ == "__main__":
    main()
