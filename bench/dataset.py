"""``python -m bench.dataset``: ``image-crawler download`` beside img2dataset 1.47.

One list, the same options for both, one run of each, on an origin of loopback hosts
(``bench.dataset_origin``: HOSTS addresses, the first disallowing everything in its
robots.txt, the second answering 429 with Retry-After beyond one image a second, the
corpus's "mixed" photographs). The list is a Parquet file of ROWS rows (url, caption,
similarity), row ``i`` on host ``i % HOSTS``; both make WebDataset shards of 256 px
centre crops in WebP with the caption and the similarity kept.

Measured, for each tool: the rows it made an image of, on the hosts both may crawl and
on the limited one; the sizes of its images; its CPU per image, as ``bench.peer`` counts
it (``os.wait4`` of ``bench/reaper.py``, a subreaper the command runs under: every
descendant's, orphans of a SIGKILLed parent too; its fixed start-up taken
out with a 1-row run: (CPU of the whole run - CPU of the 1-row run) / (images of one -
images of the other)), and for ours where it went, by process; its wall time; and the
most requests it sent one host in any one second. img2dataset runs as its users run it
(one process, 16 threads, no retries); ours with its defaults, the politeness included
(``--max-host-rate 1``), and with ``--unbound``, once more at 1000 requests a second a
host: its wall time where politeness does not bind.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from bench import peer
from bench.corpus import DEFAULT_DIR, ensure_corpus
from bench.dataset_origin import DISALLOWED, LIMITED, host_addresses
from bench.dataset_report import dataset_table, dataset_verdicts
from bench.services import _BenchModule

# The command runs under it, so that wait4 counts the orphans' CPU too.
REAPER: Final = Path(__file__).with_name("reaper.py")
ROWS: Final = 2000
HOSTS: Final = 40
PER_SHARD: Final = 500
IMAGE_OPTIONS: Final = (
    "--image_size",
    "256",
    "--resize_mode",
    "center_crop",
    "--encode_format",
    "webp",
)


class DatasetOrigin(_BenchModule):
    name = "dataset-origin"
    module = "bench.dataset_origin"
    probe_path = "/_stats"
    start_timeout_s = 60.0

    def __init__(self, corpus_dir: Path, log_dir: Path, hosts: int) -> None:
        super().__init__(log_dir=log_dir)
        self.corpus_dir = corpus_dir
        self.hosts = hosts

    def _args(self) -> list[str]:
        return [str(self.corpus_dir), "--hosts", str(self.hosts)]

    def call(self, path: str, method: str = "GET") -> Any:
        request = urllib.request.Request(f"{self.url}{path}", method=method)
        with urllib.request.urlopen(request, timeout=10.0) as response:
            return json.loads(response.read())


def write_list(path: Path, port: int, rows: int, hosts: int) -> list[str]:
    """The list; returns each row's host address."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    addresses = host_addresses(hosts)
    of_row = [addresses[i % hosts] for i in range(rows)]
    table = pa.table(
        {
            "url": [f"http://{a}:{port}/{i}.jpg" for i, a in enumerate(of_row)],
            "caption": [f"photograph {i}, «mixed»" for i in range(rows)],
            "similarity": [round((i % 97) / 97, 4) for i in range(rows)],
        }
    )
    pq.write_table(table, path)
    return of_row


def common_args(out: Path) -> list[str]:
    """What both tools are asked (but the list), in img2dataset's spelling, which
    ``download`` takes too."""
    return [
        "--input_format", "parquet",
        "--url_col", "url",
        "--caption_col", "caption",
        "--save_additional_columns", '["similarity"]',
        "--output_format", "webdataset",
        "--output_folder", str(out),
        "--number_sample_per_shard", str(PER_SHARD),
        *IMAGE_OPTIONS,
    ]  # fmt: skip


def img2dataset_command(exe: Path, url_list: Path, out: Path) -> list[str]:
    return [
        str(exe),
        "--url_list", str(url_list), *common_args(out),
        "--processes_count", "1",
        "--thread_count", str(peer.THREADS),
        "--retries", "0",
        "--timeout", "30",
        "--enable_wandb", "False",
        "--incremental_mode", "incremental",
    ]  # fmt: skip


def download_command(url_list: Path, out: Path, extra: Sequence[str] = ()) -> list[str]:
    script = Path(sys.executable).with_name("image-crawler")
    return [str(script), "download", str(url_list), *common_args(out), *extra]


def download_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    for name in ("KAFKA_HOSTS", "REDIS_URL", "REDIS_HOST", "REDIS_PORT", "SOURCES_FILE"):
        env.pop(name, None)
    return env


def role(cmdline: Sequence[str]) -> str:
    """Which part of a run a process was, from its command line."""
    text = " ".join(cmdline)
    if cmdline[1:2] and cmdline[1].endswith(REAPER.name):
        return "reaper"
    if "img2dataset" in text:  # its venv's python, for every process it starts
        return "img2dataset: its processes" if "multiprocessing" in text else "img2dataset"
    for part, name in (
        ("tansu", "broker (tansu)"),
        ("weed", "broker storage (SeaweedFS)"),
        ("redis-server", "redis-server"),
        ("-m crawl_monitor", "monitor"),
        ("-m worker", "worker"),
        ("-m dedup", "dedup stage"),
        ("forkserver", "worker: image processes"),
        ("multiprocessing", "worker: image processes"),
        ("image-crawler download", "download"),
    ):
        if part in text:
            return name
    return "other"


def run_measured(
    command: list[str], run_dir: Path, env: dict[str, str], timeout_s: float
) -> dict[str, Any]:
    """Run ``command`` in ``run_dir``: its CPU (wait4 of the reaper it runs under, so
    every descendant's, orphans too; and any still alive), by role as sampled, and its
    wall time. Raises ``peer.PeerError`` if it fails."""
    run_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with (run_dir / "run.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(REAPER), *command], cwd=run_dir, env=env,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        sampler = peer.TreeSampler(proc.pid)
        status, usage = peer.wait4(proc, started + timeout_s)
    wall = time.monotonic() - started
    sampler.stop()
    if status is None or proc.returncode != 0:
        raise peer.PeerError(f"{command[:2]} ended {proc.returncode}; see {run_dir}/run.log")
    by_role: collections.defaultdict[str, float] = collections.defaultdict(float)
    for pid, cpu in sampler.cpu.items():
        by_role[role(sampler.cmdlines.get(pid, []))] += cpu
    return {
        "cpu_s": round(usage.ru_utime + usage.ru_stime + sampler.survivors_cpu(), 3),
        "wall_s": round(wall, 2),
        "cpu_by_role_s": {
            k: round(v, 2) for k, v in sorted(by_role.items(), key=lambda kv: -kv[1])
        },
    }


def read_dataset(out: Path, host_of_row: Sequence[str]) -> dict[str, Any]:
    """What a dataset holds: images by host, their sizes, statuses, and the samples in
    its tars (every image once?)."""
    import tarfile

    import pyarrow.parquet as pq

    rows = pq.read_table(sorted(out.glob("*.parquet"))).to_pylist()
    by_url = {f"{r['url']}": r for r in rows}
    images_by_host: collections.Counter[str] = collections.Counter()
    sizes: collections.Counter[str] = collections.Counter()
    for r in rows:
        if r["status"] == "success":
            host = r["url"].split("/")[2].split(":")[0]
            images_by_host[host] += 1
            sizes[f"{r['width']}x{r['height']}"] += 1
    samples = 0
    for tar_path in sorted(out.glob("*.tar")):
        with tarfile.open(tar_path) as tar:
            samples += sum(1 for m in tar.getmembers() if m.name.endswith(".webp"))
    return {
        "rows": len(rows),
        "distinct_rows": len(by_url),
        "images": sum(images_by_host.values()),
        "samples_in_tars": samples,
        "images_by_host": dict(images_by_host),
        "sizes": dict(sizes),
        "statuses": dict(collections.Counter(r["status"] for r in rows)),
        "errors": dict(
            collections.Counter(r["error_message"] for r in rows if r["error_message"]).most_common(
                8
            )
        ),
    }


def one_tool(
    name: str, command_of: Any, env: dict[str, str], origin: DatasetOrigin, work: Path,
    lists: tuple[Path, Path], host_of_row: Sequence[str], timeout_s: float,
) -> dict[str, Any]:  # fmt: skip
    """A 1-row run (its start-up), then the whole list; the origin's view of the whole."""
    small_list, full_list = lists
    small = run_measured(
        command_of(small_list, work / f"{name}-1" / "out"), work / f"{name}-1", env, timeout_s
    )
    small["dataset"] = read_dataset(work / f"{name}-1" / "out", host_of_row[:1])
    origin.call("/_reset", "POST")
    full = run_measured(command_of(full_list, work / name / "out"), work / name, env, timeout_s)
    full["origin"] = origin.call("/_stats")
    full["dataset"] = read_dataset(work / name / "out", host_of_row)
    images = full["dataset"]["images"] - small["dataset"]["images"]
    full["cpu_per_image_ms"] = (
        round(1000 * (full["cpu_s"] - small["cpu_s"]) / images, 2) if images else None
    )
    full["startup"] = small
    return full


def compare(i2d: dict[str, Any], ours: dict[str, Any], rows: int, hosts: int) -> dict[str, Any]:
    addresses = host_addresses(hosts)
    both = [a for i, a in enumerate(addresses) if i not in (DISALLOWED, LIMITED)]

    def on(result: dict[str, Any], hosts_: Sequence[str]) -> int:
        return sum(result["dataset"]["images_by_host"].get(a, 0) for a in hosts_)

    most = {
        tool: max(h["most_in_a_second"] for h in result["origin"].values())
        for tool, result in (("img2dataset", i2d), ("download", ours))
    }
    return {
        "rows_of_the_429_host": sum(1 for i in range(rows) if i % hosts == LIMITED),
        "images_on_hosts_both_may_crawl": {
            "img2dataset": on(i2d, both),
            "download": on(ours, both),
        },
        "images_of_the_429_host": {
            "img2dataset": on(i2d, [addresses[LIMITED]]),
            "download": on(ours, [addresses[LIMITED]]),
        },
        "requests_to_the_disallowed_host": {
            "img2dataset": i2d["origin"][addresses[DISALLOWED]]["requests"],
            "download": ours["origin"][addresses[DISALLOWED]]["requests"],
        },
        "most_requests_to_one_host_in_a_second": most,
        "cpu_per_image_ms": {
            "img2dataset": i2d["cpu_per_image_ms"],
            "download": ours["cpu_per_image_ms"],
        },
        "cpu_ratio": (
            round(ours["cpu_per_image_ms"] / i2d["cpu_per_image_ms"], 3)
            if ours["cpu_per_image_ms"] and i2d["cpu_per_image_ms"]
            else None
        ),
        "wall_s": {"img2dataset": i2d["wall_s"], "download": ours["wall_s"]},
        "sizes": {"img2dataset": i2d["dataset"]["sizes"], "download": ours["dataset"]["sizes"]},
    }


def measure_dataset(
    corpus_dir: Path, *, corpus_files: int, peer_cache: Path, work_dir: Path, rows: int = ROWS,
    hosts: int = HOSTS, unbound: bool = False, timeout_s: float = 1800.0,
) -> dict[str, Any]:  # fmt: skip
    """img2dataset, then ``download`` (and with ``unbound`` ``download`` unbound), each a
    1-row run and a ``rows``-row run, on one origin; their figures and the comparison."""
    corpus = ensure_corpus(corpus_dir, corpus_files)
    installed = peer.ensure_img2dataset(peer_cache)
    exe = peer.executable(peer_cache)
    if work_dir.exists():
        shutil.rmtree(work_dir)
    work_dir.mkdir(parents=True)
    origin = DatasetOrigin(corpus.directory, work_dir / "logs", hosts)
    origin.start()
    try:
        host_of_row = write_list(work_dir / "list.parquet", origin.port, rows, hosts)
        write_list(work_dir / "one.parquet", origin.port, 1, hosts)
        lists = (work_dir / "one.parquet", work_dir / "list.parquet")
        print(f"dataset: img2dataset, 1 then {rows} rows", file=sys.stderr)
        i2d = one_tool(
            "img2dataset", lambda lst, out: img2dataset_command(exe, lst, out),
            peer.img2dataset_env(), origin, work_dir, lists, host_of_row, timeout_s,
        )  # fmt: skip
        print(f"dataset: download, 1 then {rows} rows", file=sys.stderr)
        ours = one_tool(
            "download", download_command, download_env(), origin, work_dir, lists,
            host_of_row, timeout_s,
        )  # fmt: skip
        result: dict[str, Any] = {
            "rows": rows, "hosts": hosts, "img2dataset_venv": installed,
            "img2dataset": i2d, "download": ours, "compare": compare(i2d, ours, rows, hosts),
        }  # fmt: skip
        if unbound:
            print(
                f"dataset: download at 1000 requests/s a host, 1 then {rows} rows", file=sys.stderr
            )
            result["download_unbound"] = one_tool(
                "download-unbound",
                lambda lst, out: download_command(lst, out, ["--max-host-rate", "1000"]),
                download_env(), origin, work_dir, lists, host_of_row, timeout_s,
            )  # fmt: skip
    finally:
        origin.stop()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dataset", description=__doc__)
    parser.add_argument("--rows", type=int, default=ROWS)
    parser.add_argument("--hosts", type=int, default=HOSTS)
    parser.add_argument("--corpus-dir", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--corpus-files", type=int, default=300)
    parser.add_argument("--peer-cache", type=Path, default=peer.DEFAULT_CACHE)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/bench-dataset"))
    parser.add_argument("--unbound", action="store_true", help="also run ours at 1000 req/s a host")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--out", type=Path, default=Path("bench/results/dataset.json"))
    args = parser.parse_args(argv)
    result = measure_dataset(
        args.corpus_dir, corpus_files=args.corpus_files, peer_cache=args.peer_cache,
        work_dir=args.work_dir, rows=args.rows, hosts=args.hosts, unbound=args.unbound,
        timeout_s=args.timeout,
    )  # fmt: skip
    result["verdicts"] = dataset_verdicts(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for figure, value in dataset_table(result):
        print(f"{figure:<70} {value}")
    for verdict in result["verdicts"]:
        mark = "ok  " if verdict["ok"] else "MISS"
        print(f"{mark} {verdict['target']}: {verdict['shown']} ({verdict['limit']})")
    return 0 if all(v["ok"] for v in result["verdicts"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
