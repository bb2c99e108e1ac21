"""The crawl a campaign runs faults against: real services on loopback ports (tansu on a
SeaweedFS, so that a restarted broker finds its topics; redis-server with its
append-only file; moto's S3 server for the thumbnails), the origin, two monitors and
three workers, each a ``python -m`` process with its log in the run folder.

Every process the campaign starts, and every process those start, is noted as it is
seen (``Census``): at the end each must be gone.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import psutil

from chaos import plan
from crawlctl.localstack.objects import ObjectStore
from crawlctl.localstack.services import free_port
from test.harness.processes import ROOT, CrawlerProcess
from test.harness.services import KafkaBroker, RedisServer, S3Server, create_bucket

BUCKET = "chaos-thumbnails"
MONITORS = 2
WORKERS = 3
# A SIGTERMed worker lets its tasks run this long, then hands the rest back.
SHUTDOWN_GRACE_S = 10


class Census:
    """Every descendant of this process, noted once a second (pid, start time, command)."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, float], str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="census", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def note(self) -> None:
        for process in psutil.Process().children(recursive=True):
            try:
                key = (process.pid, process.create_time())
                if key not in self.seen:
                    self.seen[key] = " ".join(process.cmdline())[:160]
            except psutil.Error:
                continue

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.note()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def alive(self) -> list[str]:
        """The noted processes still running (a pid reused since is not counted)."""
        left = []
        for (pid, created), command in self.seen.items():
            try:
                if psutil.Process(pid).create_time() == created:
                    left.append(f"{pid} {command}")
            except psutil.Error:
                continue
        return left


class Origin:
    """``python -m chaos.origin`` in a subprocess."""

    def __init__(self, run_dir: Path) -> None:
        self.port = free_port()
        self.log_path = run_dir / "origin-requests.jsonl"
        self._out = open(run_dir / "logs" / "origin.log", "wb")  # noqa: SIM115 - closed in stop
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "chaos.origin",
                "--port",
                str(self.port),
                "--log",
                str(self.log_path),
            ],
            cwd=ROOT,
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        first = next(iter(plan.HOSTS))
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the origin exited {self.process.returncode}")
            try:
                urllib.request.urlopen(f"http://{first}:{self.port}/robots.txt", timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise TimeoutError("the origin did not answer")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._out.close()

    def requests(self) -> list[tuple[float, str, str, int, int]]:
        rows = []
        for line in self.log_path.read_text().splitlines():
            try:
                t, host, path, status, retry_after = json.loads(line)
            except ValueError:
                continue  # a line cut short by a kill
            rows.append((float(t), host, path, int(status), int(retry_after)))
        rows.sort()
        return rows


class Stack:
    """Services, origin and crawler processes; the faults act on its members."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.logs = run_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.objects = ObjectStore(data_dir=run_dir / "broker-data", log_dir=self.logs)
        self.broker: KafkaBroker | None = None
        self.redis = RedisServer(data_dir=run_dir / "redis-data", log_dir=self.logs)
        self.s3 = S3Server(log_dir=self.logs)
        self.origin: Origin | None = None
        self.monitors: list[CrawlerProcess | None] = [None] * MONITORS
        self.workers: list[CrawlerProcess | None] = [None] * WORKERS
        self._starts: dict[str, int] = {}

    def start_services(self) -> None:
        self.objects.start()
        self.broker = KafkaBroker(
            storage=self.objects.storage_url,
            storage_env=self.objects.client_env,
            log_dir=self.logs,
        )
        self.broker.start()
        self.redis.start()
        self.s3.start()
        create_bucket(self.s3.endpoint_url, BUCKET)
        self.origin = Origin(self.run_dir)
        self.origin.wait_ready()
        self._write_sources()

    def _write_sources(self) -> None:
        sources = [{"source_name": s.name, "image_count": s.image_count} for s in plan.SOURCES]
        (self.run_dir / "sources.json").write_text(json.dumps(sources))

    @property
    def _env(self) -> dict[str, str]:
        assert self.broker is not None
        return {**self.broker.env, "REDIS_URL": self.redis.url}

    def monitor_env(self) -> dict[str, str]:
        return {**self._env, "SOURCES_FILE": str(self.run_dir / "sources.json")}

    def worker_env(self) -> dict[str, str]:
        return {
            **self._env,
            **self.s3.env,
            "S3_BUCKET": BUCKET,
            "IMAGE_PROCESSES": "1",
            "SHUTDOWN_GRACE_S": str(SHUTDOWN_GRACE_S),
            # The origin's hosts, and nothing else on loopback.
            "ALLOWED_PRIVATE_NETWORKS": plan.ALLOWED_NETWORK,
        }

    def start_process(self, role: str, slot: int) -> CrawlerProcess:
        """A new ``python -m worker`` (or ``crawl_monitor``) in ``slot``, its log numbered."""
        name = f"{role}{slot}"
        self._starts[name] = self._starts.get(name, 0) + 1
        log = self.logs / f"{name}.{self._starts[name]}.log"
        if role == "worker":
            process = CrawlerProcess("worker", self.worker_env(), log)
            self.workers[slot] = process
        else:
            process = CrawlerProcess("crawl_monitor", self.monitor_env(), log)
            self.monitors[slot] = process
        return process

    def start_crawlers(self) -> None:
        for slot in range(MONITORS):
            self.start_process("monitor", slot)
        for slot in range(WORKERS):
            self.start_process("worker", slot)

    def crawlers(self) -> list[CrawlerProcess]:
        return [p for p in [*self.monitors, *self.workers] if p is not None]

    def stop(self) -> dict[str, int | None]:
        """Everything, crawlers first (SIGTERM, as an operator would); their exit codes."""
        codes: dict[str, int | None] = {}
        crawlers = self.crawlers()
        for process in crawlers:
            if process.process.poll() is None:
                process.signal(signal.SIGTERM)
        for process in crawlers:
            try:
                codes[process.log_path.name] = process.wait(SHUTDOWN_GRACE_S + 30)
            except subprocess.TimeoutExpired:
                process.stop()
                codes[process.log_path.name] = None
        for service in (self.s3, self.redis, self.broker, self.objects):
            if service is not None:
                if getattr(service, "paused", False):
                    service.resume()
                service.stop()
        if self.origin is not None:
            self.origin.stop()
        return codes
