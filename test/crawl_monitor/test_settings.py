"""The monitor's settings from the environment, and its exit status on bad ones."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from crawl_monitor.policy.adaptive import AdaptiveSettings
from crawl_monitor.settings import MonitorSettings
from image_crawler.config import ConfigError, DeprecatedSetting

ROOT = Path(__file__).resolve().parents[2]


def test_defaults():
    settings = MonitorSettings.from_env({})
    assert settings.kafka.bootstrap_servers == "kafka:9092"
    assert settings.redis.url == "redis://redis:6379/0"
    assert settings.sources_file is None and settings.sources_url is None
    assert settings.log_frequency_s == 5.0
    assert settings.sources_refresh_s == 1800.0
    assert settings.source_topic_partitions == 4
    assert settings.pace_rate_ttl_ms == 1500
    assert settings.leader_lease_ms == 3000
    assert settings.refill_period_s == 1.0
    assert settings.backoff == AdaptiveSettings(
        floor_rps=0.1, decrease_factor=0.7, increase_share_per_s=0.01, cooldown_s=1.0
    )
    assert settings.log_level == "INFO"


def test_every_variable(tmp_path):
    sources = tmp_path / "sources.json"
    sources.write_text("[]")
    settings = MonitorSettings.from_env(
        {
            "KAFKA_HOSTS": "k1:9092,k2:9092",
            "REDIS_HOST": "cache",
            "REDIS_PORT": "6380",
            "SOURCES_FILE": str(sources),
            "SOURCES_URL": "https://api.openverse.org/v1/images/stats/",
            "LOG_FREQUENCY_S": "2.5",
            "SOURCES_REFRESH_S": "60",
            "SOURCES_TIMEOUT_S": "3",
            "SOURCE_TOPIC_PARTITIONS": "8",
            "SOURCE_TOPIC_REPLICATION_FACTOR": "3",
            "SPLITTER_BATCH_SIZE": "100",
            "PACE_RATE_TTL_MS": "1200",
            "LEADER_LEASE_MS": "5000",
            "REDIS_TIMEOUT_S": "2",
            "LOG_LEVEL": "debug",
            "BACKOFF_FLOOR_RPS": "0.5",
            "BACKOFF_DECREASE_FACTOR": "0.5",
            "BACKOFF_INCREASE_SHARE_PER_S": "0.05",
            "BACKOFF_COOLDOWN_S": "3",
        }
    )
    assert settings.kafka.bootstrap_servers == "k1:9092,k2:9092"
    assert settings.redis.url == "redis://cache:6380/0"
    assert settings.sources_file == sources
    assert settings.sources_url == "https://api.openverse.org/v1/images/stats/"
    assert settings.log_frequency_s == 2.5
    assert settings.sources_refresh_s == 60.0
    assert settings.sources_timeout_s == 3.0
    assert settings.source_topic_partitions == 8
    assert settings.source_topic_replication_factor == 3
    assert settings.splitter_batch_size == 100
    assert settings.pace_rate_ttl_ms == 1200
    assert settings.leader_lease_ms == 5000
    assert settings.redis_timeout_s == 2.0
    assert settings.log_level == "DEBUG"
    assert settings.backoff == AdaptiveSettings(
        floor_rps=0.5, decrease_factor=0.5, increase_share_per_s=0.05, cooldown_s=3.0
    )


def test_redis_url_beats_host_and_port():
    settings = MonitorSettings.from_env({"REDIS_URL": "redis://r:1/2", "REDIS_HOST": "x"})
    assert settings.redis.url == "redis://r:1/2"


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"LOG_FREQUENCY_S": "often"}, "LOG_FREQUENCY_S"),
        ({"LOG_FREQUENCY_S": "0"}, "LOG_FREQUENCY_S"),
        ({"SOURCES_REFRESH_S": "-5"}, "SOURCES_REFRESH_S"),
        ({"SOURCE_TOPIC_PARTITIONS": "0"}, "SOURCE_TOPIC_PARTITIONS"),
        ({"SOURCE_TOPIC_PARTITIONS": "2.5"}, "SOURCE_TOPIC_PARTITIONS"),
        ({"PACE_RATE_TTL_MS": "500"}, "PACE_RATE_TTL_MS"),
        ({"PACE_RATE_TTL_MS": "1.5s"}, "PACE_RATE_TTL_MS"),
        # The leader renews once a refill: a shorter lease lapses between its own loops.
        ({"LEADER_LEASE_MS": "1500"}, "LEADER_LEASE_MS"),
        ({"LEADER_LEASE_MS": "soon"}, "LEADER_LEASE_MS"),
        ({"SOURCES_FILE": "/no/such/file.json"}, "SOURCES_FILE"),
        ({"SOURCES_URL": "api.example.org/sources"}, "SOURCES_URL"),
        ({"REDIS_URL": "localhost:6379"}, "REDIS_URL"),
        ({"REDIS_PORT": "redis"}, "REDIS_PORT"),
        ({"LOG_LEVEL": "loud"}, "LOG_LEVEL"),
        # A cut never stops a source (halts do), and always cuts.
        ({"BACKOFF_FLOOR_RPS": "0"}, "BACKOFF_FLOOR_RPS"),
        ({"BACKOFF_FLOOR_RPS": "inf"}, "BACKOFF_FLOOR_RPS"),
        ({"BACKOFF_FLOOR_RPS": "slow"}, "BACKOFF_FLOOR_RPS"),
        ({"BACKOFF_DECREASE_FACTOR": "1"}, "BACKOFF_DECREASE_FACTOR"),
        ({"BACKOFF_DECREASE_FACTOR": "0"}, "BACKOFF_DECREASE_FACTOR"),
        ({"BACKOFF_DECREASE_FACTOR": "70%"}, "BACKOFF_DECREASE_FACTOR"),
        ({"BACKOFF_INCREASE_SHARE_PER_S": "0"}, "BACKOFF_INCREASE_SHARE_PER_S"),
        ({"BACKOFF_INCREASE_SHARE_PER_S": "1.5"}, "BACKOFF_INCREASE_SHARE_PER_S"),
        ({"BACKOFF_COOLDOWN_S": "-1"}, "BACKOFF_COOLDOWN_S"),
        ({"BACKOFF_COOLDOWN_S": "inf"}, "BACKOFF_COOLDOWN_S"),
        # A deprecated name still read is named as the operator spelled it.
        ({"LOG_FREQUENCY_SECONDS": "often"}, "LOG_FREQUENCY_SECONDS"),
        ({"TOKEN_TTL_MS": "500"}, "TOKEN_TTL_MS"),
        ({"BACKOFF_COOLDOWN_SECONDS": "inf"}, "BACKOFF_COOLDOWN_SECONDS"),
        ({"REDIS_TIMEOUT_SECONDS": "0"}, "REDIS_TIMEOUT_SECONDS"),
    ],
)
def test_bad_values_are_named(env, names):
    with pytest.raises(ConfigError, match=rf"\b{names}\b"):
        MonitorSettings.from_env(env)


def test_deprecated_names_still_work_and_are_reported():
    settings = MonitorSettings.from_env({"LOG_FREQUENCY_SECONDS": "2.5", "TOKEN_TTL_MS": "1200"})
    assert (settings.log_frequency_s, settings.pace_rate_ttl_ms) == (2.5, 1200)
    assert settings.deprecated == (
        DeprecatedSetting("LOG_FREQUENCY_SECONDS", "LOG_FREQUENCY_S"),
        DeprecatedSetting("TOKEN_TTL_MS", "PACE_RATE_TTL_MS"),
    )
    assert MonitorSettings.from_env({"LOG_FREQUENCY_S": "2.5"}).deprecated == ()


def test_the_new_name_wins_over_the_deprecated_one():
    settings = MonitorSettings.from_env({"LOG_FREQUENCY_S": "2.5", "LOG_FREQUENCY_SECONDS": "9"})
    assert settings.log_frequency_s == 2.5
    assert settings.deprecated == (
        DeprecatedSetting("LOG_FREQUENCY_SECONDS", "LOG_FREQUENCY_S", ignored=True),
    )


def test_the_process_exits_2_on_a_bad_setting():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    env["PACE_RATE_TTL_MS"] = "nope"
    done = subprocess.run(
        [sys.executable, "-m", "crawl_monitor"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "PACE_RATE_TTL_MS" in done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize(
    ("env", "retention_ms"),
    [
        ({}, -1),
        ({"URL_TOPIC_RETENTION_MS": "-1"}, -1),
        ({"URL_TOPIC_RETENTION_MS": "604800000"}, 604800000),
    ],
)
def test_url_topic_retention_is_unlimited_unless_chosen(env, retention_ms):
    assert MonitorSettings.from_env(env).url_topic_retention_ms == retention_ms


@pytest.mark.parametrize("value", ["0", "-2", "-604800000", "7d", "1.5"])
def test_url_topic_retention_is_minus_one_or_positive(value):
    # 0 would delete every URL as soon as its segment rolls, read or not.
    with pytest.raises(ConfigError, match=r"\bURL_TOPIC_RETENTION_MS\b"):
        MonitorSettings.from_env({"URL_TOPIC_RETENTION_MS": value})
