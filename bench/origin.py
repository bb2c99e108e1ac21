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
"""

from __future__ import annotations

import argparse
import json
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


def make_app(bodies: list[bytes], opt_outs: bool = False) -> web.Application:
    headers = OPT_OUT_HEADERS if opt_outs else ()

    async def image(request: web.Request) -> web.Response:
        try:
            index = int(request.match_info["index"])
        except ValueError:
            raise web.HTTPNotFound() from None
        response = web.Response(body=bodies[index % len(bodies)], content_type="image/jpeg")
        for name, value in headers:
            response.headers.add(name, value)
        return response

    async def health(_: web.Request) -> web.Response:
        return web.Response(text=str(len(bodies)))

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/{index}/{name}", image)
    return app


def load(directory: Path, kind: str | None = None) -> list[bytes]:
    """The bodies of the manifest's files (only those of ``kind`` when given)."""
    manifest = json.loads((directory / "manifest.json").read_text())
    files = [f for f in manifest["files"] if kind is None or f["kind"] == kind]
    if not files:
        raise SystemExit(f"no corpus file of kind {kind!r} in {directory}")
    return [(directory / f["name"]).read_bytes() for f in files]


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
