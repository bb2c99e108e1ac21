"""Debian's dnsmasq answering a test zone on loopback: a real DNS server for the worker's
resolver (worker/download/dns.py, issue 38).

``find_or_install_dnsmasq()`` takes ``/usr/sbin/dnsmasq`` (or ``dnsmasq`` on PATH), or
installs Debian's ``dnsmasq-base`` with apt-get (as root, as CI runs), the way
test/harness/nginx.py installs nginx: the program alone, where the ``dnsmasq`` package
would also start a system service on port 53. ``Dnsmasq`` then serves, on 127.0.0.1 and
a free port (UDP and TCP), its zone and nothing else (no resolv.conf, no /etc/hosts, no
upstream)::

    with Dnsmasq(work_dir) as dns:
        DnsSettings(servers=(dns.server,))          # "127.0.0.1:PORT"
        ...
        assert dns.queries("img.nx.test") == 1    # A queries, from its log

The zone (names are case-insensitive):

- ``tail.test`` and every name under it: 127.0.0.1, with a TTL of ``WILDCARD_TTL_S`` (the
  long tail of a crawl: any host name, one local origin);
- ``short.test`` (TTL ``SHORT_TTL_S``) and ``long.test`` (``LONG_TTL_S``): 127.0.0.1;
- ``private.test``: ``PRIVATE_ADDRESS``, an address the worker's tests do not allow;
- ``nx.test`` and every name under it: NXDOMAIN;
- ``slow.test`` and every name under it: never answered (dnsmasq forwards the query to a
  UDP socket the harness holds open and never reads);
- ``records``: more ``host-record`` lines (``"name,address[,ttl]"``);
- any other name of ``.test``: NXDOMAIN, never forwarded. Every name has an IPv4 address
  only: its AAAA query gets NODATA (a wildcard name's NXDOMAIN, dnsmasq's way, which
  c-ares takes along with the A answer).

Every query is logged (``log-queries``, to ``work_dir/queries.log``) before it is
answered, so that once a client has its answer, ``queries`` counts it. ``start()``
returns once dnsmasq answers a query of its own zone (sent by hand over UDP, not through
the code under test), on another port when the one picked was taken meanwhile;
``stop()`` is SIGTERM, then SIGKILL after a deadline. Runs in the foreground
(``--keep-in-foreground``), as root when the tests are (``--user=root``: no drop to
``nobody``, who could not write a test's 0700 folder).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import socket
import struct
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Self

from crawlctl.localstack.processes import Child, ServiceError, wait_until
from test.harness.apt import AptUnavailable, apt_install

DNSMASQ = "/usr/sbin/dnsmasq"
PACKAGE = "dnsmasq-base"
LOOPBACK = "127.0.0.1"
WILDCARD_TTL_S = 300
SHORT_TTL_S = 5
LONG_TTL_S = 86400
PRIVATE_ADDRESS = "10.1.2.3"
# Answered with an address: the readiness probe's name.
READY_NAME = "ready.test"
START_ATTEMPTS = 3  # a port taken between picking it and dnsmasq binding it: try another
_BIND_FAILED = "Address already in use"


class NoDnsmasq(Exception):
    """dnsmasq is not here and could not be installed; the message says why."""


def find_or_install_dnsmasq() -> str:
    """dnsmasq's executable: ``/usr/sbin/dnsmasq`` or ``dnsmasq`` on PATH, else Debian's
    ``dnsmasq-base`` installed with apt-get."""
    found = _find()
    if found is not None:
        return found
    try:
        apt_install([PACKAGE])
    except AptUnavailable as e:
        raise NoDnsmasq(
            f"dnsmasq is not installed and {e}: apt-get install {PACKAGE}, or put dnsmasq on PATH"
        ) from None
    found = _find()
    if found is None:
        raise NoDnsmasq(f"dnsmasq is still not there after `apt-get install {PACKAGE}`")
    return found


def _find() -> str | None:
    if os.access(DNSMASQ, os.X_OK):
        return DNSMASQ
    return shutil.which("dnsmasq")


def render_config(
    *, port: int, silent_port: int, log_path: Path, records: Sequence[str] = ()
) -> str:
    """dnsmasq.conf of the zone (see the module's docstring) on 127.0.0.1:``port``."""
    extra = "".join(f"host-record={record}\n" for record in records)
    return f"""\
no-resolv
no-hosts
bind-interfaces
listen-address={LOOPBACK}
port={port}
log-queries
log-facility={log_path}
local-ttl={WILDCARD_TTL_S}
# Every name of .test is answered here, never forwarded (there is nowhere to forward to):
# an AAAA query of an IPv4-only name gets NODATA, not a refusal c-ares would try again.
local=/test/
address=/tail.test/{LOOPBACK}
host-record={READY_NAME},{LOOPBACK}
host-record=short.test,{LOOPBACK},{SHORT_TTL_S}
host-record=long.test,{LOOPBACK},{LONG_TTL_S}
host-record=private.test,{PRIVATE_ADDRESS}
local=/nx.test/
server=/slow.test/{LOOPBACK}#{silent_port}
{extra}"""


def _free_port() -> int:
    """A port free on 127.0.0.1 for both UDP and TCP a moment ago."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.bind((LOOPBACK, 0))
            port = int(udp.getsockname()[1])
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
                try:
                    tcp.bind((LOOPBACK, port))
                except OSError:
                    continue
                return port
    raise ServiceError("no port free for both UDP and TCP on 127.0.0.1")


def dns_query(name: str, query_id: int) -> bytes:
    """A DNS query (RFC 1035 4.1) for ``name``'s A record, recursion desired."""
    header = struct.pack("!HHHHHH", query_id, 0x0100, 1, 0, 0, 0)
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.strip(".").split("."))
    return header + labels + b"\0" + struct.pack("!HH", 1, 1)


def answers(server: tuple[str, int], name: str, timeout_s: float = 0.5) -> bool:
    """Whether ``server`` answers an A query for ``name`` with NOERROR and an answer."""
    query_id = secrets.randbits(16)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.sendto(dns_query(name, query_id), server)
            reply = sock.recv(512)
        except OSError:  # refused (nothing bound yet), or no answer in time
            return False
    if len(reply) < 12:
        return False
    reply_id, flags, _, ancount = struct.unpack("!HHHH", reply[:8])
    return reply_id == query_id and flags & 0x000F == 0 and ancount > 0


class _PortTaken(ServiceError):
    pass


class Dnsmasq(Child):
    """dnsmasq serving the test zone (see the module's docstring) on 127.0.0.1 and
    ``port`` (a free one when not given), with ``records`` added."""

    name = "dnsmasq"
    start_timeout_s = 10.0
    stop_timeout_s = 5.0

    def __init__(
        self,
        work_dir: Path | None = None,
        *,
        port: int | None = None,
        records: Sequence[str] = (),
        binary: str | None = None,
    ) -> None:
        self.work_dir = (
            Path(work_dir) if work_dir is not None else Path(tempfile.mkdtemp(prefix="dnsmasq-"))
        )
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._fixed_port = port is not None
        self.port = port if port is not None else _free_port()
        self.records = tuple(records)
        self.binary = binary
        # Where slow.test's queries go: bound, never read, never answered.
        self._silent: socket.socket | None = None
        super().__init__(self.work_dir / "dnsmasq.log")

    @property
    def server(self) -> str:
        """The server as DNS_SERVERS (and c-ares) take it: ``127.0.0.1:PORT``."""
        return f"{LOOPBACK}:{self.port}"

    @property
    def config_path(self) -> Path:
        return self.work_dir / "dnsmasq.conf"

    @property
    def query_log_path(self) -> Path:
        return self.work_dir / "queries.log"

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> Self:
        """Start dnsmasq and return once it answers; raises ``NoDnsmasq`` when it is not
        installed and cannot be, ``ServiceError`` (with its log's tail) when it does not
        start. A port picked here that was taken meanwhile is replaced by another."""
        if self.running:
            raise ServiceError(f"dnsmasq is already running (pid {self.pid})")
        if self.binary is None:
            self.binary = find_or_install_dnsmasq()
        attempts = 1 if self._fixed_port else START_ATTEMPTS
        for attempt in range(attempts):
            try:
                self._start_once(self.binary)
                return self
            except _PortTaken:
                if attempt == attempts - 1:
                    raise
                self.port = _free_port()
        raise AssertionError("unreachable")

    def _start_once(self, binary: str) -> None:
        if self._silent is None:
            self._silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self._silent.bind((LOOPBACK, 0))
        self.config_path.write_text(
            render_config(
                port=self.port,
                silent_port=int(self._silent.getsockname()[1]),
                log_path=self.query_log_path.resolve(),
                records=self.records,
            )
        )
        command = [
            binary,
            "--keep-in-foreground",
            f"--conf-file={self.config_path.resolve()}",
            f"--pid-file={(self.work_dir / 'dnsmasq.pid').resolve()}",
        ]
        if os.geteuid() == 0:
            command += ["--user=root", "--group=root"]
        self._spawn(command, None, banner=f"dnsmasq starting on {self.server}")

        def ready() -> bool:
            assert self._proc is not None
            if self._proc.poll() is not None:
                logs = self.log_tail()
                error = _PortTaken if _BIND_FAILED in logs else ServiceError
                raise error(
                    f"dnsmasq exited with {self._proc.returncode} before answering on "
                    f"{self.server}:\n{logs}"
                )
            return answers((LOOPBACK, self.port), READY_NAME)

        try:
            wait_until(ready, self.start_timeout_s, what=f"dnsmasq on {self.server}")
        except TimeoutError as exc:
            self.kill()
            raise ServiceError(f"{exc}:\n{self.log_tail()}") from exc
        except ServiceError:
            self.kill()
            raise

    def _after_exit(self) -> None:
        super()._after_exit()
        if self._silent is not None and not self.running:
            self._silent.close()
            self._silent = None

    def __enter__(self) -> Self:
        if not self.running:
            self.start()
        return self

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<Dnsmasq {self.server} {state} work_dir={self.work_dir}>"

    # --- what it was asked -----------------------------------------------------------------
    def queries(self, name: str, qtype: str = "A") -> int:
        """How many ``qtype`` queries for ``name`` (any case) dnsmasq has logged."""
        with contextlib.suppress(FileNotFoundError):
            text = self.query_log_path.read_text(errors="replace")
            pattern = rf"\bquery\[{re.escape(qtype)}\] {re.escape(name)} from "
            return len(re.findall(pattern, text, re.IGNORECASE))
        return 0
