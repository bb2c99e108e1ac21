"""``python -m deploy.compose_check`` (``make compose-check``): run the production stack.

The steps, each timed, each a failure that stops the check with the reason:

1. Debian's docker.io, docker-compose and debootstrap (apt-get, when missing); the
   stack's ports free on 127.0.0.1; the check's own dockerd (``engine.py``).
2. The images: ``python:3.11-slim`` (debootstrapped, once), the worker and the monitor
   from the repository's Dockerfiles, the stand-ins from ``standins/``.
3. ``.env`` from ``.env.example`` with new random keys, the sources list from the check's
   origin; ``up`` with three workers: every health-checked service healthy, createbucket
   exited 0, every socket of the stack on loopback.
4. The plan's URLs fed to ``inbound_images`` with ``image-crawler produce``, in a one-off
   container; once a third of them have ended, ``stop worker``: each worker exits 0
   within its grace period; ``start worker``; every uuid ends in
   ``image_metadata_updates``, ``link_rot`` or ``crawl_errors``, as the plan expects; the
   deduplication stage placed every image in ``image_duplicates``, each sample's copies
   (the same bytes under other URLs and sources) in one cluster.
5. Every thumbnail read back with the crawler's keys; those keys refused the rest.
   Prometheus scrapes the monitor and the three workers (``up`` is 1 for each).
6. A source halted with redis-cli; ``down`` and ``up``: it is still halted, the output
   topics still hold every uuid's end, and the deduplication stage read its journal back
   from its volume.
7. A summary line; ``down -v``, every container removed, the engine stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import functools
import json
import os
import secrets
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import yaml

from crawlctl.signals import raise_interrupt, signals_to
from deploy.compose_check import plan as planning
from deploy.compose_check import probes
from deploy.compose_check.engine import CheckError, Engine, install_packages
from deploy.compose_check.stack import OVERRIDE_FILE, ROOT, Stack, resolve
from image_crawler.ports import parse_ports
from test.harness.origin import Origin

STANDINS = Path(__file__).resolve().parent / "standins"
# The images docker-compose.yml names, and where the check builds each from.
IMAGES = {
    "image-crawler-worker:latest": (ROOT, ROOT / "Dockerfile-worker"),
    "image-crawler-monitor:latest": (ROOT, ROOT / "Dockerfile-monitor"),
    "apache/kafka:3.9.1": (STANDINS / "kafka", None),
    "redis:7-alpine": (STANDINS / "redis", None),
    "chrislusf/seaweedfs:4.48": (STANDINS / "seaweedfs", None),
    "prom/prometheus:v3.5.0": (STANDINS / "prometheus", None),
}
WORKERS = 3
HALTED_SOURCE = planning.SOURCES[-1]
OTHER_BUCKET = "compose-check-other"
# Inside the one-off containers: the check's folder (outcomes.py) and the run's files.
TOOLS_MOUNT = "/compose-check"
RUN_MOUNT = "/compose-check-run"
CRAWL_TIMEOUT_S = 600.0

T = TypeVar("T")


class Timings:
    """How long each step took, for the summary."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.started = time.monotonic()

    def step(self, name: str, action: Callable[[], T]) -> T:
        say(f"{name} ...")
        started = time.monotonic()
        result = action()
        self.seconds[name] = time.monotonic() - started
        say(f"{name}: {self.seconds[name]:.1f} s")
        return result

    @property
    def total_s(self) -> float:
        return time.monotonic() - self.started


def say(message: str) -> None:
    print(f"compose-check: {message}", flush=True)


def write_env(run_dir: Path, sources_url: str) -> tuple[Path, dict[str, str]]:
    """``.env.example`` with every placeholder key replaced by a new random one, the
    origin's sources list and a User-Agent naming the check; the keys."""
    keys = {
        "S3_ADMIN_ACCESS_KEY": "admin" + secrets.token_hex(8),
        "S3_ADMIN_SECRET_KEY": secrets.token_hex(20),
        "S3_CRAWLER_ACCESS_KEY": "crawler" + secrets.token_hex(8),
        "S3_CRAWLER_SECRET_KEY": secrets.token_hex(20),
    }
    lines = []
    for line in (ROOT / ".env.example").read_text().splitlines():
        name = line.split("=", 1)[0]
        lines.append(f"{name}={keys[name]}" if name in keys else line)
    lines += [
        f"SOURCES_URL={sources_url}",
        "USER_AGENT=image-crawler-compose-check (+make compose-check; loopback only)",
    ]
    env_file = run_dir / ".env"
    env_file.touch(mode=0o600)
    env_file.write_text("\n".join(lines) + "\n")
    return env_file, keys


def write_prometheus_config(run_dir: Path) -> Path:
    """deploy/prometheus/prometheus.yml with the worker job's DNS discovery replaced by
    the range of ports the override gives the workers (host networking has no Docker DNS)."""
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    worker = yaml.safe_load(OVERRIDE_FILE.read_text())["services"]["worker"]
    taken = parse_ports("METRICS_PORT", worker["environment"]["METRICS_PORT"])
    ports = range(taken.first, taken.last + 1)
    for job in config["scrape_configs"]:
        if job.get("dns_sd_configs"):
            (discovery,) = job.pop("dns_sd_configs")
            (name,) = discovery["names"]
            job["static_configs"] = [{"targets": [f"{name}:{port}" for port in ports]}]
    path = run_dir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o644)
    return path


class Check:
    """One run of the check against a started engine."""

    def __init__(self, engine: Engine, run_dir: Path, per_source: int) -> None:
        self.engine = engine
        self.run_dir = run_dir
        self.plan = planning.make_plan(per_source)
        self.timings = Timings()
        self.figures: dict[str, Any] = {}
        self.origin: Origin | None = None

    def build_images(self) -> None:
        self.timings.step("base image", self.engine.ensure_base_image)
        for tag, (context, dockerfile) in IMAGES.items():
            self.timings.step(
                f"build {tag}", functools.partial(self.engine.build, context, tag, dockerfile)
            )
        # The images a rebuild replaced, so that the cache does not grow run after run.
        self.engine.docker("image", "prune", "--force", capture=True)

    def run(self, origin: Origin) -> None:
        self.origin = origin
        sources_url = planning.serve(self.plan, origin)
        self.plan.write(self.run_dir, origin)
        env_file, self.keys = write_env(self.run_dir, sources_url)
        project = resolve(
            env_file,
            write_prometheus_config(self.run_dir),
            self.run_dir / "compose.yml",
            self.engine,
        )
        self.stack = Stack(self.engine, project)
        try:
            self._crawl()
        except CheckError:
            # What every container said, for the failure's cause: the containers go below.
            logs = self.run_dir / "logs.txt"
            logs.write_text(self.stack.compose("logs", "--no-color", "--timestamps", check=False))
            say(f"the stack's logs are in {logs}")
            raise
        finally:
            with contextlib.suppress(CheckError):
                self.stack.compose("down", "--volumes", "--remove-orphans", timeout_s=180)

    def _crawl(self) -> None:
        t = self.timings
        t.step("up", lambda: self.stack.up(WORKERS))
        t.step("healthy", lambda: self.stack.wait_healthy(workers=WORKERS))
        self._check_loopback("after up")
        t.step("feed", self._feed)
        third = len(self.plan.items) // 3
        t.step(f"crawl until {third} ended", lambda: self._outcomes(until=third))
        t.step("stop workers", self._stop_workers)
        t.step("start workers", self._start_workers)
        self._check_loopback("while crawling")
        ended = t.step("crawl to the end", self._outcomes)
        self._check_ends(ended)
        t.step("deduplication", self._check_placements)
        t.step("thumbnails and keys", self._check_s3)
        t.step("prometheus targets", self._check_prometheus)
        t.step("down and up", self._down_and_up)

    def _feed(self) -> None:
        self.stack.tool(
            {self.run_dir: RUN_MOUNT},
            "image-crawler", "produce", f"{RUN_MOUNT}/urls.jsonl",
        )  # fmt: skip

    def _asked(self, path: str) -> str:
        """``"never"``, or how often the origin was asked for ``path`` and when (UTC, as
        the stack's logs time their lines)."""
        if self.origin is None:
            return "?"
        # The origin logs monotonic times: turned into the wall clock's.
        offset = time.time() - time.monotonic()
        times = [
            time.strftime("%H:%M:%S", time.gmtime(t + offset))
            for t, asked in self.origin.request_log
            if asked == path
        ]
        return f"{len(times)}x, at {' '.join(times)} UTC" if times else "never"

    def _outcomes(self, until: int | None = None) -> dict[str, str]:
        """Each planned uuid's end so far (until ``until`` of them have ended)."""
        command = ["python", f"{TOOLS_MOUNT}/outcomes.py", f"{RUN_MOUNT}/plan.json"]
        command += [f"--timeout-s={CRAWL_TIMEOUT_S}"]
        command += [f"--until={until}"] if until is not None else []
        mounts = {Path(__file__).resolve().parent: TOOLS_MOUNT, self.run_dir: RUN_MOUNT}
        result = json.loads(self.stack.tool(mounts, *command).strip().splitlines()[-1])
        ended: dict[str, str] = result["ended"]
        wanted = len(self.plan.items) if until is None else until
        if len(ended) < wanted:
            # How often the origin was asked for each (and when, by its clock): none means
            # the URL never got to a worker's request, some that its end went missing.
            pending = [
                f"{i.uuid} {i.path} (requested {self._asked(i.path)})"
                for i in self.plan.items
                if i.uuid not in ended
            ]
            raise CheckError(
                f"{len(ended)} of {len(self.plan.items)} URLs ended in {CRAWL_TIMEOUT_S:.0f} s; "
                f"not ended: {', '.join(pending[:5])}"
            )
        return ended

    def _stop_workers(self) -> None:
        seconds = self.stack.stop("worker")
        codes = self.stack.exit_codes("worker")
        grace_s = self.stack.stop_grace_s("worker")
        if len(codes) != WORKERS or any(codes) or seconds >= grace_s:
            raise CheckError(
                f"stopping the workers took {seconds:.1f} s (grace {grace_s:g} s), "
                f"exit codes {codes}"
            )
        handed_back = sum(
            event.get("tasks", 0)
            for container in self.stack.containers("worker", all_states=True)
            for event in self.stack.log_events(container, "handing_back")
        )
        ended = len(self._outcomes(until=0))
        if ended == len(self.plan.items):
            raise CheckError("every URL ended before the workers stopped: nothing left to resume")
        self.figures["workers stopped"] = (
            f"{seconds:.1f} s (exit codes {codes}, {ended} URLs ended, "
            f"{handed_back} tasks handed back)"
        )

    def _start_workers(self) -> None:
        self.stack.compose("start", "worker")
        self.stack.wait_healthy(["worker"], workers=WORKERS)

    def _check_ends(self, ended: dict[str, str]) -> None:
        expected = planning.expected_ends(self.plan)
        wrong = {u: (ended.get(u), e) for u, e in expected.items() if ended.get(u) != e}
        if wrong:
            sample = list(wrong.items())[:5]
            raise CheckError(
                f"{len(wrong)} URLs ended otherwise than planned (got, expected): {sample}"
            )
        self.figures["ends"] = dict(Counter(ended.values()))

    def _check_placements(self) -> None:
        """Every image placed; the plan serves each sample many times, and its copies
        share one cluster (or, a hash too plain to cluster, are each their own)."""
        command = ["python", f"{TOOLS_MOUNT}/placements.py", f"{RUN_MOUNT}/plan.json"]
        mounts = {Path(__file__).resolve().parent: TOOLS_MOUNT, self.run_dir: RUN_MOUNT}
        result = json.loads(self.stack.tool(mounts, *command).strip().splitlines()[-1])
        placed: dict[str, list[str | None]] = result["placed"]
        ok = [i for i in self.plan.items if i.expected == planning.OK and i.sample is not None]
        missing = [i.uuid for i in ok if i.uuid not in placed]
        if missing:
            raise CheckError(f"{len(missing)} of {len(ok)} images not placed: {missing[:5]}")
        roots: dict[str, set[str]] = {}
        copies = Counter(i.sample.name for i in ok if i.sample is not None)
        for item in ok:
            if item.sample is not None:
                roots.setdefault(item.sample.name, set()).add(placed[item.uuid][1] or item.uuid)
        split = {name: len(r) for name, r in roots.items() if 1 < len(r) < copies[name]}
        kinds = Counter(str(kind) for kind, _ in placed.values())
        if split or not kinds["exact"]:
            raise CheckError(f"copies not clustered (sample: clusters) {split}; kinds {kinds}")
        self.figures["placements"] = dict(kinds)

    def _check_s3(self) -> None:
        crawler = probes.s3_client(
            self.keys["S3_CRAWLER_ACCESS_KEY"], self.keys["S3_CRAWLER_SECRET_KEY"]
        )
        admin = probes.s3_client(self.keys["S3_ADMIN_ACCESS_KEY"], self.keys["S3_ADMIN_SECRET_KEY"])
        bucket = self.stack.services["worker"]["environment"]["S3_BUCKET"]
        ok = [i.uuid for i in self.plan.items if i.expected == planning.OK]
        self.figures["thumbnails"] = probes.thumbnails(crawler, bucket, ok)
        self.figures["crawler keys refused"] = probes.crawler_key_limits(
            crawler, admin, bucket, OTHER_BUCKET
        )

    def _check_prometheus(self) -> None:
        jobs = probes.wait_for_targets({"monitor": 1, "worker": WORKERS}, timeout_s=90)
        self.figures["targets up"] = sum(len(targets) for targets in jobs.values())

    def _down_and_up(self) -> None:
        if self.stack.redis_cli("SADD", "halted", HALTED_SOURCE) not in ("1", "(integer) 1"):
            raise CheckError(f"redis-cli SADD halted {HALTED_SOURCE} did not add it")
        self.stack.compose("down", timeout_s=180)
        if self.engine.containers():
            raise CheckError(f"containers left after down: {self.engine.containers()}")
        self.stack.up(WORKERS)
        self.stack.wait_healthy(workers=WORKERS)
        if self.stack.redis_cli("SISMEMBER", "halted", HALTED_SOURCE) not in ("1", "(integer) 1"):
            raise CheckError(f"{HALTED_SOURCE} is no longer halted after down and up")
        probes.wait_until(
            lambda: (
                probes.monitor_metric("crawler_source_permanently_halted", source=HALTED_SOURCE)
                == 1
            ),
            timeout_s=30,
            what=f"the monitor's crawler_source_permanently_halted of {HALTED_SOURCE} to be 1",
        )
        again = self._outcomes()
        if len(again) != len(self.plan.items):
            raise CheckError(f"after down and up the output topics hold {len(again)} ends")
        canonicals = self._dedup_canonicals()
        self.figures["after down and up"] = (
            f"{HALTED_SOURCE} still halted, {len(again)} ends kept, "
            f"{canonicals} canonical images read back by the deduplication stage"
        )

    def _dedup_canonicals(self) -> int:
        """The canonicals the new dedup container read back from its volume's journal."""
        found: list[int] = []

        def started() -> bool:
            for container in self.stack.containers("dedup"):
                found.extend(
                    e["canonicals"] for e in self.stack.log_events(container, "dedup_started")
                )
            return bool(found)

        probes.wait_until(started, timeout_s=60, what="the dedup service's dedup_started")
        if not found[0]:
            raise CheckError("after down and up the deduplication stage read no journal back")
        return found[0]

    def _check_loopback(self, when: str) -> None:
        networks = self.engine.docker(
            "network", "ls", "--format={{.Name}} {{.Driver}}", capture=True
        )
        made = [
            line
            for line in networks.stdout.splitlines()
            if line.split()[-1] not in ("host", "null")
        ]
        if made:
            raise CheckError(f"networks other than the host's {when}: {made}")
        pids = [int(pid) for c in self.engine.containers() for pid in self._pids(c)]
        checked, wrong = probes.off_loopback(pids)
        if wrong or not checked:
            raise CheckError(
                f"{len(wrong)} of {checked} sockets off loopback {when}:\n" + "\n".join(wrong)
            )
        self.figures["sockets on loopback"] = self.figures.get("sockets on loopback", 0) + checked

    def _pids(self, container: str) -> list[str]:
        top = self.engine.docker("top", container, "-eo", "pid", capture=True, check=False)
        return [line.strip() for line in top.stdout.splitlines()[1:] if line.strip().isdigit()]

    def summary(self) -> str:
        ends = self.figures.get("ends", {})
        steps = ", ".join(f"{name} {s:.0f} s" for name, s in self.timings.seconds.items())
        return (
            f"compose-check: OK: {sum(ends.values())} of {len(self.plan.items)} URLs ended "
            f"({', '.join(f'{k} {v}' for k, v in sorted(ends.items()))}); "
            f"{self.figures.get('thumbnails')} thumbnails; crawler keys refused "
            f"{', '.join(self.figures.get('crawler keys refused', {}))}; "
            f"{self.figures.get('sockets on loopback')} sockets seen, all on loopback; "
            f"{self.figures.get('targets up')} Prometheus targets up; "
            f"workers stopped in {self.figures.get('workers stopped')}; "
            f"placements {self.figures.get('placements')}; "
            f"{self.figures.get('after down and up')}; "
            f"total {self.timings.total_s:.0f} s ({steps})"
        )


@contextlib.contextmanager
def one_at_a_time(cache: Path) -> Iterator[None]:
    """Hold the cache's lock: a second check on the same cache (and ports) would stop the
    first one's engine as a leftover."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SystemExit(f"compose-check: another check is running on {cache}") from None
        yield


def main() -> int:
    parser = argparse.ArgumentParser(prog="make compose-check", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
        / "image-crawler"
        / "compose-check",
        help="the engine's images, the base file system and the run's files (default: %(default)s)",
    )
    parser.add_argument("--per-source", type=int, default=200, help="URLs of each of the 3 sources")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("compose-check: run as root (it starts a Docker engine)", file=sys.stderr)
        return 2
    run_dir = args.cache / "work"
    with signals_to(raise_interrupt), one_at_a_time(args.cache):
        try:
            installed = install_packages()
            if installed:
                say(f"installed {', '.join(installed)}")
            taken = probes.ports_in_use()
            if taken:
                raise CheckError(f"ports the stack needs are in use on 127.0.0.1: {taken}")
            run_dir.mkdir(parents=True, exist_ok=True)
            for leftover in run_dir.iterdir():
                leftover.unlink()
            run_dir.chmod(0o755)
            with Engine(args.cache) as engine:
                check = Check(engine, run_dir, args.per_source)
                check.build_images()
                origin = Origin().start()
                try:
                    check.run(origin)
                finally:
                    origin.stop()
            print(check.summary(), flush=True)
            return 0
        except CheckError as error:
            print(f"compose-check: FAILED: {error}", file=sys.stderr, flush=True)
            return 1
        except KeyboardInterrupt:
            print("compose-check: interrupted; containers removed, engine stopped", file=sys.stderr)
            return 130


if __name__ == "__main__":
    sys.exit(main())
