"""The compose check's stop and start of the workers, repeated on the local stack.

    python -m bench.stopstart --reps 50 [--seed N] [--keep-logs DIR] [--durable] ...

Each repetition builds a fresh stack on free loopback ports (tansu, in memory or, with
``--durable``, on a private SeaweedFS as the compose check's Kafka stand-in keeps it;
redis-server; an origin serving the compose check's plan, ``deploy/compose_check/plan.py``:
three sources at 2 requests/s, 200 URLs each), runs one monitor and three workers with
the compose file's settings, feeds the plan to ``inbound_images`` with ``image-crawler
produce``, and once a third of the URLs have ended sends SIGTERM to the three workers at
once: each must exit 0 within the compose file's ``stop_grace_period`` (45 s). Three new
workers start, and every uuid must end, as planned, within ``--deadline-s``.

One line per repetition (ok, or LOST n, with its times); on a loss the repetition's
folder is kept (every process's log, the origin's requests per path, the outputs read)
with ``diagnosis.txt`` (bench/stopstart_diagnose.py), which is printed too. A summary at
the end: repetitions, losses, duplicates, time per repetition.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid as uuid_module
from collections import Counter
from pathlib import Path

from bench.stopstart_diagnose import CheckedOutputs, diagnose, log_events
from crawlctl.localstack.objects import ObjectStore
from crawlctl.localstack.services import free_port
from crawlctl.signals import raise_interrupt, signals_to
from deploy.compose_check import plan as planning
from image_crawler import contract as c
from test.harness import processes as crawler_processes
from test.harness.origin import Origin
from test.harness.processes import CrawlerProcess
from test.harness.services import KafkaBroker, RedisServer

WORKERS = 3
# docker-compose.yml's stop_grace_period of the worker.
STOP_GRACE_S = 45.0
POLL_S = 0.5
MAX_DIAGNOSED = 3


@dataclasses.dataclass(frozen=True, slots=True)
class Options:
    reps: int = 50
    seed: int = 1
    keep_logs: Path | None = None
    keep_all: bool = False
    durable: bool = False
    per_source: int = 200
    deadline_s: float = 300.0
    restart_delay_s: float = 0.0
    log_level: str = "DEBUG"
    # The worker's SHUTDOWN_GRACE_S; None: its default (30 s), as the compose file has it.
    shutdown_grace_s: float | None = None
    # Another source tree to run the worker and the monitor from (an older commit, from
    # ``git archive COMMIT | tar -x -C DIR``); None: this one.
    code: Path | None = None


@dataclasses.dataclass(slots=True)
class Rep:
    """One repetition's outcome and figures."""

    number: int
    seed: int
    lost: list[str] = dataclasses.field(default_factory=list)
    wrong: int = 0
    duplicates: int = 0
    exit_codes: list[int | None] = dataclasses.field(default_factory=list)
    stop_s: float = 0.0
    ended_at_stop: int = 0
    handed_back: int = 0
    commit_failed: int = 0
    # Skips in the output topics' offsets seen by the live reader (topic, partition,
    # offset expected, offset read, when).
    reader_gaps: list[tuple[str, int, int, int, float]] = dataclasses.field(default_factory=list)
    times: dict[str, float] = dataclasses.field(default_factory=dict)
    error: str | None = None
    # The crawler's commit the repetition ran (others commit to this tree meanwhile).
    commit: str = ""

    @property
    def stopped_cleanly(self) -> bool:
        return len(self.exit_codes) == WORKERS and not any(self.exit_codes)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.wrong or self.error) and self.stopped_cleanly

    def line(self, reps: int) -> str:
        verdict = "ok" if self.ok else f"LOST {len(self.lost)}" if self.lost else "FAIL"
        times = " ".join(f"{k} {v:.1f}s" for k, v in self.times.items())
        codes = ",".join("-" if x is None else str(x) for x in self.exit_codes)
        text = (
            f"rep {self.number}/{reps} seed {self.seed} {verdict:7} {times}; "
            f"stop {self.stop_s:.1f}s codes [{codes}] ended@stop {self.ended_at_stop} "
            f"handed_back {self.handed_back} commit_failed {self.commit_failed} "
            f"dups {self.duplicates} wrong {self.wrong} reader_gaps {len(self.reader_gaps)} "
            f"commit {self.commit}"
        )
        return text + (f" error {self.error}" if self.error else "")


def head_commit() -> str:
    """HEAD of the tree the crawler runs from (``git rev-parse``: reads, never writes)."""
    done = subprocess.run(
        ["git", "-C", str(crawler_processes.ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or "?"


def seeded_plan(seed: int, per_source: int) -> planning.Plan:
    """The compose check's plan with uuids drawn from ``seed`` (they key the records, so
    they choose the partitions)."""
    rng = random.Random(seed)
    items = tuple(
        dataclasses.replace(item, uuid=str(uuid_module.UUID(int=rng.getrandbits(128), version=4)))
        for item in planning.make_plan(per_source).items
    )
    return planning.Plan(items)


class Services:
    """redis-server, tansu (on SeaweedFS when durable) and the origin, in ``folder``."""

    def __init__(self, folder: Path, durable: bool) -> None:
        self._exit = contextlib.ExitStack()
        self.redis = RedisServer(log_dir=folder).start()
        self._exit.callback(self.redis.stop)
        storage: dict[str, object] = {}
        if durable:
            objects = ObjectStore(data_dir=folder / "objects", log_dir=folder).start()
            self._exit.callback(objects.stop)
            storage = {"storage": objects.storage_url, "storage_env": objects.client_env}
        self.kafka = KafkaBroker(log_dir=folder, **storage).start()  # type: ignore[arg-type]
        self._exit.callback(self.kafka.stop)
        self.origin = Origin().start()
        self._exit.callback(self.origin.stop)

    def close(self) -> None:
        self._exit.close()


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as answer:
            return bool(answer.status == 200)
    except (OSError, urllib.error.HTTPError):
        return False


async def wait_healthy(processes: list[tuple[CrawlerProcess, int]], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(healthy(port) for _, port in processes):
        for process, _ in processes:
            if process.process.poll() is not None:
                raise RuntimeError(f"{process.module} exited:\n{process.tail()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"processes not healthy in {timeout_s:g} s")
        await asyncio.sleep(POLL_S)


class Run:
    """One repetition on its services: the monitor, the workers, the checks."""

    def __init__(
        self, options: Options, services: Services, plan: planning.Plan, folder: Path, rep: Rep
    ) -> None:
        self.options = options
        self.services = services
        self.plan = plan
        self.folder = folder
        self.rep = rep
        self.uuids = {item.uuid for item in plan.items}
        self.processes: list[CrawlerProcess] = []
        self.old: list[CrawlerProcess] = []
        self.new: list[CrawlerProcess] = []
        self.outputs: CheckedOutputs | None = None

    def _base_env(self) -> dict[str, str]:
        return {
            "KAFKA_HOSTS": self.services.kafka.bootstrap,
            "REDIS_URL": self.services.redis.url,
            "METRICS_HOST": "127.0.0.1",
            "LOG_LEVEL": self.options.log_level,
        }

    def _spawn(self, module: str, name: str, env: dict[str, str]) -> tuple[CrawlerProcess, int]:
        port = free_port()
        env = {**self._base_env(), **env, "METRICS_PORT": str(port)}
        process = CrawlerProcess(module, env, self.folder / f"{name}.log")
        self.processes.append(process)
        return process, port

    def _worker_env(self) -> dict[str, str]:
        """The compose file's worker, with the compose check's override; thumbnails go
        to files (S3 is not what is looked at here)."""
        env = {
            "USER_AGENT": "image-crawler-stopstart (+bench/stopstart.py; loopback only)",
            "ALLOWED_PRIVATE_NETWORKS": "127.0.0.0/8",
            "IMAGE_PROCESSES": "1",
            "THUMBNAIL_STORE": "local",
            "THUMBNAIL_DIR": str(self.folder / "thumbnails"),
        }
        if self.options.shutdown_grace_s is not None:
            env["SHUTDOWN_GRACE_S"] = str(self.options.shutdown_grace_s)
        return env

    async def start_workers(self, prefix: str) -> list[CrawlerProcess]:
        started = [
            self._spawn("worker", f"{prefix}{i}", self._worker_env()) for i in range(WORKERS)
        ]
        await wait_healthy(started, 90)
        return [process for process, _ in started]

    async def start(self, sources_url: str) -> None:
        monitor = self._spawn("crawl_monitor", "monitor", {"SOURCES_URL": sources_url})
        await wait_healthy([monitor], 60)
        self.old = await self.start_workers("old")

    def feed(self) -> None:
        """``image-crawler produce urls.jsonl``, as the compose check feeds the plan."""
        command = [str(Path(sys.executable).parent / "image-crawler"), "produce"]
        done = subprocess.run(
            [*command, str(self.folder / "urls.jsonl")],
            env={"PATH": "/usr/bin:/bin", "KAFKA_HOSTS": self.services.kafka.bootstrap},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        (self.folder / "produce.log").write_text(done.stdout + done.stderr)
        if done.returncode != 0:
            raise RuntimeError(f"image-crawler produce exited {done.returncode}: {done.stderr}")

    def ended(self) -> set[str]:
        assert self.outputs is not None
        return self.outputs.uuids() & self.uuids

    async def wait_ended(self, count: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while len(self.ended()) < count:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(POLL_S)
        return True

    async def stop_workers(self) -> None:
        """SIGTERM to every worker at once; each must exit 0 within STOP_GRACE_S."""
        started = time.monotonic()
        for worker in self.old:
            worker.signal(signal.SIGTERM)
        codes: dict[int, int] = {}
        while len(codes) < len(self.old) and time.monotonic() - started < STOP_GRACE_S:
            for i, worker in enumerate(self.old):
                if i not in codes and (code := worker.process.poll()) is not None:
                    codes[i] = code
            await asyncio.sleep(0.1)
        self.rep.stop_s = time.monotonic() - started
        for worker in self.old:
            worker.stop()  # kills one still running: the compose engine's SIGKILL
        self.rep.exit_codes = [codes.get(i) for i in range(len(self.old))]

    async def crawl(self, sources_url: str) -> None:
        """The compose check's steps, each timed into ``rep.times``."""
        times, total = self.rep.times, len(self.plan.items)
        mark = time.monotonic()

        def lap(name: str) -> None:
            nonlocal mark
            now = time.monotonic()
            times[name] = now - mark
            mark = now

        await self.start(sources_url)
        lap("up")
        self.feed()
        lap("feed")
        if not await self.wait_ended(total // 3, self.options.deadline_s):
            raise RuntimeError(f"a third had not ended in {self.options.deadline_s:g} s")
        lap("third")
        await self.stop_workers()
        self.rep.ended_at_stop = len(self.ended())
        lap("stop")
        await asyncio.sleep(self.options.restart_delay_s)
        self.new = await self.start_workers("new")
        lap("start")
        await self.wait_ended(total, self.options.deadline_s)
        lap("rest")
        # An end published twice may trail the last first one.
        await asyncio.sleep(2.0)

    def evaluate(self) -> None:
        assert self.outputs is not None
        ends: dict[str, set[str]] = {}
        for output in self.outputs.records:
            if output.topic == c.METADATA_TOPIC:
                end = planning.OK
            elif output.topic == c.LINK_ROT_TOPIC:
                end = "404"
            elif output.topic == c.CRAWL_ERRORS_TOPIC:
                end = str(output.message.get("status"))
            else:
                continue
            ends.setdefault(output.uuid, set()).add(end)
        expected = planning.expected_ends(self.plan)
        self.rep.lost = [u for u in expected if u not in ends]
        self.rep.wrong = sum(1 for u, e in expected.items() if u in ends and e not in ends[u])
        counts = Counter(
            (o.topic, o.uuid) for o in self.outputs.records if o.topic != c.LINK_CHECKS_TOPIC
        )
        self.rep.duplicates = sum(1 for n in counts.values() if n > 1)
        self.rep.reader_gaps = list(self.outputs.gaps)
        old_events = [e for w in self.old for e in log_events(w.log_path)]
        self.rep.handed_back = sum(
            int(e.get("tasks", 0)) for e in old_events if e.get("event") == "handing_back"
        )
        self.rep.commit_failed = sum(
            1
            for w in self.processes
            for e in log_events(w.log_path)
            if e.get("event") == "commit_failed"
        )

    def save(self) -> None:
        """The origin's requests per path and the outputs read, beside the logs."""
        offset = time.time() - time.monotonic()
        asked: dict[str, list[float]] = {}
        for at, path in self.services.origin.request_log:
            asked.setdefault(path, []).append(round(at + offset, 3))
        (self.folder / "requests.json").write_text(json.dumps(asked, indent=1))
        if self.outputs is not None:
            lines = [json.dumps(dataclasses.asdict(o)) for o in self.outputs.records]
            (self.folder / "outputs.jsonl").write_text("\n".join(lines) + "\n")

    async def diagnose(self) -> str:
        by_uuid = {item.uuid: item for item in self.plan.items}
        lost = [(u, by_uuid[u].source, by_uuid[u].path) for u in self.rep.lost]
        logs = [p.log_path for p in self.processes]
        # A stalled crawl loses hundreds: the first few tell as much, in seconds.
        text = f"{len(lost)} lost, the first {min(len(lost), MAX_DIAGNOSED)} diagnosed\n"
        text += await diagnose(
            self.services.kafka.bootstrap,
            lost[:MAX_DIAGNOSED],
            self.services.origin.request_log,
            logs,
        )
        gaps = self.rep.reader_gaps
        text += f"\nlive reader skips (topic, partition, expected, read, when): {gaps}"
        (self.folder / "diagnosis.txt").write_text(text + "\n")
        return text

    def stop_all(self) -> None:
        for process in reversed(self.processes):
            if process.process.poll() is None:
                process.signal(signal.SIGTERM)
        for process in reversed(self.processes):
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.process.wait(10)
            process.stop()


async def run_rep(options: Options, number: int, seed: int, folder: Path) -> Rep:
    """One repetition in ``folder``; a loss is diagnosed before the stack goes."""
    rep = Rep(number, seed, commit=head_commit())
    started = time.monotonic()
    plan = seeded_plan(seed, options.per_source)
    services = Services(folder, options.durable)
    try:
        sources_url = planning.serve(plan, services.origin)
        plan.write(folder, services.origin)
        run = Run(options, services, plan, folder, rep)
        try:
            async with CheckedOutputs(services.kafka.bootstrap) as outputs:
                run.outputs = outputs
                try:
                    await run.crawl(sources_url)
                except (RuntimeError, TimeoutError) as e:
                    rep.error = str(e).splitlines()[0][:200]
                run.evaluate()
                run.save()
                if rep.lost:
                    print(await run.diagnose(), flush=True)
        finally:
            run.stop_all()
    finally:
        services.close()
    rep.times["total"] = time.monotonic() - started
    return rep


def summary(reps: list[Rep]) -> str:
    lost = [r for r in reps if r.lost]
    totals = [r.times.get("total", 0.0) for r in reps]
    bad_stops = [r.number for r in reps if not r.stopped_cleanly]
    lines = [
        f"reps {len(reps)}, ok {sum(r.ok for r in reps)}, "
        f"with losses {len(lost)} ({sum(len(r.lost) for r in lost)} URLs: "
        f"reps {[r.number for r in lost]}), wrong ends {sum(r.wrong for r in reps)}, "
        f"errors {[r.number for r in reps if r.error]}, unclean stops {bad_stops}",
        f"duplicates (ends published more than once) {sum(r.duplicates for r in reps)}, "
        f"per rep {[r.duplicates for r in reps]}",
    ]
    if totals:
        lines.append(
            f"time per rep: mean {statistics.mean(totals):.1f} s, min {min(totals):.1f} s, "
            f"max {max(totals):.1f} s; stop: max {max(r.stop_s for r in reps):.1f} s; "
            f"handed back per rep: mean {statistics.mean(r.handed_back for r in reps):.0f}"
        )
    return "\n".join(lines)


async def run_all(options: Options) -> list[Rep]:
    base = options.keep_logs or Path(tempfile.mkdtemp(prefix="stopstart-"))
    base.mkdir(parents=True, exist_ok=True)
    print(f"stopstart: logs under {base} ({options})", flush=True)
    reps: list[Rep] = []
    for number in range(1, options.reps + 1):
        seed = options.seed + number - 1
        folder = base / f"rep-{number:03d}-seed-{seed}"
        folder.mkdir(parents=True, exist_ok=True)
        rep = await run_rep(options, number, seed, folder)
        reps.append(rep)
        print(rep.line(options.reps), flush=True)
        with (base / "results.jsonl").open("a") as results:
            results.write(json.dumps(dataclasses.asdict(rep)) + "\n")
        if rep.ok and not options.keep_all:
            shutil.rmtree(folder, ignore_errors=True)
    return reps


def parse_options(argv: list[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(prog="python -m bench.stopstart", description=__doc__)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1, help="the first repetition's seed")
    parser.add_argument("--keep-logs", type=Path, help="folder for every repetition's logs")
    parser.add_argument("--keep-all", action="store_true", help="keep good repetitions' logs")
    parser.add_argument("--durable", action="store_true", help="tansu on SeaweedFS")
    parser.add_argument("--per-source", type=int, default=200)
    parser.add_argument("--deadline-s", type=float, default=300.0)
    parser.add_argument("--restart-delay-s", type=float, default=0.0)
    parser.add_argument("--log-level", default="DEBUG")
    parser.add_argument("--shutdown-grace-s", type=float)
    parser.add_argument("--code", type=Path, help="run worker and monitor from this tree")
    args = parser.parse_args(argv)
    return Options(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Options)})


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    if options.code is not None:
        # ``python -m worker`` imports from its working folder first.
        crawler_processes.ROOT = options.code.resolve()
    # SIGTERM too stops the stack in order (a background run ignores SIGINT).
    with signals_to(raise_interrupt):
        reps = asyncio.run(run_all(options))
    print(summary(reps), flush=True)
    return 0 if all(r.ok for r in reps) else 1


if __name__ == "__main__":
    sys.exit(main())
