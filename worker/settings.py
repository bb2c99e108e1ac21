"""The worker's settings: one frozen dataclass, built once from the environment."""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Final, Literal

from image_crawler import contract
from image_crawler.config import (
    ConfigError,
    DeprecatedSetting,
    KafkaSettings,
    MetricsSettings,
    RedisSettings,
    S3Settings,
    deprecated_settings,
    env_float,
    env_int,
    env_name,
    env_optional,
    env_str,
)
from worker.download.dns import DnsSettings, parse_servers
from worker.download.netguard import AddressPolicy, IPNetwork, parse_networks
from worker.host_queues import HostQueueSettings
from worker.politeness.hosts import PACING_KEYS, HostSettings
from worker.politeness.robots_rules import DEFAULT_PRODUCT_TOKEN, PRODUCT_TOKEN, product_token

PROJECT_URL = "https://github.com/cc-archive/image-crawler"


def _package_version() -> str:
    try:
        return metadata.version("image-crawler")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


# Who we are, on every request. Operators should set USER_AGENT to say who runs the
# crawl and how to reach them: a webmaster who sees this one can only reach the project.
DEFAULT_USER_AGENT = f"image-crawler/{_package_version()} (+{PROJECT_URL})"


@dataclasses.dataclass(frozen=True, slots=True)
class FetchSettings:
    """Limits of one download. Times in seconds, sizes in bytes."""

    connect_timeout_s: float = 10.0
    read_timeout_s: float = 30.0
    total_timeout_s: float = 120.0
    max_body_bytes: int = 64 * 1024 * 1024
    max_redirects: int = 5
    # A status line or header field longer than this is refused (status BadResponse).
    max_header_bytes: int = 8190
    max_connections: int = 1000
    # Downloaded bodies held at once, from the request to the end of their message (see
    # worker/download/budget.py): what bounds a worker's memory, more than MAX_TASKS does.
    max_bytes_in_flight: int = 256 * 1024 * 1024
    user_agent: str = DEFAULT_USER_AGENT
    # Private networks the fetcher may still connect to (everything non-public is refused).
    allowed_private_networks: tuple[IPNetwork, ...] = ()

    @property
    def address_policy(self) -> AddressPolicy:
        return AddressPolicy(self.allowed_private_networks)


RobotsPolicy = Literal["obey", "ignore"]
ROBOTS_POLICIES: tuple[RobotsPolicy, ...] = ("obey", "ignore")


@dataclasses.dataclass(frozen=True, slots=True)
class RobotsSettings:
    """robots.txt (worker/politeness/robots.py). Times in seconds."""

    policy: RobotsPolicy = "obey"
    # Our product token: robots.txt groups naming it apply to us (else the `*` group).
    token: str = DEFAULT_PRODUCT_TOKEN
    cache_s: float = contract.ROBOTS_CACHE_S
    unavailable_max_s: float = contract.ROBOTS_UNAVAILABLE_MAX_S
    max_crawl_delay_s: float = contract.MAX_CRAWL_DELAY_S
    # An unreachable robots.txt is asked again after this, doubling up to retry_cap_s.
    retry_base_s: float = 60.0
    retry_cap_s: float = 3600.0
    max_retry_after_s: float = contract.MAX_RETRY_AFTER_S
    # How often the set robots_exempt is read again.
    exempt_refresh_s: float = 5.0
    # How often a worker waiting for another's fetch of a file looks for it.
    poll_s: float = 0.1
    # How often the sources offering a slot for a host's robots.txt are counted again.
    slot_recheck_s: float = 1.0
    # Hosts whose rules a worker keeps parsed in memory (least recently used go first),
    # and the most characters of rules they may have together (parsed, about 25 bytes
    # a character: some 50 MB).
    local_hosts: int = 10_000
    local_rules_chars: int = 2_000_000
    # The longest one fetch of a robots.txt may take, its redirects included; also how
    # long a fetcher's lock lives, should it die while fetching.
    fetch_timeout_s: float = 120.0
    # A host whose name did not resolve is asked again after this: once the resolver's
    # cached failure has expired (DNS_NEGATIVE_TTL_S, and a second more). Its URLs end as
    # DnsError at an NXDOMAIN (or a name without an address), or once it failed to get
    # an answer (SERVFAIL, a timeout, a refusal) dns_tries times in a row.
    dns_retry_s: float = 61.0
    dns_tries: int = 2


ThumbnailStoreKind = Literal["s3", "local"]
THUMBNAIL_STORES: tuple[ThumbnailStoreKind, ...] = ("s3", "local")


@dataclasses.dataclass(frozen=True, slots=True)
class ThumbnailSettings:
    """Where thumbnails go: ``s3`` (production: ``S3_BUCKET``) or ``local`` (files in
    ``directory``, for a crawl on one machine)."""

    store: ThumbnailStoreKind = "s3"
    directory: Path = Path("thumbnails")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ThumbnailSettings:
        default = cls()
        store = env_str(env, "THUMBNAIL_STORE", default.store).lower()
        if store not in THUMBNAIL_STORES:
            raise ConfigError(
                f"THUMBNAIL_STORE must be one of {', '.join(THUMBNAIL_STORES)}, got {store!r}"
            )
        return cls(
            store=store,
            directory=Path(env_str(env, "THUMBNAIL_DIR", str(default.directory))),
        )


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerSettings:
    kafka: KafkaSettings = dataclasses.field(default_factory=KafkaSettings)
    redis: RedisSettings = dataclasses.field(default_factory=RedisSettings)
    s3: S3Settings = dataclasses.field(default_factory=S3Settings)
    thumbnails: ThumbnailSettings = dataclasses.field(default_factory=ThumbnailSettings)
    fetch: FetchSettings = dataclasses.field(default_factory=FetchSettings)
    robots: RobotsSettings = dataclasses.field(default_factory=RobotsSettings)
    # The resolver (worker/download/dns.py): DNS_SERVERS, DNS_*_TTL_S, ...
    dns: DnsSettings = dataclasses.field(default_factory=DnsSettings)
    # Politeness per host: PACING_KEY, MAX_HOST_RATE, HOST_GIVE_UP_S.
    hosts: HostSettings = dataclasses.field(default_factory=HostSettings)
    # URLs waiting for their host (worker.host_queues): MAX_WAITING_URLS, PARK_AFTER_S.
    waiting: HostQueueSettings = dataclasses.field(default_factory=HostQueueSettings)
    # Where /metrics and /healthz are served (METRICS_PORT unset: not at all).
    metrics: MetricsSettings = dataclasses.field(default_factory=MetricsSettings)
    # How images are stored for the messages that ask no encoding (IMAGE_SIZE, ...);
    # None: the original's thumbnail.
    encoding: contract.Encoding | None = None
    # Task slots of this process, shared fairly among sources.
    max_tasks: int = 3000
    # Processes decoding and thumbnailing images; 0 means one per CPU.
    image_processes: int = 0
    # How often the set of sources is re-read from Redis.
    sources_poll_s: float = 5.0
    # How often finished offsets are committed.
    commit_interval_s: float = 1.0
    # A message read that is a copy, byte for byte, of one of its partition crawled less
    # than this long ago is counted finished without a request (worker/copies.py); 0: off.
    # The copies a campaign's queues held came up to 231 s after their first; a queue read
    # far behind (a backlog) reads both later, but about as far apart.
    copy_window_s: float = 600.0
    # How long the producer gathers a partition's messages before it sends them: a busy
    # worker sends one request per partition this often rather than many small ones; a
    # task waits that long at most, once, for its messages, holding its slot and its body
    # (at 100 images/s, 10 more bodies in flight at 100 ms). Each produce request costs
    # the main process about 0.5 ms of CPU (aiokafka's sender, the loop's wake-ups): at 20
    # ms a worker crawling 80 images/s sent one for every two or three messages, at 100 ms
    # one for about a dozen: 0.1 ms less per message. On the local stack's broker each
    # request is also objects written, listed and read in S3: `download` waits longer.
    producer_linger_ms: int = 100
    # Pause between token attempts once a source's bucket is empty.
    token_retry_s: float = 1.0
    # A URL still waiting for a token after this long logs `rate_limit_timeout`.
    rate_limit_timeout_s: float = 6 * 3600.0
    # Tries of one URL in all (counting the `attempts` its inbound message carries) before
    # a retryable failure goes to crawl_errors.
    max_attempts: int = contract.MAX_ATTEMPTS
    # The longest Retry-After obeyed; a server asking for longer is waited for this long.
    max_retry_after_s: float = contract.MAX_RETRY_AFTER_S
    # On SIGTERM: how long in-flight work may take to finish before it is handed back.
    shutdown_grace_s: float = 30.0
    # Kafka's max.poll.interval: a consumer that does not poll for this long is dropped
    # from the group. The scheduler polls every ~0.1 s whatever its tasks do, so a slow
    # download never comes near it; aiokafka's default (300 s) is kept.
    kafka_max_poll_interval_s: float = 300.0
    # Static membership (KIP-345): this process's own id in the group, kept across its
    # restarts, so that one back within the session timeout takes its partitions back with
    # no rebalance of the others; None: a dynamic member (docs/guarantees.md says why that
    # is the default).
    kafka_group_instance_id: str | None = None
    # Kafka's session.timeout: a member silent this long is dropped from the group. A
    # static member must be back within it, or the group rebalances anyway: on tansu a
    # static member's rejoin takes about 18 s (docs/guarantees.md), longer than
    # aiokafka's default (10 s, kept for dynamic members: a frozen one is dropped sooner).
    kafka_session_timeout_s: float = 10.0
    log_level: str = "INFO"
    # Old variable names the environment still sets (logged once at start).
    deprecated: tuple[DeprecatedSetting, ...] = dataclasses.field(default=(), compare=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WorkerSettings:
        env = os.environ if env is None else env
        default = cls()
        fetch = _fetch(env)
        max_retry_after_s = _positive_seconds(env, "MAX_RETRY_AFTER_S", default.max_retry_after_s)
        dns = _dns(env)
        settings = cls(
            robots=_robots(env, fetch, max_retry_after_s, dns),
            dns=dns,
            hosts=_hosts(env),
            waiting=_waiting(env),
            kafka=KafkaSettings.from_env(env),
            redis=RedisSettings.from_env(env),
            s3=S3Settings.from_env(env),
            thumbnails=ThumbnailSettings.from_env(env),
            metrics=MetricsSettings.from_env(env),
            encoding=_encoding(env),
            fetch=fetch,
            max_tasks=env_int(env, "MAX_TASKS", default.max_tasks, minimum=1),
            image_processes=env_int(env, "IMAGE_PROCESSES", default.image_processes),
            sources_poll_s=env_float(env, "SOURCES_POLL_S", default.sources_poll_s, minimum=0.05),
            commit_interval_s=env_float(
                env, "COMMIT_INTERVAL_S", default.commit_interval_s, minimum=0.01
            ),
            copy_window_s=env_float(env, "COPY_WINDOW_S", default.copy_window_s, minimum=0.0),
            producer_linger_ms=env_int(
                env, "PRODUCER_LINGER_MS", default.producer_linger_ms, minimum=0
            ),
            token_retry_s=env_float(env, "TOKEN_RETRY_S", default.token_retry_s, minimum=0.01),
            rate_limit_timeout_s=env_float(
                env, "RATE_LIMIT_TIMEOUT_S", default.rate_limit_timeout_s, minimum=0.01
            ),
            max_attempts=env_int(env, "MAX_ATTEMPTS", default.max_attempts, minimum=1),
            max_retry_after_s=max_retry_after_s,
            shutdown_grace_s=env_float(env, "SHUTDOWN_GRACE_S", default.shutdown_grace_s),
            kafka_max_poll_interval_s=env_float(
                env, "KAFKA_MAX_POLL_INTERVAL_S", default.kafka_max_poll_interval_s, minimum=1.0
            ),
            kafka_group_instance_id=env_optional(env, "KAFKA_GROUP_INSTANCE_ID"),
            kafka_session_timeout_s=env_float(
                env, "KAFKA_SESSION_TIMEOUT_S", default.kafka_session_timeout_s, minimum=1.0
            ),
            log_level=env_str(env, "LOG_LEVEL", default.log_level),
            deprecated=deprecated_settings(env),
        )
        _check_grace(env, settings)
        return settings


def _fetch(env: Mapping[str, str]) -> FetchSettings:
    default = FetchSettings()
    return FetchSettings(
        connect_timeout_s=env_float(
            env, "FETCH_CONNECT_TIMEOUT_S", default.connect_timeout_s, minimum=0.1
        ),
        read_timeout_s=env_float(env, "FETCH_READ_TIMEOUT_S", default.read_timeout_s, minimum=0.1),
        total_timeout_s=env_float(
            env, "FETCH_TOTAL_TIMEOUT_S", default.total_timeout_s, minimum=0.1
        ),
        max_body_bytes=env_int(env, "MAX_BODY_BYTES", default.max_body_bytes, minimum=1024),
        max_bytes_in_flight=env_int(
            env, "MAX_BYTES_IN_FLIGHT", default.max_bytes_in_flight, minimum=1024 * 1024
        ),
        allowed_private_networks=_networks(env, "ALLOWED_PRIVATE_NETWORKS"),
        user_agent=_user_agent(env, "USER_AGENT"),
    )


def _check_grace(env: Mapping[str, str], settings: WorkerSettings) -> None:
    if settings.shutdown_grace_s >= settings.kafka_max_poll_interval_s:
        # A draining worker stops polling; past the poll interval Kafka drops it from
        # the group and the commit of what it drained fails (all of it runs again).
        raise ConfigError(
            f"{env_name(env, 'SHUTDOWN_GRACE_S')} ({settings.shutdown_grace_s:g}) must be "
            f"shorter than {env_name(env, 'KAFKA_MAX_POLL_INTERVAL_S')} "
            f"({settings.kafka_max_poll_interval_s:g}): a worker does not poll while it "
            "drains"
        )


def _robots(
    env: Mapping[str, str], fetch: FetchSettings, max_retry_after_s: float, dns: DnsSettings
) -> RobotsSettings:
    default = RobotsSettings()
    policy = env_str(env, "ROBOTS_POLICY", default.policy).lower()
    if policy not in ROBOTS_POLICIES:
        raise ConfigError(
            f"ROBOTS_POLICY must be one of {', '.join(ROBOTS_POLICIES)}, got {policy!r}"
        )
    token = env.get("ROBOTS_USER_AGENT", "").strip() or product_token(fetch.user_agent)
    if not PRODUCT_TOKEN.fullmatch(token):
        raise ConfigError(
            f"ROBOTS_USER_AGENT must be a product token (letters, '_' and '-', as robots.txt "
            f"files name crawlers), got {token!r}"
        )
    return RobotsSettings(
        policy="ignore" if policy == "ignore" else "obey",
        token=token,
        cache_s=_positive_seconds(env, "ROBOTS_CACHE_S", default.cache_s),
        unavailable_max_s=_positive_seconds(
            env, "ROBOTS_UNAVAILABLE_MAX_S", default.unavailable_max_s
        ),
        max_crawl_delay_s=_positive_seconds(env, "MAX_CRAWL_DELAY_S", default.max_crawl_delay_s),
        retry_base_s=_positive_seconds(env, "ROBOTS_RETRY_S", default.retry_base_s),
        max_retry_after_s=max_retry_after_s,
        fetch_timeout_s=fetch.total_timeout_s,
        dns_retry_s=dns.negative_ttl_s + 1.0,
    )


def _dns(env: Mapping[str, str]) -> DnsSettings:
    default = DnsSettings()
    try:
        servers = parse_servers(env.get("DNS_SERVERS", ""))
    except ValueError as e:
        raise ConfigError(
            f"DNS_SERVERS: {e} (expected addresses with an optional port, such as "
            "10.0.0.53 or 127.0.0.1:5353, comma separated)"
        ) from None
    min_ttl_s = env_float(env, "DNS_MIN_TTL_S", default.min_ttl_s)
    max_ttl_s = _positive_seconds(env, "DNS_MAX_TTL_S", default.max_ttl_s)
    if min_ttl_s > max_ttl_s:
        raise ConfigError(
            f"DNS_MIN_TTL_S ({min_ttl_s:g}) must not be above DNS_MAX_TTL_S ({max_ttl_s:g})"
        )
    return dataclasses.replace(
        default,
        servers=servers,
        min_ttl_s=min_ttl_s,
        max_ttl_s=max_ttl_s,
        negative_ttl_s=_positive_seconds(env, "DNS_NEGATIVE_TTL_S", default.negative_ttl_s),
        max_in_flight=env_int(env, "DNS_MAX_IN_FLIGHT", default.max_in_flight, minimum=1),
        cache_entries=env_int(env, "DNS_CACHE_ENTRIES", default.cache_entries, minimum=1),
    )


def _hosts(env: Mapping[str, str]) -> HostSettings:
    default = HostSettings()
    pacing_key = env_str(env, "PACING_KEY", default.pacing_key).lower()
    if pacing_key not in PACING_KEYS:
        raise ConfigError(f"PACING_KEY must be one of {', '.join(PACING_KEYS)}, got {pacing_key!r}")
    max_host_rps = env_float(env, "MAX_HOST_RATE", math.inf, minimum=0.001)
    return dataclasses.replace(
        default,
        pacing_key=pacing_key,
        max_host_rps=None if max_host_rps == math.inf else max_host_rps,
        give_up_s=_positive_seconds(env, "HOST_GIVE_UP_S", default.give_up_s),
    )


# The worker's encoding, for the messages that ask none: img2dataset's option names as
# variables. None set: the original's 640 px thumbnail.
ENCODING_VARIABLES: Final = {
    "IMAGE_SIZE": "image_size",
    "RESIZE_MODE": "resize_mode",
    "RESIZE_ONLY_IF_BIGGER": "resize_only_if_bigger",
    "ENCODE_FORMAT": "encode_format",
    "ENCODE_QUALITY": "encode_quality",
    "MIN_IMAGE_SIZE": "min_image_size",
    "MAX_IMAGE_AREA": "max_image_area",
    "MAX_ASPECT_RATIO": "max_aspect_ratio",
}
_TRUE: Final = ("1", "true", "yes", "on")
_FALSE: Final = ("0", "false", "no", "off")


def _encoding(env: Mapping[str, str]) -> contract.Encoding | None:
    given = {
        field: env[name].strip()
        for name, field in ENCODING_VARIABLES.items()
        if env.get(name, "").strip()
    }
    if not given:
        return None
    values: dict[str, object] = {}
    for name, field in ENCODING_VARIABLES.items():
        if field not in given:
            continue
        raw = given[field]
        if field in ("resize_mode", "encode_format"):
            values[field] = raw.lower()
        elif field == "resize_only_if_bigger":
            if raw.lower() not in _TRUE + _FALSE:
                raise ConfigError(f"{name} must be true or false, got {raw!r}")
            values[field] = raw.lower() in _TRUE
        elif field == "max_aspect_ratio":
            values[field] = env_float(env, name, math.inf, minimum=1.0)
        else:
            values[field] = env_int(env, name, 0)
    try:
        return contract.Encoding(**values)  # type: ignore[arg-type]
    except ValueError as e:
        names = ", ".join(n for n, f in ENCODING_VARIABLES.items() if f in given)
        raise ConfigError(f"{names}: {e}") from None


def _waiting(env: Mapping[str, str]) -> HostQueueSettings:
    default = HostQueueSettings()
    return dataclasses.replace(
        default,
        max_waiting=env_int(env, "MAX_WAITING_URLS", default.max_waiting, minimum=1),
        park_after_s=_positive_seconds(env, "PARK_AFTER_S", default.park_after_s),
    )


def _networks(env: Mapping[str, str], name: str) -> tuple[IPNetwork, ...]:
    try:
        return parse_networks(env.get(name, ""))
    except ValueError as e:
        raise ConfigError(
            f"{name}: {e} (expected CIDRs such as 127.0.0.0/8, comma separated)"
        ) from None


# Control characters (tab aside) cannot be in a header value; CR and LF would even start
# a header of their own.
_CONTROL_CHARACTERS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def _user_agent(env: Mapping[str, str], name: str) -> str:
    # Empty means the default, as for every other setting (docker-compose passes an unset
    # variable through as an empty one).
    value = env.get(name, "").strip()
    if not value:
        return DEFAULT_USER_AGENT
    bad = _CONTROL_CHARACTERS.search(value)
    if bad is not None:
        what = {"\r": "a carriage return (CR)", "\n": "a line feed (LF)"}.get(
            bad.group(), f"the control character {bad.group()!r}"
        )
        raise ConfigError(f"{name} must be one line of text for a header; it contains {what}")
    return value


def _positive_seconds(env: Mapping[str, str], name: str, default: float) -> float:
    value = env_float(env, name, default)
    if not (value > 0 and math.isfinite(value)):
        raise ConfigError(f"{env_name(env, name)} must be a number of seconds above 0, got {value}")
    return value
