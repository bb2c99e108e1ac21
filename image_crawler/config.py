"""Reading settings from the environment, with errors that name the variable.

Each process has a frozen settings dataclass built once in ``__main__``; the helpers here
turn one environment variable into one typed value, or raise ``ConfigError``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping


class ConfigError(ValueError):
    """A setting is missing or malformed; the message names the variable."""


def env_str(env: Mapping[str, str], name: str, default: str) -> str:
    value = env.get(name, "").strip()
    return value or default


def env_optional(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name, "").strip()
    return value or None


def env_int(env: Mapping[str, str], name: str, default: int, *, minimum: int = 0) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {value}")
    return value


def env_float(env: Mapping[str, str], name: str, default: float, *, minimum: float = 0.0) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None
    if not value >= minimum:  # also rejects NaN
        raise ConfigError(f"{name} must be at least {minimum}, got {value}")
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class KafkaSettings:
    bootstrap_servers: str = "kafka:9092"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> KafkaSettings:
        return cls(bootstrap_servers=env_str(env, "KAFKA_HOSTS", "kafka:9092"))


@dataclasses.dataclass(frozen=True, slots=True)
class RedisSettings:
    url: str = "redis://redis:6379/0"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> RedisSettings:
        url = env_optional(env, "REDIS_URL")
        if url is None:
            host = env_str(env, "REDIS_HOST", "redis")
            port = env_int(env, "REDIS_PORT", 6379, minimum=1)
            url = f"redis://{host}:{port}/0"
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise ConfigError(f"REDIS_URL must start with redis://, rediss:// or unix://: {url!r}")
        return cls(url=url)


@dataclasses.dataclass(frozen=True, slots=True)
class S3Settings:
    bucket: str = "cc-image-analysis"
    endpoint_url: str | None = None
    region: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> S3Settings:
        return cls(
            bucket=env_str(env, "S3_BUCKET", "cc-image-analysis"),
            endpoint_url=env_optional(env, "S3_ENDPOINT_URL"),
            region=env_optional(env, "AWS_DEFAULT_REGION"),
        )
