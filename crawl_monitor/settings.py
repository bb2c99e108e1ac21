"""The monitor's settings: one frozen dataclass, built once from the environment.

docs/configuration.md lists the variables, their defaults and meanings.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path

from crawl_monitor.policy.adaptive import AdaptiveSettings
from image_crawler import contract
from image_crawler.config import (
    ConfigError,
    DeprecatedSetting,
    KafkaSettings,
    MetricsSettings,
    RedisSettings,
    deprecated_settings,
    env_float,
    env_int,
    env_name,
    env_optional,
    env_str,
)

# The contract: rates are set every second.
REFILL_PERIOD_S = 1.0


@dataclasses.dataclass(frozen=True, slots=True)
class MonitorSettings:
    kafka: KafkaSettings = dataclasses.field(default_factory=KafkaSettings)
    redis: RedisSettings = dataclasses.field(default_factory=RedisSettings)
    sources_file: Path | None = None
    sources_url: str | None = None
    sources_refresh_s: float = 1800.0
    sources_timeout_s: float = 30.0
    log_frequency_s: float = contract.LOG_FREQUENCY_S
    # Sources listed in monitoring_update's ``specific`` (0: every active one); /metrics
    # and `image-crawler status` have them all.
    monitoring_top_sources: int = 100
    # Where /metrics, /healthz and the dashboard are served (METRICS_PORT unset: nowhere).
    metrics: MetricsSettings = dataclasses.field(default_factory=MetricsSettings)
    source_topic_partitions: int = 4
    source_topic_replication_factor: int = 1
    # retention.ms of the urls.{source} topics the splitter creates; -1: never delete.
    url_topic_retention_ms: int = contract.URL_TOPIC_RETENTION_MS
    splitter_batch_size: int = 500
    # A pace_rate SET expires after this; it must outlive one refill period.
    pace_rate_ttl_ms: int = 1500
    # The leader renews its lease every refill; it must outlive a refill and a slow loop.
    leader_lease_ms: int = 3000
    refill_period_s: float = REFILL_PERIOD_S
    backoff: AdaptiveSettings = dataclasses.field(default_factory=AdaptiveSettings)
    redis_timeout_s: float = 5.0
    log_level: str = "INFO"
    # Old variable names the environment still sets (logged once at start).
    deprecated: tuple[DeprecatedSetting, ...] = dataclasses.field(default=(), compare=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> MonitorSettings:
        """Read every setting; raises ``ConfigError`` naming the first bad variable."""
        env = os.environ if env is None else env
        default = cls()
        # The settings with checks of their own, read before the others and in this order.
        sources_file = _sources_file(env)
        sources_url = _sources_url(env)
        pace_rate_ttl_ms = _pace_rate_ttl_ms(env, default.pace_rate_ttl_ms)
        leader_lease_ms = _leader_lease_ms(env, default.leader_lease_ms)
        url_topic_retention_ms = _url_topic_retention_ms(env, default.url_topic_retention_ms)
        log_level = _log_level(env, default.log_level)
        return cls(
            kafka=KafkaSettings.from_env(env),
            redis=RedisSettings.from_env(env),
            sources_file=sources_file,
            sources_url=sources_url,
            sources_refresh_s=env_float(
                env, "SOURCES_REFRESH_S", default.sources_refresh_s, minimum=0.05
            ),
            sources_timeout_s=env_float(
                env, "SOURCES_TIMEOUT_S", default.sources_timeout_s, minimum=0.1
            ),
            log_frequency_s=env_float(
                env, "LOG_FREQUENCY_S", default.log_frequency_s, minimum=0.05
            ),
            monitoring_top_sources=env_int(
                env, "MONITORING_TOP_SOURCES", default.monitoring_top_sources, minimum=0
            ),
            metrics=MetricsSettings.from_env(env),
            source_topic_partitions=env_int(
                env, "SOURCE_TOPIC_PARTITIONS", default.source_topic_partitions, minimum=1
            ),
            source_topic_replication_factor=env_int(
                env,
                "SOURCE_TOPIC_REPLICATION_FACTOR",
                default.source_topic_replication_factor,
                minimum=1,
            ),
            url_topic_retention_ms=url_topic_retention_ms,
            splitter_batch_size=env_int(
                env, "SPLITTER_BATCH_SIZE", default.splitter_batch_size, minimum=1
            ),
            pace_rate_ttl_ms=pace_rate_ttl_ms,
            leader_lease_ms=leader_lease_ms,
            backoff=backoff_from_env(env),
            redis_timeout_s=env_float(env, "REDIS_TIMEOUT_S", default.redis_timeout_s, minimum=0.1),
            log_level=log_level,
            deprecated=deprecated_settings(env),
        )


def _sources_file(env: Mapping[str, str]) -> Path | None:
    """SOURCES_FILE, which must be a readable file (unset: None)."""
    sources_file = env_optional(env, "SOURCES_FILE")
    if sources_file is not None and not Path(sources_file).is_file():
        raise ConfigError(f"SOURCES_FILE is not a readable file: {sources_file!r}")
    return Path(sources_file) if sources_file is not None else None


def _sources_url(env: Mapping[str, str]) -> str | None:
    """SOURCES_URL, which must be an http(s) URL (unset: None)."""
    sources_url = env_optional(env, "SOURCES_URL")
    if sources_url is not None and not sources_url.startswith(("http://", "https://")):
        raise ConfigError(f"SOURCES_URL must start with http:// or https://: {sources_url!r}")
    return sources_url


def _pace_rate_ttl_ms(env: Mapping[str, str], default: int) -> int:
    """PACE_RATE_TTL_MS, which must outlive one refill period."""
    pace_rate_ttl_ms = env_int(env, "PACE_RATE_TTL_MS", default, minimum=1)
    if pace_rate_ttl_ms < REFILL_PERIOD_S * 1000:
        raise ConfigError(
            f"{env_name(env, 'PACE_RATE_TTL_MS')} must be at least "
            f"{int(REFILL_PERIOD_S * 1000)} (one refill period), or rates expire between "
            f"loops; got {pace_rate_ttl_ms}"
        )
    return pace_rate_ttl_ms


def _leader_lease_ms(env: Mapping[str, str], default: int) -> int:
    """LEADER_LEASE_MS, which must outlive two refill periods."""
    leader_lease_ms = env_int(env, "LEADER_LEASE_MS", default, minimum=1)
    if leader_lease_ms < 2 * REFILL_PERIOD_S * 1000:
        raise ConfigError(
            f"LEADER_LEASE_MS must be at least {int(2 * REFILL_PERIOD_S * 1000)} (two "
            f"refill periods), or the leader loses its lease between two of its own "
            f"loops; got {leader_lease_ms}"
        )
    return leader_lease_ms


def _url_topic_retention_ms(env: Mapping[str, str], default: int) -> int:
    """URL_TOPIC_RETENTION_MS: -1 (never delete) or a positive number of milliseconds."""
    url_topic_retention_ms = env_int(env, "URL_TOPIC_RETENTION_MS", default, minimum=-(2**63))
    if url_topic_retention_ms != -1 and url_topic_retention_ms < 1:
        # Kafka takes 0 as "delete each segment once it rolls", unread or not, and
        # refuses other negatives when the topic is created.
        raise ConfigError(
            "URL_TOPIC_RETENTION_MS must be -1 (never delete unread URLs) or a positive "
            f"number of milliseconds, got {url_topic_retention_ms}"
        )
    return url_topic_retention_ms


def _log_level(env: Mapping[str, str], default: str) -> str:
    """LOG_LEVEL, upper-cased, which must name a log level."""
    log_level = env_str(env, "LOG_LEVEL", default).upper()
    if log_level not in logging.getLevelNamesMapping():
        raise ConfigError(f"LOG_LEVEL is not a log level: {log_level!r}")
    return log_level


def backoff_from_env(env: Mapping[str, str]) -> AdaptiveSettings:
    """The adaptive rate's settings; raises ``ConfigError`` naming the first bad variable."""
    default = AdaptiveSettings()
    floor_rps = env_float(env, "BACKOFF_FLOOR_RPS", default.floor_rps)
    if not 0.0 < floor_rps < math.inf:
        raise ConfigError(
            f"BACKOFF_FLOOR_RPS must be a rate above 0 (a cut never stops a source; halts "
            f"do), got {floor_rps}"
        )
    factor = env_float(env, "BACKOFF_DECREASE_FACTOR", default.decrease_factor)
    if not 0.0 < factor < 1.0:
        raise ConfigError(f"BACKOFF_DECREASE_FACTOR must be between 0 and 1, got {factor}")
    share = env_float(env, "BACKOFF_INCREASE_SHARE_PER_S", default.increase_share_per_s)
    if not 0.0 < share <= 1.0:
        raise ConfigError(
            f"BACKOFF_INCREASE_SHARE_PER_S must be above 0 and at most 1, got {share}"
        )
    cooldown_s = env_float(env, "BACKOFF_COOLDOWN_S", default.cooldown_s)
    if cooldown_s == math.inf:
        raise ConfigError(f"{env_name(env, 'BACKOFF_COOLDOWN_S')} must be finite")
    return AdaptiveSettings(
        floor_rps=floor_rps,
        decrease_factor=factor,
        increase_share_per_s=share,
        cooldown_s=cooldown_s,
    )
