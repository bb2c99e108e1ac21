"""The deployment files as operators use them.

``docker-compose.yml`` is parsed, interpolated and validated against the Compose schema by
a real implementation, docker-compose 1.29 (its ``config`` command needs no Docker
engine), and the normalised result is checked against the contract: the services and
their official images, KRaft, health checks, and environments that point each process at
the right service, consistently, also when an operator overrides the bucket and
credentials. The Dockerfiles and ``.dockerignore`` are checked as text.

docker-compose is taken from PATH or, when running as root on Debian (as CI does),
installed once per session with apt-get.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from crawl_monitor.settings import MonitorSettings
from image_crawler.config import RENAMED
from worker.settings import WorkerSettings

pytestmark = [
    pytest.mark.integration,
    # The first test may wait for `apt-get update` and `apt-get install docker-compose`.
    pytest.mark.timeout(600),
]

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "docker-compose.yml"
README = ROOT / "README.md"
DOCKERIGNORE = ROOT / ".dockerignore"

OFFICIAL_IMAGES = {
    "kafka": "apache/kafka",
    "redis": "redis",
    "minio": "minio/minio",
    "createbucket": "minio/mc",
}
# service -> the module its container runs with `python -m`, as in the contract.
APPS = {"monitor": "crawl_monitor", "worker": "worker"}
SERVICES = set(OFFICIAL_IMAGES) | set(APPS)
DEFAULT_BUCKET = "cc-image-analysis"  # the contract's default S3_BUCKET
# What an operator might put in `.env`; every value differs from the file's defaults.
OVERRIDES = {
    "MINIO_ROOT_USER": "crawler-operator",
    "MINIO_ROOT_PASSWORD": "not-the-default-secret",
    "S3_BUCKET": "thumbnails-under-test",
}

APT_TIMEOUT_S = 240
CONFIG_TIMEOUT_S = 60


# --- docker-compose ----------------------------------------------------------------------


def _apt_get(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["apt-get", "-q", "-o", "DPkg::Lock::Timeout=60", *args],
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        capture_output=True,
        text=True,
        timeout=APT_TIMEOUT_S,
        check=False,
    )


@pytest.fixture(scope="session")
def docker_compose() -> str:
    """The docker-compose executable: from PATH, else installed with apt-get as root."""
    found = shutil.which("docker-compose")
    if found is not None:
        return found
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        pytest.skip(
            "docker-compose is not on PATH and cannot be installed here (needs root and "
            "apt-get): apt-get install docker-compose, or put it on PATH"
        )
    # Recommends would pull in the Docker engine; `config` needs only the Python tool.
    install = ("install", "-y", "--no-install-recommends", "docker-compose")
    result = _apt_get(*install)
    if result.returncode != 0:
        # A fresh machine may have no package lists yet: fetch them once, try again.
        _apt_get("update")
        result = _apt_get(*install)
    found = shutil.which("docker-compose")
    if result.returncode != 0 or found is None:
        pytest.skip(
            "docker-compose is not on PATH and `apt-get install docker-compose` failed: "
            + (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        )
    return found


def _run_compose(
    docker_compose: str, compose_file: Path, env_file: Path, *args: str, **variables: str
) -> subprocess.CompletedProcess[str]:
    # A minimal environment and an empty env file: what is checked is the file's own
    # defaults plus exactly `variables`, never the caller's shell or a stray `.env`.
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
def compose_default(docker_compose: str, empty_env_file: Path) -> dict[str, Any]:
    """``docker-compose config`` with nothing set: the defaults an operator gets."""
    return _config(docker_compose, empty_env_file)


@pytest.fixture(scope="session")
def compose_overridden(docker_compose: str, empty_env_file: Path) -> dict[str, Any]:
    """``docker-compose config`` with the bucket and MinIO credentials set (``OVERRIDES``)."""
    return _config(docker_compose, empty_env_file, **OVERRIDES)


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


def healthcheck_command(config: Mapping[str, Any], name: str) -> str:
    check = service(config, name).get("healthcheck")
    assert check, f"{name} has no healthcheck"
    assert not check.get("disable"), f"{name}'s healthcheck is disabled"
    test = check.get("test")
    assert test, f"{name}'s healthcheck has no test"
    if isinstance(test, str):
        return test
    assert test[0] in ("CMD", "CMD-SHELL"), f"{name}'s healthcheck test is {test!r}"
    return " ".join(test[1:])


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


def depends_on(config: Mapping[str, Any], name: str) -> dict[str, str]:
    """Dependency -> condition; the short (list) form means ``service_started``."""
    deps = service(config, name).get("depends_on") or {}
    if isinstance(deps, list):
        return dict.fromkeys(deps, "service_started")
    return {dep: (spec or {}).get("condition", "service_started") for dep, spec in deps.items()}


def command_text(config: Mapping[str, Any], name: str) -> str:
    """Entrypoint and command as one string, with compose's ``$$`` escapes undone."""
    spec = service(config, name)
    words: list[str] = []
    for key in ("entrypoint", "command"):
        value = spec.get(key) or []
        words.extend([value] if isinstance(value, str) else value)
    return " ".join(words).replace("$$", "$")


def expand(text: str, env: Mapping[str, str]) -> str:
    """What the container's shell makes of ``$NAME`` / ``${NAME}`` given its environment."""
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: env.get(m.group(1), ""), text)


def created_bucket(config: Mapping[str, Any]) -> str:
    """The bucket ``createbucket`` makes, after asserting its alias is MinIO as root."""
    text = command_text(config, "createbucket")
    env = environment(config, "createbucket")
    alias = re.search(r"mc\s+alias\s+set\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)", text)
    assert alias, f"createbucket sets no mc alias: {text!r}"
    alias_name, url, user, password = (expand(w.strip("\"'"), env) for w in alias.groups())
    endpoint = urlsplit(url)
    assert (endpoint.hostname, endpoint.port) == ("minio", 9000), url
    minio = environment(config, "minio")
    assert (user, password) == (minio["MINIO_ROOT_USER"], minio["MINIO_ROOT_PASSWORD"])
    made = re.search(r"mc\s+mb\s+(?:--?[\w-]+\s+)*(\S+)", text)
    assert made, f"createbucket makes no bucket: {text!r}"
    target = expand(made.group(1).strip("\"'"), env)
    prefix = f"{alias_name}/"
    assert target.startswith(prefix), f"mc mb {target!r} is not on alias {alias_name!r}"
    bucket = target.removeprefix(prefix)
    assert bucket, "createbucket's bucket name is empty"
    return bucket


def duration_s(value: Any) -> float:
    """Compose durations: ``45s``, ``1m30s``, ``1h``, ``500ms``; a bare number is seconds."""
    if isinstance(value, int | float):
        return float(value)
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", str(value))
    assert parts and "".join(n + u for n, u in parts) == str(value), f"duration {value!r}"
    return sum(float(n) * units[u] for n, u in parts)


# --- the compose file -------------------------------------------------------------------


def test_docker_compose_validates_the_file(docker_compose: str, empty_env_file: Path) -> None:
    result = _run_compose(docker_compose, COMPOSE_FILE, empty_env_file, "config", "--quiet")
    assert result.returncode == 0, result.stderr
    services = _run_compose(docker_compose, COMPOSE_FILE, empty_env_file, "config", "--services")
    assert set(services.stdout.split()) >= SERVICES


def test_docker_compose_rejects_what_the_schema_forbids(
    docker_compose: str, empty_env_file: Path, tmp_path: Path
) -> None:
    # The control for the test above: `config` is a schema check, not a YAML load.
    broken = tmp_path / "docker-compose.yml"
    text = COMPOSE_FILE.read_text()
    assert "service_completed_successfully" in text
    broken.write_text(text.replace("service_completed_successfully", "service_finished"))
    result = _run_compose(docker_compose, broken, empty_env_file, "config", "--quiet")
    assert result.returncode != 0
    assert "service_finished" in result.stderr


def test_services_run_official_images_and_no_zookeeper(compose_default: dict[str, Any]) -> None:
    services = compose_default["services"]
    assert set(services) >= SERVICES
    for name, repository in OFFICIAL_IMAGES.items():
        image = service(compose_default, name).get("image", "")
        assert image_repository(image) == repository, f"{name} runs {image!r}"
        assert image_tag(image) not in ("", "latest"), f"{name}'s image {image!r} is not pinned"
    assert re.fullmatch(r"[34]\.\d+(\.\d+)?", image_tag(service(compose_default, "kafka")["image"]))
    for name, spec in services.items():
        assert "zookeeper" not in name.lower()
        assert "zookeeper" not in str(spec.get("image", "")).lower(), name


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


@pytest.mark.parametrize(
    ("name", "probe"),
    [("redis", r"redis-cli.*\bping\b"), ("minio", r"\bmc ready\b|/minio/health/")],
)
def test_stores_are_health_checked_and_keep_their_data(
    compose_default: dict[str, Any], name: str, probe: str
) -> None:
    assert re.search(probe, healthcheck_command(compose_default, name))
    assert named_volumes_at(compose_default, name, "/data")


def test_redis_is_append_only(compose_default: dict[str, Any]) -> None:
    words = command_text(compose_default, "redis").split()
    assert "--appendonly" in words
    assert words[words.index("--appendonly") + 1] == "yes"


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


def test_worker_writes_to_the_bucket_createbucket_makes(compose: dict[str, Any]) -> None:
    env = environment(compose, "worker")
    endpoint = urlsplit(env["S3_ENDPOINT_URL"])
    assert (endpoint.scheme, endpoint.hostname, endpoint.port) == ("http", "minio", 9000)
    assert "--address" not in command_text(compose, "minio")  # the S3 API stays on 9000
    assert env["S3_BUCKET"] == created_bucket(compose)
    minio = environment(compose, "minio")
    assert env["AWS_ACCESS_KEY_ID"] == minio["MINIO_ROOT_USER"]
    assert env["AWS_SECRET_ACCESS_KEY"] == minio["MINIO_ROOT_PASSWORD"]
    assert env["AWS_DEFAULT_REGION"]


def test_operator_settings_reach_every_service(
    compose_default: dict[str, Any], compose_overridden: dict[str, Any]
) -> None:
    assert environment(compose_default, "worker")["S3_BUCKET"] == DEFAULT_BUCKET
    worker = environment(compose_overridden, "worker")
    minio = environment(compose_overridden, "minio")
    assert worker["S3_BUCKET"] == OVERRIDES["S3_BUCKET"]
    assert created_bucket(compose_overridden) == OVERRIDES["S3_BUCKET"]
    assert minio["MINIO_ROOT_USER"] == worker["AWS_ACCESS_KEY_ID"] == OVERRIDES["MINIO_ROOT_USER"]
    assert (
        minio["MINIO_ROOT_PASSWORD"]
        == worker["AWS_SECRET_ACCESS_KEY"]
        == OVERRIDES["MINIO_ROOT_PASSWORD"]
    )


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
        "monitor": "service_started",
    }
    assert depends_on(compose_default, "createbucket") == {"minio": "service_healthy"}
    assert worker.get("restart") == "unless-stopped"


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
    assert worker.s3.endpoint_url == "http://minio:9000"
    assert worker.s3.bucket == DEFAULT_BUCKET
    assert worker.thumbnails.store == "s3"


def readme_configuration_names() -> set[str]:
    """The variables in the first column of the README's Configuration table."""
    section = re.search(r"^## Configuration\n(.*?)(?=^## |\Z)", README.read_text(), re.M | re.S)
    assert section, "README.md has no '## Configuration' section"
    names: set[str] = set()
    for line in section.group(1).splitlines():
        if line.startswith("|"):
            names |= set(re.findall(r"`([A-Z][A-Z0-9_]*)`", line.split("|")[1]))
    return names


@pytest.mark.parametrize("app", sorted(APPS))
def test_app_environment_is_documented(compose_default: dict[str, Any], app: str) -> None:
    documented = readme_configuration_names()
    assert "KAFKA_HOSTS" in documented  # the parser found the table
    undocumented = set(environment(compose_default, app)) - documented
    assert not undocumented, f"not in README.md's Configuration table: {sorted(undocumented)}"
    deprecated = set(environment(compose_default, app)) & set(RENAMED.values())
    assert not deprecated, f"deprecated names: {sorted(deprecated)}"


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
