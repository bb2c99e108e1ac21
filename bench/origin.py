"""The benchmark's image origin: ``python -m bench.origin CORPUS_DIR PORT``.

A separate process, so that its CPU is neither counted as the worker's nor competes
inside the worker's event loop. Every corpus file is read into memory at start;
``GET /{index}/{anything}.jpg`` answers file ``index % files`` with keep-alive (aiohttp's
default), so distinct URLs can share a few hundred bodies. ``GET /health`` answers the
number of files once the corpus is loaded. No access log: it would cost more CPU than the
requests.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from aiohttp import web


def make_app(bodies: list[bytes]) -> web.Application:
    async def image(request: web.Request) -> web.Response:
        try:
            index = int(request.match_info["index"])
        except ValueError:
            raise web.HTTPNotFound() from None
        return web.Response(body=bodies[index % len(bodies)], content_type="image/jpeg")

    async def health(_: web.Request) -> web.Response:
        return web.Response(text=str(len(bodies)))

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/{index}/{name}", image)
    return app


def load(directory: Path) -> list[bytes]:
    manifest = json.loads((directory / "manifest.json").read_text())
    return [(directory / f["name"]).read_bytes() for f in manifest["files"]]


def main() -> None:
    directory, port = Path(sys.argv[1]), int(sys.argv[2])
    web.run_app(
        make_app(load(directory)),
        host="127.0.0.1",
        port=port,
        access_log=None,
        print=None,
        # Up to MAX_TASKS x workers connections at once.
        backlog=4096,
    )


if __name__ == "__main__":
    main()
