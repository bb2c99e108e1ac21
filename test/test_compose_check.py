"""The parts of ``make compose-check`` (deploy/compose_check) that run without a Docker
engine: its override and what it derives from the repository's files, the Kafka
stand-in's reading of the compose settings and its health check against a real broker,
the plan it crawls, and its loopback rule. The check itself is the test of the rest; CI
runs it after the suite (.ci/run)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from crawl_monitor.policy.rates import compute_crawl_rate
from deploy.compose_check import plan as planning
from deploy.compose_check import probes
from deploy.compose_check.__main__ import (
    WORKERS,
    one_at_a_time,
    write_env,
    write_prometheus_config,
)
from deploy.compose_check.engine import Engine
from deploy.compose_check.stack import COMPOSE_FILE, OVERRIDE_FILE, SERVICES, Stack, resolve
from image_crawler.ports import parse_ports
from test.harness.services import KafkaBroker, free_port
from test.test_compose import docker_compose  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parent.parent
KAFKA_STANDIN = ROOT / "deploy" / "compose_check" / "standins" / "kafka"


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem.replace("-", "_"), path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def override() -> dict[str, Any]:
    return dict(yaml.safe_load(OVERRIDE_FILE.read_text()))


def test_override_puts_every_started_service_on_the_hosts_network_by_name(
    override: dict[str, Any],
) -> None:
    compose = yaml.safe_load(COMPOSE_FILE.read_text())
    # Everything but Grafana (no stand-in) runs; everything that listens has its name.
    assert set(SERVICES) == set(compose["services"]) - {"grafana"}
    names = set(SERVICES) - {"createbucket"}
    for name in SERVICES:
        service = override["services"][name]
        assert service["network_mode"] == "host", name
        assert sorted(service["extra_hosts"]) == sorted(f"{n}:127.0.0.1" for n in names), name
    # No network of the project's own: the default one is the host's.
    assert override["networks"]["default"] == {"external": True, "name": "host"}


def test_production_file_stays_as_operators_run_it() -> None:
    compose = yaml.safe_load(COMPOSE_FILE.read_text())
    for name, service in compose["services"].items():
        assert "network_mode" not in service, name
        assert "extra_hosts" not in service, name
    assert "networks" not in compose


def test_override_listens_on_loopback_only(override: dict[str, Any]) -> None:
    services = override["services"]
    listeners = services["kafka"]["environment"]["KAFKA_LISTENERS"].split(",")
    assert all("://127.0.0.1:" in listener for listener in listeners)
    assert services["redis"]["command"][-2:] == ["--bind", "127.0.0.1"]
    assert services["seaweedfs"]["environment"]["SEAWEEDFS_BIND"] == "127.0.0.1"
    for app in ("monitor", "worker"):
        assert services[app]["environment"]["METRICS_HOST"] == "127.0.0.1"
    assert "--web.listen-address=127.0.0.1:9090" in services["prometheus"]["command"]


def test_prometheus_scrapes_the_range_the_workers_take(
    override: dict[str, Any], tmp_path: Path
) -> None:
    config = yaml.safe_load(write_prometheus_config(tmp_path).read_text())
    original = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {job["job_name"] for job in original["scrape_configs"]}
    assert jobs["monitor"] == next(
        j for j in original["scrape_configs"] if j["job_name"] == "monitor"
    )
    (targets,) = jobs["worker"]["static_configs"]
    ports = parse_ports(
        "METRICS_PORT", override["services"]["worker"]["environment"]["METRICS_PORT"]
    )
    assert targets["targets"] == [f"worker:{p}" for p in range(ports.first, ports.last + 1)]
    assert ports.last - ports.first + 1 == WORKERS
    assert "dns_sd_configs" not in jobs["worker"]


def test_env_has_new_keys_and_everything_else_of_the_example(tmp_path: Path) -> None:
    env_file, keys = write_env(tmp_path, "http://127.0.0.1:1234/stats/")
    assert env_file.stat().st_mode & 0o077 == 0
    values = dict(
        line.split("=", 1)
        for line in env_file.read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )
    assert len(set(keys.values())) == 4
    for name, key in keys.items():
        assert values[name] == key and not key.startswith("change-me")
    assert values["SOURCES_URL"] == "http://127.0.0.1:1234/stats/"
    example = (ROOT / ".env.example").read_text().splitlines()
    assert [line for line in example if line.startswith("#")] == [
        line for line in env_file.read_text().splitlines() if line.startswith("#")
    ]


def test_resolved_project_differs_only_by_the_published_ports(
    docker_compose: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    env_file, _ = write_env(tmp_path, "http://127.0.0.1:1234/stats/")
    prometheus = write_prometheus_config(tmp_path)
    project = resolve(env_file, prometheus, tmp_path / "compose.yml", Engine(tmp_path))
    assert project.stat().st_mode & 0o077 == 0
    resolved = yaml.safe_load(project.read_text())
    direct = yaml.safe_load(
        subprocess.run(
            [docker_compose, f"--file={COMPOSE_FILE}", f"--file={OVERRIDE_FILE}",
             f"--env-file={env_file}", "--profile=monitoring", "config"],
            env={**os.environ, "COMPOSE_CHECK_PROMETHEUS_CONFIG": str(prometheus)},
            capture_output=True, text=True, check=True,
        ).stdout
    )  # fmt: skip
    assert any("ports" in service for service in direct["services"].values())
    for name in SERVICES:
        direct["services"][name].pop("ports", None)
    assert resolved == direct
    # What the check reads of the project: the workers' grace period, as compose wrote it.
    assert Stack(Engine(tmp_path), project).stop_grace_s("worker") == 45.0


@pytest.mark.parametrize(
    ("listeners", "default", "expected"),
    [
        ("PLAINTEXT://:9092,CONTROLLER://:9093,EXTERNAL://:29092", "0.0.0.0", ("0.0.0.0", 9092)),
        ("PLAINTEXT://kafka:9092,EXTERNAL://localhost:29092", "localhost", ("kafka", 9092)),
        (
            "EXTERNAL://127.0.0.1:29092, PLAINTEXT://127.0.0.1:19092",
            "0.0.0.0",
            ("127.0.0.1", 19092),
        ),
    ],
)
def test_kafka_standin_takes_the_plaintext_listener(
    listeners: str, default: str, expected: tuple[str, int]
) -> None:
    assert _load(KAFKA_STANDIN / "start.py").plaintext(listeners, default) == expected


def test_kafka_standin_refuses_settings_without_a_plaintext_listener() -> None:
    with pytest.raises(SystemExit, match="no PLAINTEXT listener"):
        _load(KAFKA_STANDIN / "start.py").plaintext("EXTERNAL://:29092", "0.0.0.0")


@pytest.mark.integration
def test_kafka_standin_health_check_asks_the_broker(kafka: KafkaBroker) -> None:
    script = KAFKA_STANDIN / "kafka-broker-api-versions.sh"

    def status(server: str) -> int:
        command = [sys.executable, str(script), "--bootstrap-server", server]
        return subprocess.run(command, capture_output=True, timeout=30, check=False).returncode

    assert status(kafka.bootstrap) == 0
    assert status(f"127.0.0.1:{free_port()}") == 1


def test_plan_has_three_sources_with_404s_and_broken_images() -> None:
    plan = planning.make_plan(200)
    assert len(plan.items) == 600
    assert len({item.uuid for item in plan.items}) == 600
    assert Counter(item.source for item in plan.items) == dict.fromkeys(planning.SOURCES, 200)
    assert plan.by_expected() == {"ok": 570, "404": 15, "UnidentifiedImageError": 15}
    (source,) = {json.dumps(s["media_count"]) for s in planning.sources_list()}
    assert compute_crawl_rate(int(source)) == pytest.approx(planning.RATE_RPS, rel=0.01)


SS_LINES = [
    'tcp LISTEN 0 4096 127.0.0.1:9092 0.0.0.0:* users:(("tansu",pid=10,fd=9))',
    'tcp ESTAB 0 0 127.0.0.1:40000 127.0.0.1:9092 users:(("python",pid=11,fd=3))',
    'tcp LISTEN 0 4096 [::1]:9100 [::]:* users:(("python",pid=12,fd=7))',
    'udp UNCONN 0 0 [::ffff:127.0.0.1]:5353 *:* users:(("python",pid=12,fd=8))',
    'tcp LISTEN 0 4096 0.0.0.0:8333 0.0.0.0:* users:(("weed",pid=13,fd=5))',
    'tcp ESTAB 0 0 127.0.0.1:41000 93.184.216.34:443 users:(("python",pid=14,fd=4))',
    'tcp LISTEN 0 4096 0.0.0.0:22 0.0.0.0:* users:(("sshd",pid=99,fd=3))',
]


@pytest.mark.parametrize(
    ("pids", "checked", "wrong"),
    [
        ({10, 11, 12}, 4, []),
        ({13}, 1, [SS_LINES[4]]),
        ({14}, 1, [SS_LINES[5]]),
        ({10, 13, 14}, 3, [SS_LINES[4], SS_LINES[5]]),
        ({1000}, 0, []),  # another process's sockets are not the stack's
    ],
)
def test_sockets_off_loopback(pids: set[int], checked: int, wrong: list[str]) -> None:
    assert probes.sockets_off_loopback(SS_LINES, pids) == (checked, wrong)


def test_one_check_at_a_time_on_a_cache(tmp_path: Path) -> None:
    held = one_at_a_time(tmp_path)
    with held, pytest.raises(SystemExit, match="another check is running"), one_at_a_time(tmp_path):
        pass
    with one_at_a_time(tmp_path):  # released
        pass
