"""Reading settings from the environment, with errors that name the variable.

Each process has a frozen settings dataclass built once in ``__main__``; the helpers here
turn one environment variable into one typed value, or raise ``ConfigError``. Units end a
variable's name: ``_S`` seconds, ``_MS`` milliseconds, ``_BYTES`` bytes, ``_RPS``
requests per second. A renamed variable is still read under its old name (``RENAMED``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis

from image_crawler.ports import parse_ports


class ConfigError(ValueError):
    """A setting is missing or malformed; the message names the variable."""


# New name -> the old one it replaces, which is still read when the new one is unset.
RENAMED: Final[Mapping[str, str]] = MappingProxyType(
    {
        "BACKOFF_COOLDOWN_S": "BACKOFF_COOLDOWN_SECONDS",
        "COMMIT_INTERVAL_S": "COMMIT_INTERVAL_SECONDS",
        "KAFKA_MAX_POLL_INTERVAL_S": "KAFKA_MAX_POLL_INTERVAL_SECONDS",
        "LOG_FREQUENCY_S": "LOG_FREQUENCY_SECONDS",
        # The expiry of pace_rate:{source}; nothing is a token since pacing replaced them.
        "PACE_RATE_TTL_MS": "TOKEN_TTL_MS",
        "RATE_LIMIT_TIMEOUT_S": "RATE_LIMIT_TIMEOUT_SECONDS",
        "REDIS_TIMEOUT_S": "REDIS_TIMEOUT_SECONDS",
        "SHUTDOWN_GRACE_S": "SHUTDOWN_GRACE_SECONDS",
        "SOURCES_POLL_S": "SOURCES_POLL_SECONDS",
        "SOURCES_REFRESH_S": "SOURCES_REFRESH_SECONDS",
        "SOURCES_TIMEOUT_S": "SOURCES_TIMEOUT_SECONDS",
        "TOKEN_RETRY_S": "TOKEN_RETRY_SECONDS",
    }
)


@dataclasses.dataclass(frozen=True, slots=True)
class DeprecatedSetting:
    """An old variable name the environment still sets (``name``), and its new one."""

    name: str
    use: str
    # The new name is set too, to another value, and wins. Not an error: an operator
    # moving to the new name may leave the old one behind in another layer (an image, a
    # unit file, an .env), and refusing to start would turn a rename into an outage.
    ignored: bool = False


def deprecated_settings(env: Mapping[str, str]) -> tuple[DeprecatedSetting, ...]:
    """The old names ``env`` sets, for one ``deprecated_setting`` warning each at start."""
    found = []
    for new, old in RENAMED.items():
        old_value = env.get(old, "").strip()
        if old_value:
            new_value = env.get(new, "").strip()
            found.append(DeprecatedSetting(old, new, ignored=new_value not in ("", old_value)))
    return tuple(found)


def log_deprecated(deprecated: Iterable[DeprecatedSetting]) -> None:
    """Log ``deprecated_setting`` (``name``, ``use``, and ``ignored`` when set) for each."""
    # Imported here: structlog (and the rich traceback it loads) take a tenth of a second
    # to import, which `image-crawler status` would otherwise pay at every start.
    from image_crawler.logs import get_logger

    log = get_logger(__name__)
    for setting in deprecated:
        fields: dict[str, Any] = {"name": setting.name, "use": setting.use}
        if setting.ignored:
            fields["ignored"] = True
        log.warning("deprecated_setting", **fields)


def env_name(env: Mapping[str, str], name: str) -> str:
    """The variable a setting is read from: ``name``, or its old name when only that is set."""
    old = RENAMED.get(name)
    if old is not None and not env.get(name, "").strip() and env.get(old, "").strip():
        return old
    return name


def _read(env: Mapping[str, str], name: str) -> tuple[str, str]:
    name = env_name(env, name)
    return name, env.get(name, "").strip()


def env_str(env: Mapping[str, str], name: str, default: str) -> str:
    _, value = _read(env, name)
    return value or default


def env_optional(env: Mapping[str, str], name: str) -> str | None:
    _, value = _read(env, name)
    return value or None


def env_int(env: Mapping[str, str], name: str, default: int, *, minimum: int = 0) -> int:
    name, raw = _read(env, name)
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
    name, raw = _read(env, name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None
    if not value >= minimum:  # also rejects NaN
        raise ConfigError(f"{name} must be at least {minimum}, got {value}")
    return value


KAFKA_SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
KAFKA_SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclasses.dataclass(frozen=True, slots=True)
class KafkaSettings:
    """How every Kafka client of a process connects; secrets stay out of ``repr``."""

    bootstrap_servers: str = "kafka:9092"
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str = "PLAIN"
    sasl_username: str | None = None
    sasl_password: str | None = dataclasses.field(default=None, repr=False)
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> KafkaSettings:
        default = cls()
        protocol = env_str(env, "KAFKA_SECURITY_PROTOCOL", default.security_protocol).upper()
        if protocol not in KAFKA_SECURITY_PROTOCOLS:
            raise ConfigError(
                f"KAFKA_SECURITY_PROTOCOL must be one of {', '.join(KAFKA_SECURITY_PROTOCOLS)},"
                f" got {protocol!r}"
            )
        mechanism = env_str(env, "KAFKA_SASL_MECHANISM", default.sasl_mechanism).upper()
        if mechanism not in KAFKA_SASL_MECHANISMS:
            raise ConfigError(
                f"KAFKA_SASL_MECHANISM must be one of {', '.join(KAFKA_SASL_MECHANISMS)},"
                f" got {mechanism!r}"
            )
        settings = cls(
            bootstrap_servers=env_str(env, "KAFKA_HOSTS", default.bootstrap_servers),
            security_protocol=protocol,
            sasl_mechanism=mechanism,
            sasl_username=env_optional(env, "KAFKA_SASL_USERNAME"),
            sasl_password=env_optional(env, "KAFKA_SASL_PASSWORD"),
            ssl_cafile=env_optional(env, "KAFKA_SSL_CAFILE"),
            ssl_certfile=env_optional(env, "KAFKA_SSL_CERTFILE"),
            ssl_keyfile=env_optional(env, "KAFKA_SSL_KEYFILE"),
        )
        if protocol.startswith("SASL") and not (settings.sasl_username and settings.sasl_password):
            raise ConfigError(
                f"KAFKA_SECURITY_PROTOCOL={protocol} needs KAFKA_SASL_USERNAME and "
                "KAFKA_SASL_PASSWORD"
            )
        for name, path in (
            ("KAFKA_SSL_CAFILE", settings.ssl_cafile),
            ("KAFKA_SSL_CERTFILE", settings.ssl_certfile),
            ("KAFKA_SSL_KEYFILE", settings.ssl_keyfile),
        ):
            if path is not None and not os.path.isfile(path):
                raise ConfigError(f"{name}: no such file {path!r}")
        return settings

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments for every aiokafka client (producer, consumer, admin)."""
        options: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers,
            "security_protocol": self.security_protocol,
        }
        if self.security_protocol.endswith("SSL"):
            # Imported here: aiokafka takes a tenth of a second to import, which the
            # commands that use Redis alone (image-crawler status) need not pay.
            from aiokafka.helpers import create_ssl_context

            options["ssl_context"] = create_ssl_context(
                cafile=self.ssl_cafile, certfile=self.ssl_certfile, keyfile=self.ssl_keyfile
            )
        if self.security_protocol.startswith("SASL"):
            options["sasl_mechanism"] = self.sasl_mechanism
            options["sasl_plain_username"] = self.sasl_username
            options["sasl_plain_password"] = self.sasl_password
        return options

    def producer_options(self) -> dict[str, Any]:
        """``client_options`` and the batch size of every producer of the crawl."""
        return {**self.client_options(), "max_batch_size": PRODUCER_BATCH_BYTES}


# The most a producer gathers for one partition before it sends (aiokafka's default is
# 16 KiB: about 40 URLs, 10 results). The local stack's broker (tansu on an S3 store) keeps
# each batch as an object and lists all of a partition's objects for every fetch, so a
# fetch costs time in proportion to the batches a partition holds (bench/tansu_fetch.py:
# 0.6 s at the start of 20,000, 88 s at its end); fewer, larger batches put that wall
# further off. Below Kafka's default message.max.bytes (1 MiB) with room to spare.
PRODUCER_BATCH_BYTES: Final = 512 * 1024

# The longest a command waits for a connection of a bounded pool (RedisSettings.client).
POOL_WAIT_S: Final = 30.0

REDIS_HOST: Final = "redis"
REDIS_PORT: Final = 6379


def _redis_url(host: str, port: int) -> str:
    return f"redis://{host}:{port}/0"


@dataclasses.dataclass(frozen=True, slots=True)
class RedisSettings:
    """Where Redis is. The URL may carry a password (``redis://:pw@host``) and TLS
    (``rediss://``); ``REDIS_PASSWORD`` keeps the password out of the URL instead, and
    ``REDIS_TLS_CA_FILE`` names the CA of a ``rediss://`` server."""

    url: str = dataclasses.field(default=_redis_url(REDIS_HOST, REDIS_PORT), repr=False)
    password: str | None = dataclasses.field(default=None, repr=False)
    tls_ca_file: str | None = None

    @property
    def redacted_url(self) -> str:
        """The URL without its password, for logs."""
        parts = urlsplit(self.url)
        if parts.password is None:
            return self.url
        netloc = parts.netloc.rsplit("@", 1)[1]
        user = f"{parts.username}:" if parts.username else ":"
        return urlunsplit(parts._replace(netloc=f"{user}***@{netloc}"))

    def client(self, *, pool_size: int | None = None, **options: Any) -> aioredis.Redis:
        """A redis.asyncio client for this server (``options`` as for ``from_url``).

        With ``pool_size``, a command waits (up to ``POOL_WAIT_S``) for one of that many
        connections: redis-py's own pool allows 100 and then *fails* the command
        (``MaxConnectionsError``), which a worker with hundreds of new hosts at once
        (their robots.txt, their pacing) ran into thousands of times a crawl."""
        if self.password is not None:
            options["password"] = self.password
        if self.tls_ca_file is not None:
            options["ssl_ca_certs"] = self.tls_ca_file
        if pool_size is None:
            return aioredis.from_url(self.url, **options)
        pool = aioredis.BlockingConnectionPool.from_url(
            self.url, max_connections=pool_size, timeout=POOL_WAIT_S, **options
        )
        return aioredis.Redis.from_pool(pool)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> RedisSettings:
        url = env_optional(env, "REDIS_URL")
        if url is None:
            host = env_str(env, "REDIS_HOST", REDIS_HOST)
            port = env_int(env, "REDIS_PORT", REDIS_PORT, minimum=1)
            url = _redis_url(host, port)
        if not url.startswith(("redis://", "rediss://", "unix://")):
            redacted = cls(url=url).redacted_url
            raise ConfigError(
                f"REDIS_URL must start with redis://, rediss:// or unix://: {redacted!r}"
            )
        tls_ca_file = env_optional(env, "REDIS_TLS_CA_FILE")
        if tls_ca_file is not None and not os.path.isfile(tls_ca_file):
            raise ConfigError(f"REDIS_TLS_CA_FILE: no such file {tls_ca_file!r}")
        return cls(url=url, password=env_optional(env, "REDIS_PASSWORD"), tls_ca_file=tls_ca_file)


@dataclasses.dataclass(frozen=True, slots=True)
class S3Settings:
    bucket: str = "cc-image-analysis"
    endpoint_url: str | None = None
    region: str | None = None
    # CA certificates to trust for the endpoint (the AWS tools' own variable).
    ca_bundle: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> S3Settings:
        ca_bundle = env_optional(env, "AWS_CA_BUNDLE")
        if ca_bundle is not None and not os.path.isfile(ca_bundle):
            raise ConfigError(f"AWS_CA_BUNDLE: no such file {ca_bundle!r}")
        return cls(
            bucket=env_str(env, "S3_BUCKET", cls().bucket),
            endpoint_url=env_optional(env, "S3_ENDPOINT_URL"),
            region=env_optional(env, "AWS_DEFAULT_REGION"),
            ca_bundle=ca_bundle,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class MetricsSettings:
    """Where a process serves ``/metrics`` and ``/healthz`` (image_crawler/metrics.py).

    ``port`` None (METRICS_PORT unset or empty) means no HTTP server; 0 picks a free port.
    METRICS_PORT may also be a range ``FIRST-LAST`` (``port`` to ``port_last``, both
    included; ``port_last`` is None for a single port): for several processes in one
    network namespace (Docker's host networking), each takes the first free port of it.
    ``host`` (METRICS_HOST) is every interface by default, so that Prometheus can scrape a
    container; `image-crawler up` sets 127.0.0.1.
    """

    port: int | None = None
    port_last: int | None = None
    host: str = "0.0.0.0"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> MetricsSettings:
        host = env_str(env, "METRICS_HOST", cls().host)
        raw = env_optional(env, "METRICS_PORT")
        if raw is None:
            return cls(host=host)
        try:
            ports = parse_ports("METRICS_PORT", raw)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        return cls(port=ports.first, port_last=ports.last if ports.is_range else None, host=host)
