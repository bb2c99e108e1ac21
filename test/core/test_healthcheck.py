"""``python -m image_crawler.healthcheck``, the containers' health check: run as the image
runs it against a real metrics server, and the pure choice of ports from /proc's tables.

Outside a container the check sees every process of the machine, so a range here holds
the test's own server and free ports only: what answers is the test's server or nothing.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping

import pytest
from prometheus_client import CollectorRegistry

from image_crawler.healthcheck import TIMEOUT_S, listening_ports
from image_crawler.metrics import serving
from image_crawler.ports import PortRange
from test.harness.services import free_port_range

PROCESS_TIMEOUT_S = 30

HEADER = (
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
    "timeout inode"
)
V6_ANY = "0" * 32


def _row(local: str, state: str, inode: int) -> str:
    remote = "00000000:0000" if len(local) < 20 else f"{V6_ANY}:0000"
    return (
        f"   0: {local} {remote} {state} 00000000:00000000 00:00000000 00000000  10001"
        f"        0 {inode} 1 0000000000000000 100 0 0 10 0"
    )


def _table(*rows: str) -> str:
    return "\n".join([HEADER, *rows]) + "\n"


# 0x238D, 0x238E, 0x238F: 9101, 9102, 9103.
TCP = _table(
    _row("00000000:238D", "0A", 11),  # listening on every interface, 9101
    _row("0100007F:238E", "0A", 12),  # listening on 127.0.0.1, 9102
    _row("0100007F:238F", "01", 13),  # an established connection from 9103
    _row("0100007F:1F90", "0A", 14),  # listening on 8080, outside the range
)
TCP6 = _table(_row(f"{V6_ANY}:238F", "0A", 15))  # listening on ::, 9103

RANGE = PortRange(9101, 9103)


@pytest.mark.parametrize(
    ("tables", "inodes", "ports", "expected"),
    [
        ([TCP, TCP6], {11, 12, 13, 14, 15}, RANGE, [9101, 9102, 9103]),
        # A sibling container's process listens on 9101: its socket is not one of ours.
        ([TCP, TCP6], {12}, RANGE, [9102]),
        ([TCP, TCP6], {15}, RANGE, [9103]),
        # Our socket on 9103 is a connection, not a listener.
        ([TCP], {13}, RANGE, []),
        ([TCP], {14}, RANGE, []),
        ([TCP], {14}, PortRange(8080, 8081), [8080]),
        ([TCP, TCP6], set(), RANGE, []),
        # The same port on IPv4 and IPv6 is one port.
        ([TCP, _table(_row(f"{V6_ANY}:238D", "0A", 16))], {11, 16}, RANGE, [9101]),
        ([_table()], {11}, RANGE, []),
        (["", "\n"], {11}, RANGE, []),
    ],
)
def test_the_ports_checked_are_the_listeners_of_this_container_in_the_range(
    tables, inodes, ports, expected
):
    assert listening_ports(tables, inodes, ports) == expected


async def _check(env: Mapping[str, str]) -> tuple[int, str]:
    """The check's exit status and stderr; run without blocking the server's loop."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "image_crawler.healthcheck",
        env={"PATH": os.environ.get("PATH", os.defpath), **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), PROCESS_TIMEOUT_S)
    assert out == b""
    assert process.returncode is not None
    return process.returncode, err.decode()


def _said(err: str, *fragments: str) -> bool:
    """One line on stderr holding every fragment."""
    return len(err.splitlines()) == 1 and all(fragment in err for fragment in fragments)


def test_the_check_imports_the_standard_library_and_our_own_code_only():
    # Every 10 s in every container: no aiohttp, redis or structlog to load first.
    script = (
        "import sys, image_crawler.healthcheck;"
        "print(*{name.split('.')[0] for name in sys.modules}, sep='\\n')"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    imported = set(result.stdout.split()) - sys.stdlib_module_names
    # The interpreter's start-up hooks (.pth files of the venv: editable installs) aside.
    assert {name for name in imported if not name.startswith("_")} == {"image_crawler"}


@pytest.mark.parametrize("host", [None, "", "0.0.0.0", "127.0.0.1"])
async def test_a_single_port_is_healthy_while_healthz_answers_200(host):
    problems: list[str] = []
    env = {} if host is None else {"METRICS_HOST": host}
    async with serving(0, "127.0.0.1", CollectorRegistry(), health=lambda: problems) as port:
        env["METRICS_PORT"] = str(port)
        assert await _check(env) == (0, "")
        problems.append("kafka: away for 120 s")
        status, err = await _check(env)
        assert status == 1 and _said(err, f"{port}/healthz answered 503", "kafka: away for 120 s")
    status, err = await _check(env)
    assert status == 1 and _said(err, f"127.0.0.1:{port}/healthz", "refused")


@pytest.mark.timing("asserts the check's seconds between its timeout and timeout + 5 s")
async def test_a_server_that_does_not_answer_fails_after_the_timeout():
    # Listening, so the kernel accepts the connection, but nothing ever reads the request:
    # a process whose event loop is stuck.
    with socket.create_server(("127.0.0.1", 0)) as stuck:
        started = time.monotonic()
        status, err = await _check({"METRICS_PORT": str(stuck.getsockname()[1])})
    assert status == 1 and _said(err, "timed out")
    assert TIMEOUT_S <= time.monotonic() - started < TIMEOUT_S + 5


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({}, "METRICS_PORT is not set"),
        ({"METRICS_PORT": " "}, "METRICS_PORT is not set"),
        ({"METRICS_PORT": "0"}, "METRICS_PORT is 0"),
        ({"METRICS_PORT": "9103-9101"}, "METRICS_PORT: a range runs from its lower port"),
        ({"METRICS_PORT": "http"}, "METRICS_PORT must be a port"),
    ],
)
async def test_a_port_the_check_cannot_ask_is_a_failure(env, says):
    status, err = await _check(env)
    assert status == 1 and _said(err, says)


async def test_with_a_range_the_check_asks_the_port_its_own_process_listens_on():
    ports = free_port_range(3)
    env = {"METRICS_PORT": str(ports), "METRICS_HOST": "0.0.0.0"}
    problems: list[str] = []
    # The second of three: the check finds it, not by trying the first.
    async with serving(ports.first + 1, "127.0.0.1", CollectorRegistry(), health=lambda: problems):
        assert await _check(env) == (0, "")
        problems.append("regulator: no loop completed for 45 s")
        status, err = await _check(env)
        assert status == 1 and _said(err, f"{ports.first + 1}/healthz answered 503", "regulator")
    status, err = await _check(env)
    assert status == 1 and _said(err, f"nothing of this container listens on {ports}")


async def test_with_a_range_every_port_this_container_listens_on_must_be_healthy():
    ports = free_port_range(2)
    env = {"METRICS_PORT": str(ports)}
    sick: list[str] = []
    async with (
        serving(ports.first, "127.0.0.1", CollectorRegistry(), port_last=ports.last),
        serving(
            ports.first, "127.0.0.1", CollectorRegistry(), port_last=ports.last, health=lambda: sick
        ),
    ):
        assert await _check(env) == (0, "")
        sick.append("stopping")
        status, err = await _check(env)
        assert status == 1 and _said(err, f"{ports.last}/healthz answered 503", "stopping")
