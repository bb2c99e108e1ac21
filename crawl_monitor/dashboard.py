"""The operator's dashboard: one page at ``/`` on the monitor's METRICS_PORT.

The page (``static/dashboard.html``) is self-contained: its one script and one style
sheet are inline, and the only thing it fetches is ``/metrics`` of the same origin, whose
text it parses itself; it keeps the throughput history in the browser tab. It is
read-only and shows nothing that ``/metrics`` does not already expose.

The Content-Security-Policy sent with it allows exactly the page's own inline blocks (by
their SHA-256, computed here from the file, so the policy cannot drift from the page),
fetches to the same origin and ``data:`` images (the tab's icon); everything else is
refused, so that neither an injected script nor a third-party resource can run or load.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import importlib.resources
import re
from collections.abc import Mapping
from types import MappingProxyType

from aiohttp import web

PAGE = "static/dashboard.html"

# The page's inline blocks; they carry no attribute (no ``src``: nothing from outside).
_INLINE = re.compile(r"<(script|style)>(.*?)</\1>", re.DOTALL)


@dataclasses.dataclass(frozen=True, slots=True)
class Page:
    """The page's bytes and the headers it is served with."""

    body: bytes
    headers: Mapping[str, str]


def inline_hashes(html: str) -> dict[str, list[str]]:
    """``script`` and ``style`` -> the CSP sources (``'sha256-...'``) of each inline block."""
    hashes: dict[str, list[str]] = {"script": [], "style": []}
    for tag, text in _INLINE.findall(html):
        digest = base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()
        hashes[tag].append(f"'sha256-{digest}'")
    return hashes


def content_security_policy(html: str) -> str:
    """The policy for ``html``: its inline blocks, same-origin fetches, nothing else."""
    hashes = inline_hashes(html)
    directives = {
        "default-src": "'none'",
        "script-src": " ".join(hashes["script"]) or "'none'",
        "style-src": " ".join(hashes["style"]) or "'none'",
        "connect-src": "'self'",
        "img-src": "data:",
        "base-uri": "'none'",
        "form-action": "'none'",
        "frame-ancestors": "'none'",
        # The page builds its DOM with text and elements only, never from HTML strings.
        "require-trusted-types-for": "'script'",
        "trusted-types": "'none'",
    }
    return "; ".join(f"{name} {value}" for name, value in directives.items())


@functools.cache
def page() -> Page:
    """The page, read from the package once per process."""
    html = importlib.resources.files("crawl_monitor").joinpath(PAGE).read_text("utf-8")
    headers = {
        "Content-Type": "text/html; charset=utf-8",
        "Content-Security-Policy": content_security_policy(html),
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        # A new release's page replaces the old one at once.
        "Cache-Control": "no-cache",
    }
    return Page(html.encode(), MappingProxyType(headers))


def routes() -> list[web.RouteDef]:
    """The dashboard's routes, added to the monitor's metrics server."""
    dashboard = page()

    async def index(_: web.Request) -> web.Response:
        return web.Response(body=dashboard.body, headers=dict(dashboard.headers))

    return [web.get("/", index)]
