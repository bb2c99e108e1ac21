"""The deduplication stage's settings, from the environment (docs/configuration.md)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from image_crawler.config import (
    ConfigError,
    DeprecatedSetting,
    KafkaSettings,
    MetricsSettings,
    RedisSettings,
    deprecated_settings,
    env_float,
    env_int,
    env_str,
)

# imagehash's pHash differs in an even number of bits (32 set in each), so 4 and 5 are
# one threshold; past 10, chance matches at 10^8 images are in the millions (docs).
MAX_RADIUS: Final = 10


@dataclasses.dataclass(frozen=True, slots=True)
class DedupSettings:
    kafka: KafkaSettings = dataclasses.field(default_factory=KafkaSettings)
    # Where the placement counts are copied for operators (PLACEMENTS_HASH): never
    # needed by the stage itself, which runs on without it.
    redis: RedisSettings = dataclasses.field(default_factory=RedisSettings)
    redis_timeout_s: float = 5.0
    # The journal's folder (dedup/journal.py): the stage's whole state.
    state_dir: Path = Path("dedup-state")
    # Near: perceptual hashes at most this many bits apart (of 64).
    radius: int = 4
    # The most messages placed (and synced, and published) in one batch.
    batch_size: int = 2000
    metrics: MetricsSettings = dataclasses.field(default_factory=MetricsSettings)
    log_level: str = "INFO"
    deprecated: tuple[DeprecatedSetting, ...] = dataclasses.field(default=(), compare=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> DedupSettings:
        env = os.environ if env is None else env
        default = cls()
        radius = env_int(env, "DEDUP_RADIUS", default.radius)
        if radius > MAX_RADIUS:
            raise ConfigError(f"DEDUP_RADIUS must be 0-{MAX_RADIUS} bits, got {radius}")
        return cls(
            kafka=KafkaSettings.from_env(env),
            redis=RedisSettings.from_env(env),
            redis_timeout_s=env_float(env, "REDIS_TIMEOUT_S", default.redis_timeout_s, minimum=0.1),
            state_dir=Path(env_str(env, "DEDUP_STATE_DIR", str(default.state_dir))),
            radius=radius,
            batch_size=env_int(env, "DEDUP_BATCH_SIZE", default.batch_size, minimum=1),
            metrics=MetricsSettings.from_env(env),
            log_level=env_str(env, "LOG_LEVEL", default.log_level),
            deprecated=deprecated_settings(env),
        )
