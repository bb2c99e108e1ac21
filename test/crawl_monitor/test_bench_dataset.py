"""bench.dataset without its runs: the origin's two unlike hosts over real HTTP, the most
requests in a second, whose CPU a process is, what a dataset folder holds, and the
verdicts against issue 52's targets."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from aiohttp.test_utils import TestServer

from bench import dataset, peer
from bench.dataset_origin import Hosts, host_addresses, make_app, most_in_a_second
from bench.dataset_report import dataset_table, dataset_verdicts


async def _served(addresses: list[str]) -> tuple[TestServer, Hosts]:
    hosts = Hosts(addresses)
    server = TestServer(make_app([b"body-0", b"body-1"], hosts), host="127.0.0.1")
    await server.start_server()
    return server, hosts


async def test_the_limited_host_answers_429_with_retry_after_within_a_second() -> None:
    server, hosts = await _served(["127.0.0.9", "127.0.0.1"])  # index 1: the limited one
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(server.make_url("/3.jpg")) as first:
                assert (first.status, await first.read()) == (200, b"body-1")
            async with session.get(server.make_url("/4.jpg")) as second:
                assert second.status == 429
                assert second.headers["Retry-After"] == "1"
            async with session.get(server.make_url("/robots.txt")) as robots:
                assert robots.status == 404
            async with session.get(server.make_url("/_stats")) as stats:
                summary = await stats.json()
    finally:
        await server.close()
    assert summary["127.0.0.1"] == {"requests": 3, "images": 1, "429": 1, "most_in_a_second": 3}
    assert hosts.refused["127.0.0.1"] == 1


async def test_the_first_host_disallows_everything_in_its_robots_txt() -> None:
    server, _ = await _served(["127.0.0.1", "127.0.0.9"])
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(server.make_url("/robots.txt")) as robots:
                assert (robots.status, await robots.text()) == (200, "User-agent: *\nDisallow: /\n")
            async with session.post(server.make_url("/_reset")) as reset:
                assert reset.status == 200
            async with session.get(server.make_url("/_stats")) as stats:
                assert (await stats.json())["127.0.0.1"]["requests"] == 0
    finally:
        await server.close()


def test_most_in_a_second_counts_a_window_shorter_than_one_second() -> None:
    assert most_in_a_second([]) == 0
    assert most_in_a_second([0.0, 1.0, 2.0, 3.0]) == 1
    assert most_in_a_second([0.0, 0.5, 0.99, 1.2, 5.0]) == 3
    with pytest.raises(ValueError, match="1 to 250 hosts"):
        host_addresses(0)


@pytest.mark.parametrize(
    ("cmdline", "expected"),
    [
        (
            ["/c/img2dataset-1.47.0/bin/python", "/c/img2dataset-1.47.0/bin/img2dataset"],
            "img2dataset",
        ),
        (
            ["/c/img2dataset-1.47.0/bin/python", "-c", "from multiprocessing.spawn import x"],
            "img2dataset: its processes",
        ),
        (["/v/bin/python", "-m", "worker"], "worker"),
        (
            ["/v/bin/python", "-c", "from multiprocessing.forkserver import main"],
            "worker: image processes",
        ),
        (["/v/bin/tansu", "broker"], "broker (tansu)"),
        (["/v/bin/python", "/v/bin/image-crawler", "download", "list.parquet"], "download"),
        (["/v/bin/python", "/w/bench/reaper.py", "/v/bin/image-crawler", "download"], "reaper"),
        ([], "other"),
    ],
)
def test_a_process_is_counted_to_its_part_of_the_run(cmdline: list[str], expected: str) -> None:
    assert dataset.role(cmdline) == expected


# A parent that leaves a child burning CPU_S of CPU behind it when it exits.
ORPHAN_CPU_S = 0.3
ORPHANING = f"""
import os, time
if os.fork() == 0:
    while time.process_time() < {ORPHAN_CPU_S}:
        pass
    os._exit(0)
"""


def _cpu_of(command: list[str]) -> float:
    proc = subprocess.Popen(command, start_new_session=True)
    status, usage = peer.wait4(proc, time.monotonic() + 60)
    assert status is not None and proc.returncode == 0
    return float(usage.ru_utime + usage.ru_stime)


def test_under_the_reaper_wait4_counts_the_cpu_of_an_orphan() -> None:
    # Alone, the orphan is init's to reap and its CPU in no count: the case the reaper is for.
    assert _cpu_of([sys.executable, "-c", ORPHANING]) < ORPHAN_CPU_S
    assert _cpu_of([sys.executable, str(dataset.REAPER), sys.executable, "-c", ORPHANING]) >= (
        ORPHAN_CPU_S
    )


def test_a_dataset_folder_is_read_as_its_rows_images_and_samples(tmp_path: Path) -> None:
    rows = [
        {"url": "http://127.2.0.3:9/0.jpg", "status": "success", "error_message": None,
         "width": 256, "height": 256},
        {"url": "http://127.2.0.1:9/1.jpg", "status": "failed_to_download",
         "error_message": "robots.txt disallows it", "width": None, "height": None},
    ]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "00000.parquet")
    with tarfile.open(tmp_path / "00000.tar", "w") as tar:
        for name, body in (("000000000.webp", b"RIFF"), ("000000000.txt", b"caption")):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    read = dataset.read_dataset(tmp_path, [])
    assert read["rows"] == read["distinct_rows"] == 2
    assert (read["images"], read["samples_in_tars"]) == (1, 1)
    assert read["images_by_host"] == {"127.2.0.3": 1}
    assert read["sizes"] == {"256x256": 1}
    assert read["errors"] == {"robots.txt disallows it": 1}


def _tool(by_host: dict[str, int], most: int, cpu_ms: float, requests_0: int) -> dict[str, Any]:
    addresses = host_addresses(4)
    return {
        "dataset": {"images_by_host": by_host, "sizes": {"256x256": sum(by_host.values())}},
        "origin": {
            a: {"requests": requests_0 if i == 0 else 1, "most_in_a_second": most}
            for i, a in enumerate(addresses)
        },
        "cpu_per_image_ms": cpu_ms,
        "cpu_by_role_s": {"worker: image processes": 9.0, "worker": 1.0},
        "wall_s": 10.0,
    }


def test_the_verdicts_hold_when_download_keeps_every_limited_row_at_half_the_cpu() -> None:
    a = host_addresses(4)
    i2d = _tool({a[0]: 2, a[1]: 1, a[2]: 2, a[3]: 2}, most=9, cpu_ms=40.0, requests_0=2)
    ours = _tool({a[1]: 2, a[2]: 2, a[3]: 2}, most=2, cpu_ms=20.0, requests_0=1)
    figures = {"rows": 8, "hosts": 4, "img2dataset": i2d, "download": ours}
    figures["compare"] = dataset.compare(i2d, ours, rows=8, hosts=4)
    assert figures["compare"]["rows_of_the_429_host"] == 2
    assert figures["compare"]["cpu_ratio"] == 0.5
    verdicts = dataset_verdicts(figures)
    assert [v["ok"] for v in verdicts] == [True] * 5, json.dumps(verdicts)
    assert ("  where download's CPU went", "worker: image processes 90%, worker 10%") in (
        dataset_table(figures)
    )
    ours["dataset"]["images_by_host"][a[1]] = 1  # one limited row given up
    ours["cpu_per_image_ms"] = 30.0
    figures["compare"] = dataset.compare(i2d, ours, rows=8, hosts=4)
    missed = [v["target"] for v in dataset_verdicts(figures) if not v["ok"]]
    assert missed == [
        "download's images of the host that answers 429 with Retry-After",
        "download's CPU per image / img2dataset's (start-up subtracted)",
    ]
    assert dataset_verdicts(None) == []
