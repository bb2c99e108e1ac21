"""The monitoring profile's files: Prometheus's scrape config and Grafana's dashboard.

Each file parses; Prometheus scrapes the monitor and the workers on the ports the compose
file gives them; Grafana's provisioning points at that Prometheus and at the folder the
compose file mounts the dashboard in; and every metric the dashboard queries is one the
crawler exposes: the workers' as ``worker/metrics.py`` defines them, the monitor's as
the issue's design names them (and ``crawl_monitor/metrics.py`` writes them).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

import worker.metrics

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"
DATASOURCES = DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
PROVIDERS = DEPLOY / "grafana" / "provisioning" / "dashboards" / "image-crawler.yml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "image-crawler.json"
COMPOSE = ROOT / "docker-compose.yml"
MONITOR_SOURCE = ROOT / "crawl_monitor" / "metrics.py"

# The monitor's samples, as the design fixes their names.
MONITOR_SAMPLES = frozenset(
    {
        "crawler_source_configured_requests_per_second",
        "crawler_source_effective_requests_per_second",
        "crawler_source_backlog_urls",
        "crawler_source_eta_seconds",
        "crawler_source_halted",
        "crawler_source_permanently_halted",
        "crawler_source_successes_total",
        "crawler_source_errors_total",
        "crawler_source_rechecks_total",
        "crawler_successes_total",
        "crawler_errors_total",
        "crawler_split_total",
        "crawler_backlog_urls",
        "crawler_eta_seconds",
        "crawler_sources",
        "crawler_backlog_measured_timestamp_seconds",
        "crawler_monitor_loop_seconds_bucket",
        "crawler_monitor_loop_seconds_sum",
        "crawler_monitor_loop_seconds_count",
    }
)
# What the issue asks the metrics to show, each on the dashboard.
REQUIRED = frozenset(
    {
        "crawler_outcomes_total",
        "crawler_requests_total",
        "crawler_downloaded_bytes_total",
        "crawler_urls_lost_total",
        "crawler_tasks_in_flight",
        "crawler_image_pool_queue",
        "crawler_dependency_up",
        "crawler_dependency_outages_total",
        "crawler_source_configured_requests_per_second",
        "crawler_source_effective_requests_per_second",
        "crawler_source_backlog_urls",
        "crawler_source_eta_seconds",
        "crawler_source_halted",
        "crawler_monitor_loop_seconds_bucket",
        # Issue 30: re-checks by status.
        "crawler_source_rechecks_total",
    }
)
SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("_sum", "_count", ""),
}


def worker_samples() -> set[str]:
    """The sample names of every metric ``worker/metrics.py`` defines."""
    names = set()
    for value in vars(worker.metrics).values():
        if isinstance(value, MetricWrapperBase):
            for family in value.describe():
                names.update(family.name + suffix for suffix in SUFFIXES[family.type])
    return names


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    services: dict[str, Any] = load_yaml(COMPOSE)["services"]
    return services


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in panels(dashboard) for t in p.get("targets", [])]


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """A service's bind mounts: host path (as written) -> container path."""
    found = {}
    for volume in service.get("volumes", []):
        host, container, *_ = volume.split(":")
        found[host] = container
    return found


def test_the_monitor_samples_named_by_the_design_are_the_ones_it_writes() -> None:
    source = MONITOR_SOURCE.read_text()
    for sample in MONITOR_SAMPLES:
        family = re.sub(r"(_total|_bucket|_sum|_count)$", "", sample)
        assert f'"{family}"' in source, sample


def test_prometheus_scrapes_the_monitor_and_every_worker_on_their_metrics_ports(
    compose: dict[str, Any],
) -> None:
    config = load_yaml(PROMETHEUS)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"monitor", "worker"}
    monitor_port = int(compose["monitor"]["environment"]["METRICS_PORT"])
    worker_port = int(compose["worker"]["environment"]["METRICS_PORT"])
    assert jobs["monitor"]["static_configs"] == [{"targets": [f"monitor:{monitor_port}"]}]
    # Scaled workers share the service name, which resolves to each one's address.
    assert jobs["worker"]["dns_sd_configs"] == [
        {"names": ["worker"], "type": "A", "port": worker_port, "refresh_interval": "30s"}
    ]
    assert all(job.get("metrics_path", "/metrics") == "/metrics" for job in jobs.values())

    prometheus = compose["prometheus"]
    assert prometheus["profiles"] == ["monitoring"]
    config_file = next(
        a.split("=", 1)[1] for a in prometheus["command"] if a.startswith("--config.file=")
    )
    assert mounts(prometheus)["./deploy/prometheus/prometheus.yml"] == config_file


def test_grafana_reads_that_prometheus_and_the_mounted_dashboard(
    compose: dict[str, Any], dashboard: dict[str, Any]
) -> None:
    (datasource,) = load_yaml(DATASOURCES)["datasources"]
    assert datasource["type"] == "prometheus"
    assert datasource["url"] == "http://prometheus:9090"
    assert "prometheus" in compose
    scrape_interval = load_yaml(PROMETHEUS)["global"]["scrape_interval"]
    assert datasource["jsonData"]["timeInterval"] == scrape_interval

    (provider,) = load_yaml(PROVIDERS)["providers"]
    grafana = compose["grafana"]
    assert grafana["profiles"] == ["monitoring"]
    volumes = mounts(grafana)
    assert volumes["./deploy/grafana/dashboards"] == provider["options"]["path"]
    assert volumes["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"

    # The dashboard's data source variable defaults to the provisioned one.
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["current"]["value"] == datasource["uid"]


def test_every_metric_the_dashboard_queries_is_one_the_crawler_exposes(
    dashboard: dict[str, Any],
) -> None:
    exposed = worker_samples() | MONITOR_SAMPLES
    used = {name for expr in exprs(dashboard) for name in re.findall(r"\bcrawler_\w+", expr)}
    assert used - exposed == set()
    assert REQUIRED - used == set()
    for expr in exprs(dashboard):
        # Outside the crawler's own, only Prometheus's `up` is selected by labels.
        selected = set(re.findall(r"(\w+)\{", expr))
        assert {n for n in selected if not n.startswith("crawler_")} <= {"up"}, expr
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), expr
        assert expr.count("[") == expr.count("]"), expr


def test_the_dashboard_panels_use_the_data_source_variable_and_do_not_overlap(
    dashboard: dict[str, Any],
) -> None:
    assert dashboard["uid"] == "image-crawler"
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for panel in panels(dashboard):
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, (panel["title"], cells.get((x, y)))
                cells[x, y] = panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"], panel["title"]
            # A legend names only labels the query keeps.
            kept = re.findall(r"by \(([^)]*)\)", target["expr"])
            labels = {label.strip() for group in kept for label in group.split(",")}
            assert set(re.findall(r"\{\{(\w+)\}\}", target["legendFormat"])) <= labels
