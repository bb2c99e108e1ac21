"""Debian's nginx serving a folder on loopback: a real HTTP server with its own ``ETag``,
``Last-Modified`` and 304 answers, for the re-check tests (issue 30).

``find_or_install_nginx()`` takes ``/usr/sbin/nginx`` (or ``nginx`` on PATH), or installs
Debian's ``nginx`` package with apt-get (as root, as CI runs), the way
``dashboard_browser.find_or_install_chromium`` installs Chromium. (Debian 12's
``nginx-light`` is only a transitional package that pulls in ``nginx`` and an echo
module.) ``Nginx`` then serves a folder::

    with Nginx(folder) as nginx:            # 127.0.0.1, a free port
        url = nginx.url("/cat.jpg")
        ...
        [entry] = nginx.wait_for_requests(1, path="/cat.jpg")
        assert entry.status == 304 and entry.body_bytes == 0

The server is nginx's static module with its defaults, written out in the config so that
they show: ``etag on`` (a strong ``"{mtime hex}-{size hex}"``, so a file rewritten with
the same size in the same second keeps its ETag: give it a new mtime with ``os.utime``),
``if_modified_since exact`` (304 only when If-Modified-Since equals the Last-Modified;
``before`` answers 304 to any date not older), no ``open_file_cache`` (every request
stats the file, so a replaced or deleted file shows at once). An If-None-Match that
matches (weak comparison: ``W/"..."``, a list, ``*``) answers 304. When a request carries
both headers, nginx answers 304 only when *both* hold (RFC 9110 would let If-None-Match
decide alone): a matching ETag with an If-Modified-Since other than the Last-Modified
gets 200. A date that does not parse is ignored. ``server_config`` adds directives to the
server block (``location = /gone.jpg { return 410; }``), ``http_config`` to the http block
(``limit_req_zone ...``).

Several hosts: ``also`` adds server blocks (``VirtualServer``) on other loopback addresses
(Linux answers on all of 127.0.0.0/8), on the same port, serving the same folder, each with
its own directives; ``url(path, host=...)`` names one. A host per address, not per server
name: nothing in /etc/hosts is needed. A per-host limiter, for instance::

    http_config = "limit_req_zone $host zone=slow:1m rate=5r/s; limit_req_status 503;"
    with Nginx(folder, host="127.0.0.2", server_config="limit_req zone=slow burst=5 nodelay;",
               also=[VirtualServer("127.0.0.3")]) as nginx:   # 127.0.0.3 is not limited
        ...

One process (``master_process off``) in the foreground (``daemon off``): nothing to reap
but the child, and no worker process dropping to ``nobody``, which could not read a
test's 0700 temporary folder (nor is ``user root`` needed). Its config, pid, error log,
access log and temporary folders are all in ``work_dir``; its output goes to
``work_dir/nginx.log``. ``start()`` returns once it answers a request (a location kept
out of the access log), on a new port when the one picked was taken meanwhile;
``stop()`` is SIGQUIT (nginx's graceful shutdown), then SIGKILL after a deadline.
The access log is one JSON object per request (``requests()``): what a test asserts on,
with the host asked for, when nginx logged it and what its limiter did.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import json
import os
import shutil
import signal
import socket
import tempfile
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Self

from crawlctl.localstack.processes import Child, ServiceError, wait_until
from test.harness.apt import AptUnavailable, apt_install

NGINX = "/usr/sbin/nginx"
PACKAGE = "nginx"
LOOPBACK = "127.0.0.1"
# Answered 204 by the server itself and kept out of the access log: the readiness probe.
READY_PATH = "/.nginx-harness-ready"
START_ATTEMPTS = 3  # a port taken between picking it and nginx binding it: try another

# One JSON object a line; nginx writes an unset variable as "". ``$msec``: the Unix time
# (ms resolution) of the log write, once the answer is sent; ``$limit_req_status``: what
# a limit_req did (PASSED, REJECTED, ...; "" where none applies).
_LOG_FORMAT = (
    '{"method":"$request_method","path":"$request_uri","status":$status,'
    '"body_bytes":$body_bytes_sent,"bytes_sent":$bytes_sent,"etag":"$sent_http_etag",'
    '"if_none_match":"$http_if_none_match","if_modified_since":"$http_if_modified_since",'
    '"host":"$host","time_s":$msec,"limit_req":"$limit_req_status"}'
)
# The types of the formats the crawler thumbnails, and a few others; the rest are
# application/octet-stream.
_TYPES = {
    "image/jpeg": "jpg jpeg",
    "image/png": "png",
    "image/gif": "gif",
    "image/webp": "webp",
    "image/avif": "avif",
    "image/x-icon": "ico",
    "image/svg+xml": "svg",
    "text/plain": "txt",
    "text/html": "html",
    "application/json": "json",
}
_BIND_FAILED = ("Address already in use", "could not bind")


class NoNginx(Exception):
    """nginx is not here and could not be installed; the message says why."""


def find_or_install_nginx() -> str:
    """nginx's executable: ``/usr/sbin/nginx`` or ``nginx`` on PATH, else Debian's
    ``nginx`` installed with apt-get."""
    found = _find()
    if found is not None:
        return found
    try:
        apt_install([PACKAGE])
    except AptUnavailable as e:
        raise NoNginx(
            f"nginx is not installed and {e}: apt-get install {PACKAGE}, or put nginx on PATH"
        ) from None
    found = _find()
    if found is None:
        raise NoNginx(f"nginx is still not there after `apt-get install {PACKAGE}`")
    return found


def _find() -> str | None:
    if os.access(NGINX, os.X_OK):
        return NGINX
    return shutil.which("nginx")


@dataclasses.dataclass(frozen=True, slots=True)
class AccessLogEntry:
    """One request as nginx logged it: ``path`` with its query, ``body_bytes`` the body
    sent (0 for a 304), ``bytes_sent`` with the headers; the header fields are None when
    the request carried no such header (or the answer no ETag). ``host``: the host asked
    for, lower-cased, without its port (nginx's ``$host``); ``time_s``: when the answer
    was sent (Unix s, ms resolution); ``limit_req``: what a ``limit_req`` decided
    (``PASSED``, ``REJECTED``, ...), None where none applies."""

    method: str
    path: str
    status: int
    body_bytes: int
    bytes_sent: int
    etag: str | None
    if_none_match: str | None
    if_modified_since: str | None
    host: str | None = None
    time_s: float | None = None
    limit_req: str | None = None

    @classmethod
    def from_line(cls, line: str) -> AccessLogEntry:
        obj = json.loads(line)
        time_s = obj.get("time_s")
        return cls(
            method=obj["method"],
            path=obj["path"],
            status=int(obj["status"]),
            body_bytes=int(obj["body_bytes"]),
            bytes_sent=int(obj["bytes_sent"]),
            etag=obj["etag"] or None,
            if_none_match=obj["if_none_match"] or None,
            if_modified_since=obj["if_modified_since"] or None,
            host=obj.get("host") or None,
            time_s=None if time_s is None else float(time_s),
            limit_req=obj.get("limit_req") or None,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class VirtualServer:
    """One more server block of an ``Nginx``: on ``host`` (another IPv4 loopback
    address), on the same port and serving the same folder, with ``config`` added to its
    block."""

    host: str
    config: str = ""

    def __post_init__(self) -> None:
        _check_loopback(self.host)


def _check_loopback(host: str) -> None:
    address = ipaddress.ip_address(host)
    if address.version != 4 or not address.is_loopback:
        raise ValueError(f"nginx is served on an IPv4 loopback address (127.x), not {host!r}")


def _quoted(path: Path) -> str:
    # The root directive expands variables, and a quote would end the string.
    text = str(path)
    if any(c in text for c in '"\\$') or any(ord(c) < 0x20 for c in text):
        raise ValueError(f"nginx cannot be given this path as it is: {text!r}")
    return f'"{text}"'


def render_config(
    *,
    root: Path,
    host: str,
    port: int,
    work_dir: Path,
    if_modified_since: str = "exact",
    server_config: str = "",
    http_config: str = "",
    also: Sequence[VirtualServer] = (),
    worker_connections: int = 1024,
) -> str:
    """nginx.conf serving ``root`` on ``host:port`` (and on each of ``also``'s hosts, same
    port), every file it writes in ``work_dir``; at most ``worker_connections`` at once."""
    if if_modified_since not in ("exact", "before", "off"):
        raise ValueError(f"if_modified_since is exact, before or off, not {if_modified_since!r}")
    work = work_dir.resolve()
    types = "\n".join(f"        {mime} {exts};" for mime, exts in _TYPES.items())
    temp_paths = "\n".join(
        f"    {kind}_temp_path {_quoted(work / 'temp' / kind)};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    blocks = [(host, server_config), *((s.host, s.config) for s in also)]
    servers = "\n".join(_server_block(root, h, port, config) for h, config in blocks)
    return f"""\
daemon off;
master_process off;
pid {_quoted(work / "nginx.pid")};
lock_file {_quoted(work / "nginx.lock")};
error_log {_quoted(work / "error.log")} notice;

events {{
    worker_connections {worker_connections};
}}

http {{
    types {{
{types}
    }}
    default_type application/octet-stream;
{temp_paths}
    log_format harness escape=json '{_LOG_FORMAT}';
    access_log {_quoted(work / "access.log")} harness;
    # nginx's defaults, written out: what the re-check tests rely on.
    etag on;
    if_modified_since {if_modified_since};
    open_file_cache off;
{http_config}
{servers}
}}
"""


def _server_block(root: Path, host: str, port: int, config: str) -> str:
    return f"""\
    server {{
        listen {host}:{port};
        server_name _;
        root {_quoted(root.resolve())};

        location = {READY_PATH} {{
            access_log off;
            return 204;
        }}
{config}
    }}
"""


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


class _PortTaken(ServiceError):
    pass


class Nginx(Child):
    """nginx serving ``root`` on ``host`` (an IPv4 loopback address) and ``port`` (a free
    one when not given), and on each of ``also``'s hosts on the same port; see the
    module's docstring."""

    name = "nginx"
    start_timeout_s = 10.0
    stop_timeout_s = 5.0

    def __init__(
        self,
        root: Path,
        *,
        host: str = LOOPBACK,
        port: int | None = None,
        work_dir: Path | None = None,
        if_modified_since: str = "exact",
        server_config: str = "",
        http_config: str = "",
        also: Sequence[VirtualServer] = (),
        binary: str | None = None,
        worker_connections: int = 1024,
    ) -> None:
        _check_loopback(host)
        hosts = [host, *(s.host for s in also)]
        if len(set(hosts)) != len(hosts):
            raise ValueError(f"each server of an nginx needs a host of its own: {hosts}")
        self.root = Path(root)
        self.host = host
        self.also = tuple(also)
        self._fixed_port = port is not None
        self.port = port if port is not None else self._pick_port()
        self.work_dir = (
            Path(work_dir) if work_dir is not None else Path(tempfile.mkdtemp(prefix="nginx-"))
        )
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.if_modified_since = if_modified_since
        self.server_config = server_config
        self.http_config = http_config
        self.binary = binary
        self.worker_connections = worker_connections
        super().__init__(self.work_dir / "nginx.log")

    # --- where -----------------------------------------------------------------------------
    @property
    def hosts(self) -> tuple[str, ...]:
        """Every address it serves on: ``host``, then ``also``'s."""
        return (self.host, *(s.host for s in self.also))

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url(self, path: str, host: str | None = None) -> str:
        """``path`` (which starts with ``/``) on ``host`` (one of ``hosts``; ``host`` when
        not given)."""
        if not path.startswith("/"):
            raise ValueError(f"path must start with '/': {path!r}")
        if host is None:
            return f"{self.base_url}{path}"
        if host not in self.hosts:
            raise ValueError(f"nginx does not serve on {host!r}, only on {self.hosts}")
        return f"http://{host}:{self.port}{path}"

    def _pick_port(self) -> int:
        # One port for every host: free on the first, and on the others too if possible
        # (if not, start() finds it taken and picks another).
        for _ in range(START_ATTEMPTS):
            port = _free_port(self.host)
            if all(_port_free(h, port) for h in self.hosts[1:]):
                return port
        return port

    @property
    def config_path(self) -> Path:
        return self.work_dir / "nginx.conf"

    @property
    def access_log_path(self) -> Path:
        return self.work_dir / "access.log"

    @property
    def error_log_path(self) -> Path:
        return self.work_dir / "error.log"

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> Self:
        """Start nginx and return once it answers; raises ``NoNginx`` when it is not
        installed and cannot be, ``ServiceError`` (with the logs' tails) when it does
        not start. A port picked here that was taken meanwhile is replaced by another."""
        if self.running:
            raise ServiceError(f"nginx is already running (pid {self.pid})")
        if self.binary is None:
            self.binary = find_or_install_nginx()
        attempts = 1 if self._fixed_port else START_ATTEMPTS
        for attempt in range(attempts):
            try:
                self._start_once(self.binary)
                return self
            except _PortTaken:
                if attempt == attempts - 1:
                    raise
                self.port = self._pick_port()
        raise AssertionError("unreachable")

    def _start_once(self, binary: str) -> None:
        for host in self.hosts:
            if not _port_free(host, self.port):
                # nginx itself would try to bind for 2.5 s before giving up.
                raise _PortTaken(f"{host}:{self.port} is taken; cannot start nginx")
        (self.work_dir / "temp").mkdir(exist_ok=True)
        self.config_path.write_text(
            render_config(
                root=self.root,
                host=self.host,
                port=self.port,
                work_dir=self.work_dir,
                if_modified_since=self.if_modified_since,
                server_config=self.server_config,
                http_config=self.http_config,
                also=self.also,
                worker_connections=self.worker_connections,
            )
        )
        command = [
            binary,
            "-p",
            str(self.work_dir.resolve()),
            "-c",
            str(self.config_path.resolve()),
            # Errors before the config is read (a bad config) go here too.
            "-e",
            str(self.error_log_path.resolve()),
        ]
        self._spawn(command, None, banner=f"nginx starting on {self.host}:{self.port}")

        def ready() -> bool:
            assert self._proc is not None
            if self._proc.poll() is not None:
                logs = self.logs_tail()
                error = _PortTaken if any(s in logs for s in _BIND_FAILED) else ServiceError
                raise error(
                    f"nginx exited with {self._proc.returncode} before answering on "
                    f"{self.host}:{self.port}:\n{logs}"
                )
            return self._answers()

        try:
            wait_until(ready, self.start_timeout_s, what=f"nginx on {self.host}:{self.port}")
        except TimeoutError as exc:
            self.kill()
            raise ServiceError(f"{exc}:\n{self.logs_tail()}") from exc
        except ServiceError:
            self.kill()
            raise

    def _answers(self) -> bool:
        return all(self._answers_on(host) for host in self.hosts)

    def _answers_on(self, host: str) -> bool:
        try:
            with urllib.request.urlopen(self.url(READY_PATH, host), timeout=0.5) as response:
                return int(response.status) == 204
        except (urllib.error.URLError, OSError):
            return False

    def terminate(self) -> None:
        """SIGQUIT, nginx's graceful shutdown (``stop()`` SIGKILLs after a deadline)."""
        self._signal(signal.SIGQUIT)

    def logs_tail(self, max_bytes: int = 4000) -> str:
        """The ends of nginx's output and of its error log, for failure messages."""
        error_log = ""
        with contextlib.suppress(OSError):
            error_log = self.error_log_path.read_bytes()[-max_bytes:].decode("utf-8", "replace")
        return f"{self.log_tail(max_bytes)}\n--- {self.error_log_path}:\n{error_log}"

    def __enter__(self) -> Self:
        if not self.running:
            self.start()
        return self

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        also = "".join(f" +{h}" for h in self.hosts[1:])
        return f"<Nginx {self.base_url}{also} root={self.root} {state} work_dir={self.work_dir}>"

    # --- what it served --------------------------------------------------------------------
    def requests(self, path: str | None = None) -> list[AccessLogEntry]:
        """Every request logged so far (of ``path`` only when given), in the order logged.

        nginx logs a request once it has sent the answer, so a client may read the
        answer a moment before its line is written: ``wait_for_requests`` waits for it.
        """
        try:
            text = self.access_log_path.read_text(errors="replace")
        except FileNotFoundError:
            return []
        # Each line is one write(); a last line without its newline is not whole yet.
        lines = text.split("\n")[:-1]
        entries = [AccessLogEntry.from_line(line) for line in lines if line]
        if path is None:
            return entries
        return [e for e in entries if e.path == path]

    def wait_for_requests(
        self, count: int, *, path: str | None = None, timeout_s: float = 5.0
    ) -> list[AccessLogEntry]:
        """``requests(path)`` once at least ``count`` are logged; TimeoutError after
        ``timeout_s``. (Blocking: from async code, poll ``requests`` with ``wait_for``.)"""

        def enough() -> list[AccessLogEntry]:
            entries = self.requests(path)
            return entries if len(entries) >= count else []

        if count <= 0:
            return self.requests(path)
        of_path = f" of {path}" if path is not None else ""
        return wait_until(
            enough, timeout_s, interval_s=0.01, what=f"{count} requests{of_path} in nginx's log"
        )
