"""The compose project the check runs: ``docker-compose.yml`` plus the check's override.

docker-compose 1.29 (Debian's) refuses a service on the host's network that also
publishes ports (docker-py's "host network_mode is incompatible with port_bindings";
Compose v2 and the engine only warn that such ports are moot). An override can add ports
but not remove them, so the two files are resolved once by docker-compose's own
``config``, the published ports of the services on the host's network are dropped, and
the project runs from that resolved file: nothing else in it differs from what the two
files say.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from deploy.compose_check.engine import DOCKER, CheckError, Engine, run

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
OVERRIDE_FILE = Path(__file__).resolve().parent / "docker-compose.check.yml"
PROJECT = "image-crawler-check"
# Everything but Grafana, which has no stand-in (see docs/production.md).
SERVICES = (
    "kafka",
    "redis",
    "seaweedfs",
    "createbucket",
    "monitor",
    "worker",
    "dedup",
    "prometheus",
)
HEALTH_CHECKED = ("kafka", "redis", "seaweedfs", "monitor", "worker", "dedup")
HEALTH_TIMEOUT_S = 240.0


def resolve(env_file: Path, prometheus_config: Path, out: Path, engine: Engine) -> Path:
    """Write the project's file: both files resolved by ``docker-compose config``, minus
    the published ports of services on the host's network. Holds the keys: mode 0600."""
    resolved = run(
        [
            "docker-compose",
            f"--file={COMPOSE_FILE}",
            f"--file={OVERRIDE_FILE}",
            f"--env-file={env_file}",
            "--profile=monitoring",
            "config",
        ],
        env={**engine.env, "COMPOSE_CHECK_PROMETHEUS_CONFIG": str(prometheus_config)},
        capture=True,
    ).stdout
    config = yaml.safe_load(resolved)
    for name, service in config["services"].items():
        if service.get("network_mode") == "host":
            service.pop("ports", None)
        elif name in SERVICES:
            raise CheckError(f"{name} is not on the host's network: check {OVERRIDE_FILE.name}")
    out.touch(mode=0o600)
    out.write_text(yaml.safe_dump(config, sort_keys=False))
    return out


class Stack:
    """``docker-compose`` on the resolved file, against the check's engine."""

    def __init__(self, engine: Engine, project_file: Path) -> None:
        self.engine = engine
        self.project_file = project_file
        self.services: dict[str, Any] = yaml.safe_load(project_file.read_text())["services"]

    def compose(
        self, *args: str, capture: bool = True, check: bool = True, timeout_s: float = 600.0
    ) -> str:
        command = ["docker-compose", f"--file={self.project_file}", f"--project-name={PROJECT}"]
        return run(
            [*command, *args],
            env=self.engine.env,
            capture=capture,
            check=check,
            timeout_s=timeout_s,
        ).stdout

    def stop_grace_s(self, service: str) -> float:
        """The service's ``stop_grace_period`` in seconds (compose writes it as ``45s``)."""
        return float(str(self.services[service]["stop_grace_period"]).removesuffix("s"))

    def up(self, workers: int) -> float:
        """``up -d`` of ``SERVICES`` with ``workers`` workers; the seconds it took."""
        started = time.monotonic()
        self.compose("up", "--detach", "--no-build", f"--scale=worker={workers}", *SERVICES)
        return time.monotonic() - started

    def containers(self, service: str, *, all_states: bool = False) -> list[str]:
        """The ids of ``service``'s containers (one-off runs excluded)."""
        filters = [
            f"--filter=label=com.docker.compose.project={PROJECT}",
            f"--filter=label=com.docker.compose.service={service}",
            "--filter=label=com.docker.compose.oneoff=False",
        ]
        listed = self.engine.docker(
            "ps", "-q", *(["-a"] if all_states else []), *filters, capture=True
        )
        return listed.stdout.split()

    def inspect(self, container: str) -> dict[str, Any]:
        """The container's state (``docker inspect``'s ``.State``)."""
        state = self.engine.docker("inspect", "--format={{json .State}}", container, capture=True)
        return dict(json.loads(state.stdout))

    def wait_healthy(self, services: Iterable[str] = HEALTH_CHECKED, workers: int = 1) -> float:
        """Wait until every container of ``services`` is healthy and ``createbucket``
        exited 0; the seconds waited. A container that exits or turns unhealthy for good
        fails the check with its health log."""
        started = time.monotonic()
        deadline = started + HEALTH_TIMEOUT_S
        services = list(services)
        while True:
            waiting = []
            for service in services:
                ids = self.containers(service)
                expected = workers if service == "worker" else 1
                if len(ids) < expected:
                    waiting.append(f"{service}: {len(ids)} of {expected} running")
                for container in ids:
                    health = (self.inspect(container).get("Health") or {}).get("Status")
                    if health != "healthy":
                        waiting.append(f"{service} {container[:12]}: {health}")
            waiting += self._createbucket_problem()
            if not waiting:
                return time.monotonic() - started
            if time.monotonic() > deadline:
                raise CheckError(
                    "not healthy in time: " + "; ".join(waiting) + self._logs(services)
                )
            time.sleep(1.0)

    def _createbucket_problem(self) -> list[str]:
        ids = self.containers("createbucket", all_states=True)
        if not ids:
            return ["createbucket: not created"]
        state = self.inspect(ids[0])
        if state.get("Running") or state.get("Status") == "created":
            return ["createbucket: running"]
        if state.get("ExitCode") != 0:
            raise CheckError(
                f"createbucket exited with {state.get('ExitCode')}" + self._logs(["createbucket"])
            )
        return []

    def _logs(self, services: Sequence[str]) -> str:
        return "\n" + self.compose("logs", "--no-color", "--tail=15", *services, check=False)

    def stop(self, service: str) -> float:
        """``stop`` ``service``; the seconds it took."""
        started = time.monotonic()
        self.compose("stop", service)
        return time.monotonic() - started

    def exit_codes(self, service: str) -> list[int]:
        return [int(self.inspect(c)["ExitCode"]) for c in self.containers(service, all_states=True)]

    def log_events(self, container: str, event: str) -> list[dict[str, Any]]:
        """The JSON log lines of ``container`` whose event is ``event``."""
        logs = self.engine.docker("logs", container, capture=True).stdout
        found = []
        for line in logs.splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and record.get("event") == event:
                    found.append(record)
        return found

    def redis_cli(self, *args: str) -> str:
        """redis-cli in the redis container, as an operator would use it."""
        return self.compose("exec", "-T", "redis", "redis-cli", *args).strip()

    def tool(self, mounts: dict[Path, str], *command: str, timeout_s: float = 900.0) -> str:
        """``command`` in a one-off container of the worker's image, with the worker's
        network, host names and environment (KAFKA_HOSTS...); its stdout (its stderr,
        progress, passes through). ``docker run``: compose 1.29's ``run`` links the
        service's dependencies, which the engine refuses beside host networking."""
        worker = self.services["worker"]
        hosts = worker.get("extra_hosts", {})
        if isinstance(hosts, dict):
            hosts = [f"{name}:{address}" for name, address in hosts.items()]
        options = [f"--network={worker['network_mode']}"]
        options += [f"--add-host={host}" for host in hosts]
        # In a file (0600, beside the project file), so that no key shows in a process list.
        env_file = self.project_file.with_name("worker.env")
        env_file.touch(mode=0o600)
        env_file.write_text(
            "".join(f"{k}={v}\n" for k, v in (worker.get("environment") or {}).items())
        )
        options += [f"--env-file={env_file}"]
        options += [f"--volume={source}:{target}:ro" for source, target in mounts.items()]
        return run(
            [
                DOCKER,
                "run",
                "--rm",
                "--init",
                *options,
                "--entrypoint",
                command[0],
                worker["image"],
                *command[1:],
            ],
            env=self.engine.env,
            capture="stdout",
            timeout_s=timeout_s,
        ).stdout
