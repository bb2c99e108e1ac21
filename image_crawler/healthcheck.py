"""``python -m image_crawler.healthcheck``: the Docker health check of the monitor and workers.

Exits 0 when ``GET http://HOST:PORT/healthz`` answers 200, else 1 (a 503 with problems,
a refused connection, no answer in 3 s, METRICS_PORT unset or 0) with one line on
stderr saying why. HOST is METRICS_HOST, or 127.0.0.1 when that is unset or every
interface (0.0.0.0, ::). PORT is METRICS_PORT when it is one port. When it is a range
FIRST-LAST, the ports of the range that a process of this container listens on: the
listening sockets of /proc/net/tcp and tcp6 whose inode is a ``socket:[inode]`` link
under /proc/PID/fd of a process this check can see (those in its PID namespace; pids it
cannot read are skipped). Each must answer 200, and none is a failure. Not simply any
port of the range that answers: with host networking, the other ports are the sibling
containers' processes.

Standard library only, besides image_crawler.ports: the check runs in about 0.1 s.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Mapping, Set
from pathlib import Path
from typing import Final

from image_crawler.ports import PortRange, parse_ports

TIMEOUT_S: Final = 3.0
LOOPBACK: Final = "127.0.0.1"
EVERY_INTERFACE: Final = frozenset({"", "0.0.0.0", "::"})
TCP_TABLES: Final = ("/proc/net/tcp", "/proc/net/tcp6")
TCP_LISTEN: Final = "0A"  # the st column of a listening socket

# Straight to the address, whatever http_proxy says.
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def listening_ports(tables: Iterable[str], inodes: Set[int], ports: PortRange) -> list[int]:
    """The ports in ``ports`` of the listening sockets of ``tables`` (the text of
    /proc/net/tcp and tcp6) whose inode is in ``inodes``; sorted, each once."""
    found: set[int] = set()
    for table in tables:
        for line in table.splitlines()[1:]:  # the first line names the columns
            fields = line.split()
            if len(fields) < 10 or fields[3] != TCP_LISTEN:
                continue
            port = int(fields[1].rsplit(":", 1)[1], 16)
            if port in ports and int(fields[9]) in inodes:
                found.add(port)
    return sorted(found)


def _socket_inodes(proc: Path = Path("/proc")) -> set[int]:
    """The inodes of every socket the processes this check can see hold open."""
    inodes: set[int] = set()
    for fds in proc.glob("[0-9]*/fd"):
        try:
            links = [os.readlink(fd) for fd in fds.iterdir()]
        except OSError:  # not ours to read, or gone meanwhile
            continue
        inodes |= {int(link[8:-1]) for link in links if link.startswith("socket:[")}
    return inodes


def _read_tables() -> Iterator[str]:
    for path in TCP_TABLES:
        try:
            yield Path(path).read_text()
        except OSError:  # no IPv6
            continue


def _problem(url: str) -> str | None:
    """Why ``url`` is not healthy, or None when it answers 200."""
    try:
        with _opener.open(url, timeout=TIMEOUT_S) as response:
            status = response.status
    except urllib.error.HTTPError as e:
        return f"{url} answered {e.code}: {_problems(e) or e.reason}"
    except (OSError, http.client.HTTPException) as e:
        reason = e.reason if isinstance(e, urllib.error.URLError) else e
        return f"{url}: {reason or type(e).__name__}"
    return None if status == 200 else f"{url} answered {status}"


def _problems(error: urllib.error.HTTPError) -> str:
    """The problems a 503 of /healthz lists, joined; empty when its body has none."""
    try:
        with error:
            problems = json.loads(error.read()).get("problems")
    except (OSError, ValueError, AttributeError):
        return ""
    return "; ".join(map(str, problems)) if isinstance(problems, list) else ""


def check(env: Mapping[str, str]) -> str | None:
    """Why this container's process is not healthy, or None when it is."""
    raw = env.get("METRICS_PORT", "").strip()
    if not raw:
        return "METRICS_PORT is not set: the process serves no /healthz"
    try:
        ports = parse_ports("METRICS_PORT", raw)
    except ValueError as e:
        return str(e)
    if ports.first == 0:
        return "METRICS_PORT is 0 (any free port): set the port or a range FIRST-LAST"
    found = [ports.first]
    if ports.is_range:
        found = listening_ports(_read_tables(), _socket_inodes(), ports)
        if not found:
            return f"nothing of this container listens on {ports}"
    host = env.get("METRICS_HOST", "").strip()
    host = LOOPBACK if host in EVERY_INTERFACE else host
    host = f"[{host}]" if ":" in host else host
    for port in found:
        problem = _problem(f"http://{host}:{port}/healthz")
        if problem is not None:
            return problem
    return None


def main() -> int:
    problem = check(os.environ)
    if problem is None:
        return 0
    print(f"unhealthy: {problem}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
