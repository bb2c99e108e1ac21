"""The deployment files as operators use them.

``docker-compose.yml`` is parsed, interpolated and validated against the Compose schema by
a real implementation, docker-compose 1.29 (its ``config`` command needs no Docker
engine), with ``.env.example`` as the env file, and the normalised result is checked
against the contract: the services and their pinned images, KRaft and its retention,
health checks, metrics ports, and environments that point each process at the right
service, consistently, also when an operator sets the bucket and the S3 keys.

No container runs here (there is no Docker engine), so what the containers would run is
run directly where that is possible: the S3 server's entrypoint script, with the pinned
SeaweedFS release (``test/harness/production_seaweedfs.py``), then the one-shot bucket
creation with the admin keys, the worker's own S3 store with the crawler's keys, and the
health-check commands against real servers. The Dockerfiles and ``.dockerignore`` are
checked as text.

docker-compose is taken from PATH or, when running as root on Debian (as CI does),
installed once per session with apt-get.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import botocore.session
import pytest
import yaml
from aiobotocore.credentials import AioCredentials
from botocore.config import Config
from botocore.exceptions import ClientError
from prometheus_client import CollectorRegistry

from crawl_monitor.settings import MonitorSettings
from image_crawler import contract, healthcheck
from image_crawler.config import RENAMED, MetricsSettings, S3Settings
from image_crawler.metrics import serving
from test.core.test_config import readers_in, variables
from test.harness.apt import AptUnavailable, apt_install
from test.harness.production_seaweedfs import ComposeSeaweedFS, NoWeed, find_or_install_weed
from test.harness.services import free_port_range
from worker.settings import WorkerSettings
from worker.sinks.base import DependencyError
from worker.sinks.s3 import SignedS3Store

pytestmark = [
    pytest.mark.integration,
    # The first test may wait for `apt-get update` and `apt-get install docker-compose`.
    pytest.mark.timeout(600),
]

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
DOCKERIGNORE = ROOT / ".dockerignore"

PINNED_IMAGES = {
    "kafka": "apache/kafka",
    "redis": "redis",
    "seaweedfs": "chrislusf/seaweedfs",
    "prometheus": "prom/prometheus",
    "grafana": "grafana/grafana",
}
# `docker compose --profile monitoring up`: Prometheus and Grafana on top of the crawl.
MONITORING = {"prometheus", "grafana"}
PROMETHEUS_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
# service -> the module its container runs with `python -m`, as in the contract.
APPS = {"monitor": "crawl_monitor", "worker": "worker"}
METRICS_PORTS = {"monitor": 9100, "worker": 9101}
SERVICES = set(PINNED_IMAGES) | set(APPS) | {"createbucket"}
DEFAULT_BUCKET = "cc-image-analysis"  # the contract's default S3_BUCKET
S3_KEYS = (
    "S3_ADMIN_ACCESS_KEY",
    "S3_ADMIN_SECRET_KEY",
    "S3_CRAWLER_ACCESS_KEY",
    "S3_CRAWLER_SECRET_KEY",
)
# What an operator puts in `.env`: every value differs from the example's, and the keys
# use every character the S3 server's entrypoint accepts beside letters and digits.
OVERRIDES = {
    "S3_ADMIN_ACCESS_KEY": "operator.admin-key_01",
    "S3_ADMIN_SECRET_KEY": "Adm1n/Secret+Key=",
    "S3_CRAWLER_ACCESS_KEY": "crawler.key-under_test",
    "S3_CRAWLER_SECRET_KEY": "crawler/secret+under=test",
    "S3_BUCKET": "thumbnails-under-test",
}

CONFIG_TIMEOUT_S = 60
PROBE_TIMEOUT_S = 30


# --- docker-compose ----------------------------------------------------------------------


@pytest.fixture(scope="session")
def docker_compose() -> str:
    """The docker-compose executable: from PATH, else installed with apt-get as root."""
    found = shutil.which("docker-compose")
    if found is not None:
        return found
    # Without recommends, which would pull in the Docker engine: `config` needs only the
    # Python tool.
    try:
        apt_install(["docker-compose"])
    except AptUnavailable as e:
        pytest.skip(f"docker-compose is not on PATH and {e}: apt-get install docker-compose")
    found = shutil.which("docker-compose")
    if found is None:
        pytest.skip("docker-compose is still not on PATH after apt-get install docker-compose")
    return found


def _run_compose(
    docker_compose: str, compose_file: Path, env_file: Path, *args: str, **variables: str
) -> subprocess.CompletedProcess[str]:
    # A minimal environment and an explicit env file: what is checked is the file's own
    # defaults, the env file and exactly `variables`, never the caller's shell or a
    # stray `.env`.
    env = {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": os.environ.get("HOME", "/root"),
        "LC_ALL": "C.UTF-8",
        **variables,
    }
    return subprocess.run(
        [docker_compose, "--env-file", str(env_file), "-f", str(compose_file), *args],
        cwd=compose_file.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=CONFIG_TIMEOUT_S,
        check=False,
    )


@pytest.fixture(scope="session")
def empty_env_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("compose") / "empty.env"
    path.write_text("")
    return path


def _config(docker_compose: str, env_file: Path, **variables: str) -> dict[str, Any]:
    result = _run_compose(docker_compose, COMPOSE_FILE, env_file, "config", **variables)
    assert result.returncode == 0, f"docker-compose rejects docker-compose.yml:\n{result.stderr}"
    config = yaml.safe_load(result.stdout)
    assert isinstance(config, dict)
    return config


@pytest.fixture(scope="session")
def compose_default(docker_compose: str) -> dict[str, Any]:
    """``docker-compose config`` with ``.env.example`` as it is: what `cp .env.example
    .env` gives an operator (the S3 keys are its placeholders)."""
    return _config(docker_compose, ENV_EXAMPLE)


@pytest.fixture(scope="session")
def compose_overridden(docker_compose: str) -> dict[str, Any]:
    """``docker-compose config`` with the bucket and S3 keys set (``OVERRIDES``)."""
    return _config(docker_compose, ENV_EXAMPLE, **OVERRIDES)


@pytest.fixture(params=["default", "overridden"])
def compose(
    request: pytest.FixtureRequest,
    compose_default: dict[str, Any],
    compose_overridden: dict[str, Any],
) -> dict[str, Any]:
    return compose_default if request.param == "default" else compose_overridden


# --- reading the normalised config ------------------------------------------------------


def service(config: Mapping[str, Any], name: str) -> dict[str, Any]:
    services = config["services"]
    assert name in services, f"docker-compose.yml has no {name!r} service"
    result = services[name]
    assert isinstance(result, dict)
    return result


def environment(config: Mapping[str, Any], name: str) -> dict[str, str]:
    """A service's environment as strings (a bare ``KEY:`` passes the host's value: '')."""
    env = service(config, name).get("environment") or {}
    if isinstance(env, list):  # `KEY=value` entries
        env = dict(item.partition("=")[::2] for item in env)
    return {key: "" if value is None else str(value) for key, value in env.items()}


def image_repository(image: str) -> str:
    """``docker.io/library/redis:7-alpine`` -> ``redis``: the repository, no tag or digest."""
    name = image.split("@", 1)[0]
    slash = name.rfind("/")
    if ":" in name[slash + 1 :]:
        name = name[: name.rindex(":")]
    for prefix in ("docker.io/", "index.docker.io/", "library/"):
        name = name.removeprefix(prefix)
    return name


def image_tag(image: str) -> str:
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return last.partition(":")[2]


def healthcheck_test(config: Mapping[str, Any], name: str) -> list[str]:
    """The health check's test as ``["CMD" | "CMD-SHELL", ...]``."""
    check = service(config, name).get("healthcheck")
    assert check, f"{name} has no healthcheck"
    assert not check.get("disable"), f"{name}'s healthcheck is disabled"
    test = check.get("test")
    assert test, f"{name}'s healthcheck has no test"
    if isinstance(test, str):
        return ["CMD-SHELL", test]
    assert test[0] in ("CMD", "CMD-SHELL"), f"{name}'s healthcheck test is {test!r}"
    return [str(word) for word in test]


def healthcheck_command(config: Mapping[str, Any], name: str) -> str:
    return " ".join(healthcheck_test(config, name)[1:])


def named_volumes_at(config: Mapping[str, Any], name: str, target: str) -> set[str]:
    """The top-level named volumes mounted at ``target`` in service ``name``."""
    found: set[str] = set()
    for mount in service(config, name).get("volumes") or []:
        if isinstance(mount, str):  # `source:target[:mode]`
            source, _, rest = mount.partition(":")
            mount = {"source": source, "target": rest.split(":")[0]}
        if mount.get("target") == target:
            found.add(mount.get("source"))
    return found & set(config.get("volumes") or {})


def published_ports(config: Mapping[str, Any], name: str) -> list[tuple[str, int, int]]:
    """``(host_ip, published, target)`` of each port a service publishes."""
    found = []
    for port in service(config, name).get("ports") or []:
        if isinstance(port, str):  # docker-compose 1.29: `ip:published:target[/proto]`
            host_ip, published, target = port.split("/")[0].rsplit(":", 2)
            found.append((host_ip, int(published), int(target)))
        else:  # the Compose Specification's long form (docker compose v2)
            found.append((port.get("host_ip", ""), int(port["published"]), int(port["target"])))
    return found


def depends_on(config: Mapping[str, Any], name: str) -> dict[str, str]:
    """Dependency -> condition; the short (list) form means ``service_started``."""
    deps = service(config, name).get("depends_on") or {}
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {dep: (spec or {}).get("condition", "service_started") for dep, spec in deps.items()}


def entrypoint(config: Mapping[str, Any], name: str) -> list[str]:
    """A service's entrypoint as the container gets it (compose's ``$$`` escapes undone)."""
    value = service(config, name).get("entrypoint")
    assert value, f"{name} has no entrypoint"
    words = [value] if isinstance(value, str) else value
    return [str(word).replace("$$", "$") for word in words]


def command_text(config: Mapping[str, Any], name: str) -> str:
    """Entrypoint and command as one string, with compose's ``$$`` escapes undone."""
    spec = service(config, name)
    words: list[str] = []
    for key in ("entrypoint", "command"):
        value = spec.get(key) or []
        words.extend([value] if isinstance(value, str) else value)
    return " ".join(words).replace("$$", "$")


def seaweedfs_flag(config: Mapping[str, Any], flag: str) -> str:
    """The value of ``-flag=value`` on the S3 server's ``weed server`` line."""
    match = re.search(
        rf"\bexec weed server\b.*\s-{re.escape(flag)}=(\S+)", command_text(config, "seaweedfs")
    )
    assert match, f"seaweedfs: `weed server` has no -{flag}"
    return match.group(1)


def duration_s(value: Any) -> float:
    """Compose durations: ``45s``, ``1m30s``, ``1h``, ``500ms``; a bare number is seconds."""
    if isinstance(value, int | float):
        return float(value)
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", str(value))
    assert parts and "".join(n + u for n, u in parts) == str(value), f"duration {value!r}"
    return sum(float(n) * units[u] for n, u in parts)


def env_example() -> dict[str, tuple[str, bool]]:
    """``.env.example`` as name -> (value, set); ``# NAME=value`` lines are documented
    but not set."""
    found: dict[str, tuple[str, bool]] = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        match = re.fullmatch(r"(#\s*)?([A-Z][A-Z0-9_]*)=(.*)", line.strip())
        if match:
            name = match.group(2)
            assert name not in found, f".env.example lists {name} twice"
            found[name] = (match.group(3), match.group(1) is None)
    return found


def compose_variables() -> set[str]:
    """Every variable docker-compose.yml interpolates (``$$`` is the container's own)."""
    text = re.sub(r"\$\$", "", COMPOSE_FILE.read_text())
    return set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", text))


# --- the compose file -------------------------------------------------------------------


def test_docker_compose_validates_the_file(docker_compose: str) -> None:
    result = _run_compose(docker_compose, COMPOSE_FILE, ENV_EXAMPLE, "config", "--quiet")
    assert result.returncode == 0, result.stderr
    services = _run_compose(docker_compose, COMPOSE_FILE, ENV_EXAMPLE, "config", "--services")
    assert set(services.stdout.split()) >= SERVICES


def test_docker_compose_rejects_what_the_schema_forbids(
    docker_compose: str, tmp_path: Path
) -> None:
    # The control for the test above: `config` is a schema check, not a YAML load.
    broken = tmp_path / "docker-compose.yml"
    text = COMPOSE_FILE.read_text()
    assert "service_completed_successfully" in text
    broken.write_text(text.replace("service_completed_successfully", "service_finished"))
    result = _run_compose(docker_compose, broken, ENV_EXAMPLE, "config", "--quiet")
    assert result.returncode != 0
    assert "service_finished" in result.stderr


@pytest.mark.parametrize("missing", S3_KEYS)
def test_compose_refuses_to_start_without_an_s3_key(
    docker_compose: str, empty_env_file: Path, missing: str
) -> None:
    others = {name: OVERRIDES[name] for name in S3_KEYS if name != missing}
    result = _run_compose(docker_compose, COMPOSE_FILE, empty_env_file, "config", **others)
    assert result.returncode != 0
    assert f"set {missing} in .env (see .env.example)" in result.stderr


def test_env_example_documents_every_variable_compose_reads() -> None:
    documented = env_example()
    assert set(documented) == compose_variables()
    # Only the keys without a default are set; every other line shows a default, commented.
    assert {name for name, (_, is_set) in documented.items() if is_set} == set(S3_KEYS)
    for name in S3_KEYS:
        assert documented[name][0].startswith("change-me"), f"{name} is not a placeholder"
    assert len({documented[name][0] for name in S3_KEYS}) == len(S3_KEYS)


def test_env_example_defaults_are_the_settings_defaults(
    docker_compose: str, compose_default: dict[str, Any], tmp_path: Path
) -> None:
    # Every commented line uncommented (but the User-Agent, an example to adapt):
    # compose accepts it, the processes parse it, and nothing changes: the defaults the
    # file shows are the real ones.
    uncommented = tmp_path / "all.env"
    uncommented.write_text(
        "".join(
            f"{name}={value}\n"
            for name, (value, _) in env_example().items()
            if name != "USER_AGENT"
        )
    )
    config = _config(docker_compose, uncommented)
    for app, settings in (("monitor", MonitorSettings), ("worker", WorkerSettings)):
        example = settings.from_env(environment(config, app))
        assert example == settings.from_env(environment(compose_default, app)), app


def test_services_run_pinned_images_and_no_zookeeper(compose_default: dict[str, Any]) -> None:
    services = compose_default["services"]
    assert set(services) >= SERVICES
    for name, repository in PINNED_IMAGES.items():
        image = service(compose_default, name).get("image", "")
        assert image_repository(image) == repository, f"{name} runs {image!r}"
        assert image_tag(image) not in ("", "latest"), f"{name}'s image {image!r} is not pinned"
    assert re.fullmatch(r"[34]\.\d+(\.\d+)?", image_tag(service(compose_default, "kafka")["image"]))
    assert re.fullmatch(r"\d+\.\d+", image_tag(service(compose_default, "seaweedfs")["image"]))
    for name, spec in services.items():
        assert "zookeeper" not in name.lower()
        assert "zookeeper" not in str(spec.get("image", "")).lower(), name
        assert "minio" not in str(spec.get("image", "")).lower(), name


def test_kafka_is_a_single_kraft_node_that_is_health_checked(
    compose_default: dict[str, Any],
) -> None:
    env = environment(compose_default, "kafka")
    assert not [key for key in env if "ZOOKEEPER" in key]
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    node = env["KAFKA_NODE_ID"]
    assert f"{node}@kafka:" in env["KAFKA_CONTROLLER_QUORUM_VOTERS"]
    controller = env["KAFKA_CONTROLLER_LISTENER_NAMES"]
    assert f"{controller}://" in env["KAFKA_LISTENERS"]
    assert f"{controller}://" not in env["KAFKA_ADVERTISED_LISTENERS"]
    # One broker can hold one replica of the internal topics, no more.
    for key in (
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
    ):
        assert env[key] == "1", key
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "true"
    check = healthcheck_command(compose_default, "kafka")
    assert re.search(r"kafka-(broker-api-versions|topics)\.sh .*--bootstrap-server", check)
    # The data lives in a named volume, mounted where the broker writes its log.
    assert named_volumes_at(compose_default, "kafka", env["KAFKA_LOG_DIRS"])


def test_topics_created_on_first_use_keep_unread_urls(compose: dict[str, Any]) -> None:
    # inbound_images is auto-created: the broker's default must not delete it by age (or
    # by size), the same rule as the splitter's urls.{source} topics.
    env = environment(compose, "kafka")
    assert int(env["KAFKA_LOG_RETENTION_MS"]) == contract.URL_TOPIC_RETENTION_MS == -1
    assert not {"KAFKA_LOG_RETENTION_HOURS", "KAFKA_LOG_RETENTION_MINUTES"} & set(env)
    assert env.get("KAFKA_LOG_RETENTION_BYTES", "-1") == "-1"
    monitor = MonitorSettings.from_env(environment(compose, "monitor"))
    assert monitor.url_topic_retention_ms == contract.URL_TOPIC_RETENTION_MS


@pytest.mark.parametrize(
    ("name", "probe", "data"),
    [
        ("redis", r"redis-cli.*\bping\b", "/data"),
        ("seaweedfs", r"\bwget\b.*http://127\.0\.0\.1:8333/healthz", "/data"),
    ],
)
def test_stores_are_health_checked_and_keep_their_data(
    compose_default: dict[str, Any], name: str, probe: str, data: str
) -> None:
    assert re.search(probe, healthcheck_command(compose_default, name))
    assert named_volumes_at(compose_default, name, data)


def test_seaweedfs_keeps_everything_in_its_volume(compose_default: dict[str, Any]) -> None:
    # -dir holds the volumes, the master's state and (the image's filer.toml) the filer's.
    assert seaweedfs_flag(compose_default, "dir") == "/data"
    assert seaweedfs_flag(compose_default, "s3.port") == "8333"


def test_redis_is_append_only(compose_default: dict[str, Any]) -> None:
    words = command_text(compose_default, "redis").split()
    assert "--appendonly" in words
    assert words[words.index("--appendonly") + 1] == "yes"


def test_every_published_port_is_on_loopback(compose_default: dict[str, Any]) -> None:
    published = {
        name: published_ports(compose_default, name) for name in compose_default["services"]
    }
    for name, ports in published.items():
        for host_ip, _, _ in ports:
            assert host_ip == "127.0.0.1", f"{name} publishes on {host_ip or 'every address'}"
    assert ("127.0.0.1", 9100, METRICS_PORTS["monitor"]) in published["monitor"]
    assert ("127.0.0.1", 8333, 8333) in published["seaweedfs"]


def test_apps_reach_kafka_and_redis_by_service_name(compose: dict[str, Any]) -> None:
    kafka = environment(compose, "kafka")
    advertised = {
        listener.split("://", 1)[1] for listener in kafka["KAFKA_ADVERTISED_LISTENERS"].split(",")
    }
    for app in APPS:
        env = environment(compose, app)
        assert env["KAFKA_HOSTS"] == "kafka:9092"
        assert set(env["KAFKA_HOSTS"].split(",")) <= advertised
        redis = urlsplit(env["REDIS_URL"])
        assert (redis.scheme, redis.hostname, redis.port) == ("redis", "redis", 6379), app


def test_worker_writes_with_the_crawler_keys_where_createbucket_makes_the_bucket(
    compose: dict[str, Any],
) -> None:
    s3 = environment(compose, "seaweedfs")
    worker = environment(compose, "worker")
    createbucket = environment(compose, "createbucket")
    port = int(seaweedfs_flag(compose, "s3.port"))
    for env in (worker, createbucket):
        endpoint = urlsplit(env["S3_ENDPOINT_URL"])
        assert (endpoint.scheme, endpoint.hostname, endpoint.port) == ("http", "seaweedfs", port)
        assert env["S3_BUCKET"] == s3["S3_BUCKET"]
        assert env["AWS_DEFAULT_REGION"] == "us-east-1"
    assert (worker["AWS_ACCESS_KEY_ID"], worker["AWS_SECRET_ACCESS_KEY"]) == (
        s3["S3_CRAWLER_ACCESS_KEY"],
        s3["S3_CRAWLER_SECRET_KEY"],
    )
    assert (createbucket["AWS_ACCESS_KEY_ID"], createbucket["AWS_SECRET_ACCESS_KEY"]) == (
        s3["S3_ADMIN_ACCESS_KEY"],
        s3["S3_ADMIN_SECRET_KEY"],
    )
    assert worker["AWS_ACCESS_KEY_ID"] != createbucket["AWS_ACCESS_KEY_ID"]
    # createbucket runs the worker's image for its Python and botocore.
    assert service(compose, "createbucket")["build"] == service(compose, "worker")["build"]
    assert entrypoint(compose, "createbucket")[:2] == ["python", "-c"]


def test_operator_settings_reach_every_service(
    compose_default: dict[str, Any], compose_overridden: dict[str, Any]
) -> None:
    assert environment(compose_default, "worker")["S3_BUCKET"] == DEFAULT_BUCKET
    s3 = environment(compose_overridden, "seaweedfs")
    assert {name: s3[name] for name in OVERRIDES} == OVERRIDES
    for name in ("worker", "createbucket"):
        assert environment(compose_overridden, name)["S3_BUCKET"] == OVERRIDES["S3_BUCKET"]


def test_no_secret_is_written_into_a_command(compose_overridden: dict[str, Any]) -> None:
    # The keys reach the containers through their environment only; `$$` in the scripts
    # leaves the expansion to the container, so `config` and `ps` show no key.
    for name in compose_overridden["services"]:
        text = command_text(compose_overridden, name)
        for key in S3_KEYS:
            assert OVERRIDES[key] not in text, (name, key)


def test_monitor_reads_sources_and_starts_after_its_stores(compose_default: dict[str, Any]) -> None:
    env = environment(compose_default, "monitor")
    assert env["SOURCES_URL"].startswith("https://") or env.get("SOURCES_FILE")
    assert depends_on(compose_default, "monitor") == {
        "kafka": "service_healthy",
        "redis": "service_healthy",
    }


def test_worker_is_scalable_and_starts_when_everything_is_ready(
    compose_default: dict[str, Any],
) -> None:
    worker = service(compose_default, "worker")
    assert "container_name" not in worker
    assert not worker.get("ports")
    assert depends_on(compose_default, "worker") == {
        "kafka": "service_healthy",
        "redis": "service_healthy",
        "createbucket": "service_completed_successfully",
        "monitor": "service_healthy",
    }
    assert depends_on(compose_default, "createbucket") == {"seaweedfs": "service_healthy"}
    assert service(compose_default, "createbucket").get("restart") == "no"
    assert worker.get("restart") == "unless-stopped"


@pytest.mark.parametrize("app", sorted(APPS))
def test_apps_serve_metrics_and_are_health_checked_on_them(
    compose_default: dict[str, Any], app: str
) -> None:
    env = environment(compose_default, app)
    assert MetricsSettings.from_env(env).port == METRICS_PORTS[app]
    # The project's own check, which asks the process's /healthz on METRICS_PORT (or the
    # port of its range this container listens on).
    assert healthcheck_test(compose_default, app) == ["CMD", "python", "-m", healthcheck.__name__]
    assert "/healthz" in inspect.getsource(healthcheck)
    check = service(compose_default, app)["healthcheck"]
    assert duration_s(check["timeout"]) < duration_s(check["interval"])
    assert duration_s(check.get("start_period", "0s")) >= 30


def test_monitoring_is_an_optional_profile(compose_default: dict[str, Any]) -> None:
    for name, spec in compose_default["services"].items():
        expected = ["monitoring"] if name in MONITORING else None
        assert spec.get("profiles") == expected, name


def bind_sources(config: Mapping[str, Any], name: str) -> list[Path]:
    """The host paths a service bind-mounts (named volumes left out)."""
    sources = []
    for mount in service(config, name).get("volumes") or []:
        source = mount.split(":")[0] if isinstance(mount, str) else mount.get("source", "")
        if source.startswith(("/", ".")):
            sources.append(Path(source))
    return sources


@pytest.mark.parametrize("name", sorted(MONITORING))
def test_monitoring_mounts_what_the_repository_ships(
    compose_default: dict[str, Any], name: str
) -> None:
    sources = bind_sources(compose_default, name)
    assert sources
    for source in sources:
        path = source if source.is_absolute() else ROOT / source
        assert path.resolve().is_relative_to(ROOT / "deploy"), path
        assert path.exists(), f"{name} mounts {path}, which the repository does not have"


def test_prometheus_scrapes_the_monitor_and_every_worker() -> None:
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    static: set[str] = set()
    by_dns: set[tuple[str, int]] = set()
    for job in config["scrape_configs"]:
        for group in job.get("static_configs") or []:
            static |= set(group.get("targets") or [])
        for sd in job.get("dns_sd_configs") or []:
            by_dns |= {(name, int(sd.get("port", 0))) for name in sd.get("names") or []}
    assert f"monitor:{METRICS_PORTS['monitor']}" in static
    # Scaled workers share one service name: DNS returns every one of them.
    assert ("worker", METRICS_PORTS["worker"]) in by_dns, by_dns


def test_worker_gets_its_shutdown_grace_before_sigkill(compose_default: dict[str, Any]) -> None:
    grace_s = WorkerSettings.from_env(environment(compose_default, "worker")).shutdown_grace_s
    stop_s = duration_s(service(compose_default, "worker").get("stop_grace_period", "10s"))
    assert stop_s >= grace_s + 10, (stop_s, grace_s)


def test_app_environments_are_valid_settings(compose_default: dict[str, Any]) -> None:
    # The processes' own parsers: a value they reject would stop the container at start.
    monitor = MonitorSettings.from_env(environment(compose_default, "monitor"))
    assert monitor.kafka.bootstrap_servers == "kafka:9092"
    assert monitor.sources_url or monitor.sources_file
    worker = WorkerSettings.from_env(environment(compose_default, "worker"))
    assert worker.s3.endpoint_url == "http://seaweedfs:8333"
    assert worker.s3.bucket == DEFAULT_BUCKET
    assert worker.thumbnails.store == "s3"


@pytest.mark.parametrize("app", sorted(APPS))
def test_app_environment_is_documented(compose_default: dict[str, Any], app: str) -> None:
    """Every variable the compose file gives an app is in docs/configuration.md's table,
    under its current name, as read by that app (itself, or through a library it runs:
    the worker's AWS keys are botocore's)."""
    documented = variables()
    env = environment(compose_default, app)
    assert "KAFKA_HOSTS" in env and "KAFKA_HOSTS" in documented  # both were read
    deprecated = set(env) & set(RENAMED.values())
    assert not deprecated, f"deprecated names: {sorted(deprecated)}"
    undocumented = {name for name in env if name not in documented}
    assert not undocumented, f"not in docs/configuration.md: {sorted(undocumented)}"
    elsewhere = {name for name in env if not readers_in(app, documented[name])}
    assert not elsewhere, f"docs/configuration.md: not read by the {app}: {sorted(elsewhere)}"


# --- what the containers run, run here ----------------------------------------------------


async def _exit_status(command: list[str], env: Mapping[str, str]) -> int:
    process = await asyncio.create_subprocess_exec(
        *command,
        env={"PATH": os.environ.get("PATH", os.defpath), **env},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    return await asyncio.wait_for(process.wait(), PROBE_TIMEOUT_S)


@pytest.mark.parametrize("app", sorted(APPS))
async def test_app_health_check_follows_healthz(compose_default: dict[str, Any], app: str) -> None:
    # The check's own command, the image's `python` being this one, against the server
    # the processes run (image_crawler.metrics): healthy, unhealthy, not listening.
    command = [sys.executable, *healthcheck_test(compose_default, app)[2:]]
    problems: list[str] = []
    async with serving(0, "127.0.0.1", CollectorRegistry(), health=lambda: problems) as port:
        env = {"METRICS_PORT": str(port)}
        assert await _exit_status(command, env) == 0
        problems.append("kafka: away for 120 s")
        assert await _exit_status(command, env) == 1
    assert await _exit_status(command, env) == 1


@pytest.mark.parametrize("app", sorted(APPS))
async def test_app_health_check_follows_healthz_on_a_range(
    compose_default: dict[str, Any], app: str
) -> None:
    # Host networking: METRICS_PORT is a range, and the check asks the port of it that
    # this process (the container's, here) took.
    command = [sys.executable, *healthcheck_test(compose_default, app)[2:]]
    ports = free_port_range(2)
    env = {"METRICS_PORT": str(ports)}
    problems: list[str] = []
    async with serving(
        ports.first,
        "127.0.0.1",
        CollectorRegistry(),
        port_last=ports.last,
        health=lambda: problems,
    ) as port:
        assert port == ports.first
        assert await _exit_status(command, env) == 0
        problems.append("kafka: away for 120 s")
        assert await _exit_status(command, env) == 1
    assert await _exit_status(command, env) == 1


@pytest.fixture(scope="module")
def weed(compose_default: dict[str, Any]) -> str:
    """The ``weed`` binary of the release the compose file pins."""
    version = image_tag(service(compose_default, "seaweedfs")["image"])
    try:
        return find_or_install_weed(version)
    except NoWeed as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def seaweedfs(
    compose_overridden: dict[str, Any], weed: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ComposeSeaweedFS]:
    """The compose file's S3 server, started by its own entrypoint with an operator's keys."""
    server = ComposeSeaweedFS(
        entrypoint(compose_overridden, "seaweedfs"),
        environment(compose_overridden, "seaweedfs"),
        weed,
        work_dir=tmp_path_factory.mktemp("seaweedfs"),
    )
    with server.start():
        yield server


def _client(endpoint_url: str, access_key: str, secret_key: str) -> Any:
    return botocore.session.get_session().create_client(
        "s3",
        endpoint_url=endpoint_url,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name="us-east-1",
        config=Config(retries={"max_attempts": 1}),
    )


def _create_bucket(compose: Mapping[str, Any], endpoint_url: str, **change: str) -> dict[str, Any]:
    """The one-shot createbucket, its Python being this one; its JSON line."""
    env = {**environment(compose, "createbucket"), "S3_ENDPOINT_URL": endpoint_url, **change}
    result = subprocess.run(
        [sys.executable, *entrypoint(compose, "createbucket")[1:]],
        env={"PATH": os.environ.get("PATH", os.defpath), **env},
        capture_output=True,
        text=True,
        timeout=PROBE_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.splitlines()
    event = json.loads(line)
    assert isinstance(event, dict)
    return event


def test_s3_server_writes_both_identities_from_the_environment(
    seaweedfs: ComposeSeaweedFS,
) -> None:
    identities = json.loads(seaweedfs.identities_file.read_text())["identities"]
    by_name = {identity["name"]: identity for identity in identities}
    assert set(by_name) == {"admin", "crawler"}
    assert by_name["admin"]["credentials"] == [
        {
            "accessKey": OVERRIDES["S3_ADMIN_ACCESS_KEY"],
            "secretKey": OVERRIDES["S3_ADMIN_SECRET_KEY"],
        }
    ]
    bucket = OVERRIDES["S3_BUCKET"]
    assert sorted(by_name["crawler"]["actions"]) == [
        f"List:{bucket}",
        f"Read:{bucket}",
        f"Write:{bucket}",
    ]
    assert seaweedfs.identities_file.stat().st_mode & 0o077 == 0


def test_createbucket_makes_the_bucket_once_with_the_admin_keys(
    compose_overridden: dict[str, Any], seaweedfs: ComposeSeaweedFS
) -> None:
    # A bucket of its own, so that the other tests' calls cannot have made it first.
    bucket = "made-once"
    first = _create_bucket(compose_overridden, seaweedfs.endpoint_url, S3_BUCKET=bucket)
    assert first == {"event": "bucket_ready", "bucket": bucket, "created": True}
    # A restart of the stack runs it again: the bucket is there, and that is success.
    again = _create_bucket(compose_overridden, seaweedfs.endpoint_url, S3_BUCKET=bucket)
    assert again == {"event": "bucket_ready", "bucket": bucket, "created": False}
    # The crawler's keys cannot do the same: createbucket needs the admin's.
    worker = environment(compose_overridden, "worker")
    crawler_keys = {
        "AWS_ACCESS_KEY_ID": worker["AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": worker["AWS_SECRET_ACCESS_KEY"],
    }
    env = {
        **environment(compose_overridden, "createbucket"),
        **crawler_keys,
        "S3_ENDPOINT_URL": seaweedfs.endpoint_url,
        "S3_BUCKET": "crawler-made",
    }
    refused = subprocess.run(
        [sys.executable, *entrypoint(compose_overridden, "createbucket")[1:]],
        env={"PATH": os.environ.get("PATH", os.defpath), **env},
        capture_output=True,
        text=True,
        timeout=PROBE_TIMEOUT_S,
        check=False,
    )
    assert refused.returncode != 0
    assert "AccessDenied" in refused.stderr


def test_crawler_keys_reach_the_bucket_and_nothing_else(
    compose_overridden: dict[str, Any], seaweedfs: ComposeSeaweedFS
) -> None:
    bucket = OVERRIDES["S3_BUCKET"]
    _create_bucket(compose_overridden, seaweedfs.endpoint_url)
    worker = environment(compose_overridden, "worker")
    admin = _client(
        seaweedfs.endpoint_url, OVERRIDES["S3_ADMIN_ACCESS_KEY"], OVERRIDES["S3_ADMIN_SECRET_KEY"]
    )
    crawler = _client(
        seaweedfs.endpoint_url, worker["AWS_ACCESS_KEY_ID"], worker["AWS_SECRET_ACCESS_KEY"]
    )
    with contextlib.closing(admin), contextlib.closing(crawler):
        with contextlib.suppress(admin.exceptions.BucketAlreadyOwnedByYou):
            admin.create_bucket(Bucket="someone-elses")
        admin.put_object(Bucket="someone-elses", Key="private.jpg", Body=b"theirs")

        crawler.put_object(Bucket=bucket, Key="a.jpg", Body=b"ours")
        assert crawler.get_object(Bucket=bucket, Key="a.jpg")["Body"].read() == b"ours"
        listed = crawler.list_objects_v2(Bucket=bucket)
        assert "a.jpg" in {o["Key"] for o in listed.get("Contents", [])}

        refused = {
            "put elsewhere": lambda: crawler.put_object(
                Bucket="someone-elses", Key="b.jpg", Body=b"x"
            ),
            "read elsewhere": lambda: crawler.get_object(Bucket="someone-elses", Key="private.jpg"),
            "list elsewhere": lambda: crawler.list_objects_v2(Bucket="someone-elses"),
            "create a bucket": lambda: crawler.create_bucket(Bucket="crawler-made"),
            "delete the bucket": lambda: crawler.delete_bucket(Bucket=bucket),
        }
        for what, call in refused.items():
            with pytest.raises(ClientError) as denied:
                call()
            assert denied.value.response["Error"]["Code"] == "AccessDenied", what


async def test_worker_store_writes_thumbnails_with_the_compose_settings(
    compose_overridden: dict[str, Any], seaweedfs: ComposeSeaweedFS
) -> None:
    # The worker's own S3 store, configured from the worker service's environment (the
    # endpoint moved to the local server): a thumbnail lands; another bucket is refused.
    _create_bucket(compose_overridden, seaweedfs.endpoint_url)
    env = {**environment(compose_overridden, "worker"), "S3_ENDPOINT_URL": seaweedfs.endpoint_url}
    credentials = AioCredentials(env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"])
    settings = S3Settings.from_env(env)
    elsewhere = S3Settings.from_env({**env, "S3_BUCKET": "someone-elses"})
    async with aiohttp.ClientSession() as http:
        await SignedS3Store(settings, credentials, http).put("uuid-1.jpg", b"\xff\xd8thumb")
        with pytest.raises(DependencyError, match="403"):
            await SignedS3Store(elsewhere, credentials, http).put("uuid-2.jpg", b"\xff\xd8")
    admin = _client(
        seaweedfs.endpoint_url, OVERRIDES["S3_ADMIN_ACCESS_KEY"], OVERRIDES["S3_ADMIN_SECRET_KEY"]
    )
    with contextlib.closing(admin):
        body = admin.get_object(Bucket=settings.bucket, Key="uuid-1.jpg")["Body"].read()
    assert body == b"\xff\xd8thumb"


def test_s3_server_health_check_asks_the_gateway(
    compose_overridden: dict[str, Any], seaweedfs: ComposeSeaweedFS
) -> None:
    test = healthcheck_test(compose_overridden, "seaweedfs")
    if shutil.which(test[1]) is None:
        pytest.skip(f"{test[1]} is not installed here")
    command = [word.replace(":8333/", f":{seaweedfs.port}/") for word in test[1:]]
    assert command != test[1:], "the check does not ask port 8333"
    assert subprocess.run(command, timeout=PROBE_TIMEOUT_S, check=False).returncode == 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({}, "the ones from .env.example are placeholders"),
        ({"S3_CRAWLER_SECRET_KEY": 'quote"d'}, "may contain only letters, digits"),
        ({"S3_ADMIN_SECRET_KEY": "back\\slash"}, "may contain only letters, digits"),
        ({"S3_CRAWLER_ACCESS_KEY": OVERRIDES["S3_ADMIN_ACCESS_KEY"]}, "must differ"),
        ({"S3_BUCKET": "Not_A_Bucket"}, "is not a bucket name"),
    ],
)
def test_s3_server_refuses_unsafe_keys_before_starting(
    compose_default: dict[str, Any],
    tmp_path: Path,
    change: dict[str, str],
    message: str,
) -> None:
    # {} is .env.example as it is; the others start from an operator's good keys.
    env = environment(compose_default, "seaweedfs")
    if change:
        env = {**env, **OVERRIDES, **change}
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    started = tmp_path / "started"
    (bin_dir / "weed").write_text(f"#!/bin/sh\ntouch {started}\n")
    (bin_dir / "weed").chmod(0o755)
    result = subprocess.run(
        entrypoint(compose_default, "seaweedfs"),
        env={**env, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=PROBE_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert not started.exists()
    assert not (tmp_path / "s3-identities.json").exists()


# --- the Dockerfiles --------------------------------------------------------------------


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` in order, continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, arguments = (pending + line).partition(" ")
        instructions.append((keyword.upper(), arguments.strip()))
        pending = ""
    return instructions


def final_stage(instructions: list[tuple[str, str]]) -> list[tuple[str, str]]:
    starts = [i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM"]
    assert starts, "no FROM"
    return instructions[starts[-1] :]


@pytest.mark.parametrize(("app", "module"), sorted(APPS.items()))
def test_app_image_runs_its_module_as_an_unprivileged_user(
    compose_default: dict[str, Any], app: str, module: str
) -> None:
    build = service(compose_default, app).get("build")
    assert isinstance(build, dict), f"{app} is not built from this repository"
    assert Path(build["context"]).resolve() == ROOT
    assert build.get("dockerfile") == f"Dockerfile-{app}"
    assert (ROOT / module / "__main__.py").is_file()

    instructions = dockerfile_instructions(ROOT / build["dockerfile"])
    for keyword, arguments in instructions:
        if keyword == "FROM":
            assert re.match(r"python:3\.11-slim(-\w+)?(@\S+)?(\s|$)", arguments), arguments
    stage = final_stage(instructions)
    arguments_of = {keyword: arguments for keyword, arguments in stage}  # the last of each
    assert json.loads(arguments_of["ENTRYPOINT"]) == ["python", "-m", module]
    assert "USER" in arguments_of, "the final stage runs as root"
    assert arguments_of["USER"].split(":")[0] not in ("root", "0")
    assert arguments_of.get("STOPSIGNAL") == "SIGTERM"
    installs = " ".join(a for k, a in stage if k == "RUN")
    assert not re.search(r"\b(gcc|g\+\+|build-essential|make|pip)\b", installs), installs


@pytest.mark.parametrize("app", sorted(APPS))
def test_app_image_installs_the_pinned_versions(app: str) -> None:
    # Every pip install of the project is constrained by constraints.txt, copied first
    # (test_dependencies.py checks the file itself).
    instructions = dockerfile_instructions(ROOT / f"Dockerfile-{app}")
    copied_at = [
        i
        for i, (keyword, arguments) in enumerate(instructions)
        if keyword == "COPY" and "constraints.txt" in arguments.split()[:-1]
    ]
    installs = [
        (i, arguments)
        for i, (keyword, arguments) in enumerate(instructions)
        if keyword == "RUN" and re.search(r"\bpip\b.*\binstall\b", arguments)
    ]
    assert copied_at and installs
    for i, arguments in installs:
        assert re.search(r"(^|\s)(-c|--constraint)[ =]constraints\.txt(\s|$)", arguments), arguments
        assert min(copied_at) < i


# --- the build context ------------------------------------------------------------------


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as a regex: ``*`` stays in one path segment, ``**`` spans."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and "]" in pattern[i:]:
            end = pattern.index("]", i)
            out.append(pattern[i : end + 1])
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out))


def dockerignored(path: str, lines: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path, or a directory above it, wins."""
    parts = path.split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    ignored = False
    for line in lines:
        pattern = line.strip()
        if not pattern or pattern.startswith("#"):
            continue
        keep = pattern.startswith("!")
        regex = _glob_regex(pattern.removeprefix("!").strip().strip("/"))
        if any(regex.fullmatch(candidate) for candidate in candidates):
            ignored = not keep
    return ignored


def copied_sources() -> Iterator[str]:
    """Every build-context path the Dockerfiles COPY (not those copied between stages)."""
    for dockerfile in sorted(ROOT.glob("Dockerfile-*")):
        for keyword, arguments in dockerfile_instructions(dockerfile):
            words = arguments.split()
            if keyword in ("COPY", "ADD") and not any(w.startswith("--from") for w in words):
                yield from (w.rstrip("/") for w in words[:-1] if not w.startswith("--"))


def test_build_context_has_what_the_images_copy_and_nothing_else() -> None:
    lines = DOCKERIGNORE.read_text().splitlines()
    sources = set(copied_sources())
    assert {"pyproject.toml", "README.md", *APPS.values()} <= sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not dockerignored(source, lines), f"{source} is copied but .dockerignore drops it"
    for package in sorted(p for p in sources if (ROOT / p).is_dir()):
        for module in (ROOT / package).rglob("*.py"):
            relative = module.relative_to(ROOT).as_posix()
            assert not dockerignored(relative, lines), relative
    for path in (
        ".venv/bin/python",
        ".git/HEAD",
        "test/test_compose.py",
        "local/thumbnails/x.jpg",
        "worker/__pycache__",
        "worker/__pycache__/scheduler.cpython-311.pyc",
        "crawl_monitor/stray.pyc",
        "image_crawler.egg-info/PKG-INFO",
        ".mypy_cache/3.11/cache.db",
    ):
        assert dockerignored(path, lines), f".dockerignore lets {path} into the build context"
