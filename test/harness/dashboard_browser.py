"""A headless Chromium driven through the DevTools protocol, for the dashboard's tests.

``find_or_install_chromium()`` takes ``chromium`` from PATH or installs Debian's package
with apt-get (as root, as CI runs). ``Browser`` starts it on loopback with a throwaway
profile, the DevTools port chosen by Chromium (``--remote-debugging-port=0``, read back
from ``DevToolsActivePort``), and opens a ``Tab``: a DevTools session over aiohttp's
websocket client that records every event (console messages, exceptions, network
requests) so that a test can assert on them, and evaluates JavaScript for conditions to
wait on. Host names other than localhost resolve to nothing, so the browser cannot reach
the internet whatever a page asks for; the test still checks that nothing was asked.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import shutil
import subprocess
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from test.harness.apt import AptUnavailable, apt_install
from test.harness.services import wait_for, wait_until

BROWSERS = ("chromium", "chromium-browser")
START_TIMEOUT_S = 60
CALL_TIMEOUT_S = 30


class NoBrowser(Exception):
    """No Chromium here, and it could not be installed; the message says why."""


def _which() -> str | None:
    for name in BROWSERS:
        if found := shutil.which(name):
            return found
    return None


def find_or_install_chromium() -> str:
    """Chromium's executable: from PATH, else Debian's ``chromium`` installed with apt-get."""
    found = _which()
    if found is not None:
        return found
    try:
        apt_install(["chromium"])
    except AptUnavailable as e:
        raise NoBrowser(
            f"chromium is not on PATH and {e}: apt-get install chromium, or put it on PATH"
        ) from None
    found = _which()
    if found is None:
        raise NoBrowser("chromium is still not on PATH after `apt-get install chromium`")
    return found


class CDPError(Exception):
    """A DevTools command answered with an error, or a script threw."""


class Tab:
    """One page target's DevTools session; ``events`` holds every event received."""

    def __init__(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        self._socket = socket
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.events: list[dict[str, Any]] = []
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for message in self._socket:
            if message.type is not aiohttp.WSMsgType.TEXT:
                continue
            data = json.loads(message.data)
            future = self._pending.pop(data.get("id", -1), None)
            if future is None:
                self.events.append(data)
            elif not future.done():
                future.set_result(data)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(CDPError("the DevTools connection closed"))

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        """Run one DevTools command; its ``result``."""
        if self._reader.done():
            raise CDPError(f"{method}: the DevTools connection is closed")
        call_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = future
        await self._socket.send_json({"id": call_id, "method": method, "params": params})
        answer = await asyncio.wait_for(future, CALL_TIMEOUT_S)
        if "error" in answer:
            raise CDPError(f"{method}: {answer['error']}")
        result: dict[str, Any] = answer.get("result", {})
        return result

    async def evaluate(self, expression: str) -> Any:
        """The JSON value of ``expression`` in the page (promises are awaited)."""
        result = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise CDPError(f"{expression!r} threw: {text}")
        return result["result"].get("value")

    async def wait_until(self, expression: str, timeout_s: float, what: str) -> Any:
        """Evaluate ``expression`` until it is truthy; that value."""
        return await wait_for(
            lambda: self.evaluate(expression), timeout_s, interval_s=0.1, what=what
        )

    async def navigate(self, url: str) -> None:
        """Open ``url`` and return once its document has loaded."""
        navigated = await self.send("Page.navigate", url=url)
        if "errorText" in navigated:
            raise CDPError(f"{url}: {navigated['errorText']}")
        await self.wait_until(
            f"location.href === {json.dumps(url)} && document.readyState === 'complete'",
            CALL_TIMEOUT_S,
            f"{url} loaded",
        )

    async def click(self, selector: str) -> None:
        """A real mouse click (pressed and released) in the middle of the element."""
        box = await self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return {x: r.x + r.width / 2, y: r.y + r.height / 2}; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            await self.send(
                "Input.dispatchMouseEvent",
                type=kind,
                x=box["x"],
                y=box["y"],
                button="left",
                clickCount=1,
            )

    async def type_text(self, selector: str, text: str) -> None:
        """Focus the element and type ``text`` as keyboard input."""
        await self.evaluate(f"document.querySelector({json.dumps(selector)}).focus()")
        await self.send("Input.insertText", text=text)

    async def screenshot(self) -> bytes:
        """The whole page, as a PNG."""
        data = await self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        return base64.b64decode(data["data"])

    def named(self, *methods: str) -> list[dict[str, Any]]:
        """The params of the events named one of ``methods``, in order."""
        return [e.get("params", {}) for e in self.events if e.get("method") in methods]

    def problems(self) -> list[str]:
        """Console errors and warnings, uncaught exceptions and browser log errors."""
        found = []
        for params in self.named("Runtime.consoleAPICalled"):
            if params.get("type") in ("error", "warning", "assert"):
                args = [a.get("value", a.get("description")) for a in params.get("args", [])]
                found.append(f"console.{params['type']}: {args}")
        for params in self.named("Runtime.exceptionThrown"):
            details = params.get("exceptionDetails", {})
            found.append(f"exception: {details.get('exception', {}).get('description')}")
        for params in self.named("Log.entryAdded"):
            entry = params.get("entry", {})
            if entry.get("level") in ("error", "warning"):
                found.append(f"log {entry.get('level')}: {entry.get('text')} {entry.get('url')}")
        return found

    def requested_urls(self) -> list[str]:
        """Every URL the page asked for (documents, fetches, subresources)."""
        return [p["request"]["url"] for p in self.named("Network.requestWillBeSent")]

    async def close(self) -> None:
        await self._socket.close()
        await self._reader


class Browser:
    """A headless Chromium on loopback with a throwaway profile in ``profile_dir``."""

    def __init__(self, executable: str, profile_dir: Path, size: tuple[int, int]) -> None:
        self.executable = executable
        self.profile_dir = profile_dir
        self.size = size
        self.log_path = profile_dir.parent / "chromium.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.port: int | None = None

    def command(self) -> list[str]:
        width, height = self.size
        return [
            self.executable,
            "--headless",
            # The suite runs as root in a container, where Chromium's sandbox cannot start.
            "--no-sandbox",
            "--disable-dev-shm-usage",
            "--disable-gpu",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            f"--user-data-dir={self.profile_dir}",
            f"--window-size={width},{height}",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--disable-default-apps",
            "--mute-audio",
            "--hide-scrollbars",
            "--force-color-profile=srgb",
            # Loopback only: every other host name resolves to nothing.
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1",
            "about:blank",
        ]

    def start(self) -> None:
        self.profile_dir.mkdir(parents=True, exist_ok=True)
        (self.profile_dir / "DevToolsActivePort").unlink(missing_ok=True)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        active = self.profile_dir / "DevToolsActivePort"

        def port() -> int | None:
            if self.process is not None and self.process.poll() is not None:
                raise NoBrowser(f"chromium exited {self.process.returncode}:\n{self.log_tail()}")
            lines = active.read_text().splitlines() if active.exists() else []
            return int(lines[0]) if len(lines) >= 2 else None

        self.port = wait_until(port, START_TIMEOUT_S, interval_s=0.05, what="DevTools port")

    @contextlib.asynccontextmanager
    async def tab(self, session: aiohttp.ClientSession) -> AsyncIterator[Tab]:
        """A new page with the domains the tests watch enabled."""
        base = f"http://127.0.0.1:{self.port}"
        async with session.put(f"{base}/json/new?about:blank") as response:
            target = await response.json()
        socket = await session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0)
        tab = Tab(socket)
        try:
            for domain in ("Page", "Runtime", "Network", "Log"):
                await tab.send(f"{domain}.enable")
            yield tab
        finally:
            await tab.close()

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


def other_origins(urls: Sequence[str], origin: str) -> list[str]:
    """The URLs not on ``origin`` (``data:`` URLs are the page's own bytes)."""
    return [
        u for u in urls if not (u.startswith(f"{origin}/") or u == origin or u.startswith("data:"))
    ]
