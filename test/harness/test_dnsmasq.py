"""The dnsmasq harness: Debian's dnsmasq answering the test zone on loopback, asked by hand
over UDP (not through the resolver it is there to test)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from test.harness import dnsmasq as harness
from test.harness.dnsmasq import Dnsmasq, NoDnsmasq, answers, find_or_install_dnsmasq
from test.harness.services import ServiceError

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def dnsmasq_binary() -> str:
    started = time.monotonic()
    try:
        found = find_or_install_dnsmasq()
    except NoDnsmasq as e:
        pytest.fail(f"the resolver's tests need a real DNS server: {e}", pytrace=False)
    print(f"\ndnsmasq: {found} (found or installed in {time.monotonic() - started:.1f} s)")
    return found


@pytest.fixture
def dnsmasq(tmp_path: Path, dnsmasq_binary: str) -> Iterator[Dnsmasq]:
    with Dnsmasq(tmp_path / "dns", binary=dnsmasq_binary, records=["extra.test,127.0.0.9"]) as s:
        yield s


@pytest.mark.timing(
    "asserts no answer for slow.test within 0.5 s; its answers use a 0.5 s UDP timeout"
)
def test_the_zone_answers_as_its_docstring_says(dnsmasq: Dnsmasq) -> None:
    server = ("127.0.0.1", dnsmasq.port)
    for name in ["ready.test", "any.name.tail.test", "short.test", "private.test", "extra.test"]:
        assert answers(server, name), name
    assert not answers(server, "img.nx.test")  # NXDOMAIN: no answer record
    assert not answers(server, "unknown.test")
    started = time.monotonic()
    assert not answers(server, "x.slow.test", timeout_s=0.5)  # nothing comes back at all
    assert time.monotonic() - started >= 0.5
    assert dnsmasq.queries("any.name.tail.test") == 1
    assert dnsmasq.queries("ANY.name.TAIL.test") == 1  # names are case-insensitive
    assert dnsmasq.queries("x.slow.test") == 1
    assert dnsmasq.queries("never.asked.test") == 0


def test_stop_frees_the_port(dnsmasq: Dnsmasq) -> None:
    dnsmasq.stop()
    assert not dnsmasq.running
    assert not answers(("127.0.0.1", dnsmasq.port), "ready.test", timeout_s=0.3)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as again:
        again.bind(("127.0.0.1", dnsmasq.port))


def test_a_taken_port_is_replaced(tmp_path: Path, dnsmasq_binary: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        server = Dnsmasq(tmp_path / "w", binary=dnsmasq_binary)
        server.port = taken.getsockname()[1]  # the race: taken after it was picked
        with server:
            assert server.port != taken.getsockname()[1]
            assert answers(("127.0.0.1", server.port), "ready.test")
        assert "Address already in use" in server.log_path.read_text()


def test_a_given_port_that_is_taken_is_an_error(tmp_path: Path, dnsmasq_binary: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        server = Dnsmasq(tmp_path / "w", port=taken.getsockname()[1], binary=dnsmasq_binary)
        with pytest.raises(ServiceError, match="Address already in use"):
            server.start()
        assert not server.running


def test_no_dnsmasq_and_no_apt_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "_find", lambda: None)

    def refuse(packages: list[str]) -> None:
        raise harness.AptUnavailable("cannot be installed here (needs root and apt-get)")

    monkeypatch.setattr(harness, "apt_install", refuse)
    with pytest.raises(NoDnsmasq, match="apt-get install dnsmasq-base"):
        find_or_install_dnsmasq()
