"""A minimal S3-compatible sink: ``python -m bench.s3sink PORT``.

moto, the S3 server of the tests, is single-threaded Python that keeps every object in
memory; under a crawl of dozens of images a second it becomes the bottleneck (PUTs stall
for seconds, its CPU takes a third of a core) and its memory grows by the size of every
thumbnail. A real S3 is neither, so by default the benchmark stores thumbnails here:
``PUT /{bucket}`` and ``PUT /{bucket}/{key}`` answer 200 with an ETag (the MD5 of the
body, as S3 does for a plain PUT), keep nothing but counts, and check each object is a
JPEG (its first bytes, or inside an aws-chunked body). Signatures are not checked.
``GET /_stats`` answers the counts as JSON. ``--s3 moto`` uses moto instead.
"""

from __future__ import annotations

import hashlib
import json
import sys

from aiohttp import web

_JPEG_START = b"\xff\xd8\xff"


def make_app() -> web.Application:
    stats = {"buckets": 0, "objects": 0, "bytes": 0, "not_jpeg": 0}
    keys: set[str] = set()

    async def put(request: web.Request) -> web.Response:
        body = await request.read()
        if not request.match_info.get("key"):
            stats["buckets"] += 1
            return web.Response(status=200)
        keys.add(request.path)
        stats["objects"] = len(keys)
        stats["bytes"] += len(body)
        # aws-chunked bodies start with a hex chunk size line; the JPEG follows it.
        if _JPEG_START not in body[:128]:
            stats["not_jpeg"] += 1
        etag = hashlib.md5(body, usedforsecurity=False).hexdigest()
        return web.Response(status=200, headers={"ETag": f'"{etag}"'})

    async def head(_: web.Request) -> web.Response:
        return web.Response(status=200)

    async def report(_: web.Request) -> web.Response:
        return web.Response(text=json.dumps(stats), content_type="application/json")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_get("/_stats", report)
    app.router.add_put("/{bucket}", put)
    app.router.add_put("/{bucket}/{key:.+}", put)
    app.router.add_route("HEAD", "/{bucket}", head)
    return app


def main() -> None:
    web.run_app(make_app(), host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)


if __name__ == "__main__":
    main()
