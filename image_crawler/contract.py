"""The crawler's outside contract, defined once: topics, Redis keys, statuses, messages.

Both processes import their names from here; the documentation says the same in prose
(docs/output.md, and the key table in docs/politeness.md). Every message type has
``to_json``/``from_json`` so its shape lives in one place, and decoding failures raise
``MalformedMessage`` with a reason fit for a log line.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

# --- Kafka topics --------------------------------------------------------------------
INBOUND_TOPIC: Final = "inbound_images"
# One topic per source, written by the splitter (keyed by uuid) and, beyond the original
# (issue 36), by the workers themselves: a URL whose host cannot take it for long is
# *parked*, its message appended again unchanged (same key) before the original is
# committed (worker/host_queues.py). A uuid may so appear more than once in a topic.
SOURCE_TOPIC_PREFIX: Final = "urls."
METADATA_TOPIC: Final = "image_metadata_updates"
LINK_ROT_TOPIC: Final = "link_rot"
CRAWL_ERRORS_TOPIC: Final = "crawl_errors"
# Beyond the original (issue 30): one message per re-check (an inbound message carrying
# an earlier crawl's etag, last_modified or sha256), LinkCheckMessage.
LINK_CHECKS_TOPIC: Final = "link_checks"
# Beyond the original (issue 54): one message per crawled image, the cluster of the same
# photograph it is placed in (DuplicateMessage), by the deduplication stage (dedup/).
DUPLICATES_TOPIC: Final = "image_duplicates"

SPLITTER_GROUP: Final = "splitter"
WORKER_GROUP: Final = "image_handlers"
DEDUP_GROUP: Final = "deduplication"

# Kafka's own rule for topic names: at most 249 of [a-zA-Z0-9._-]. The prefix takes 5.
_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
MAX_SOURCE_NAME_LENGTH: Final = 249 - len(SOURCE_TOPIC_PREFIX)


def source_topic(source: str) -> str:
    """The per-source queue for ``source`` (already lower-cased by the splitter)."""
    return f"{SOURCE_TOPIC_PREFIX}{source}"


def source_of_topic(topic: str) -> str | None:
    """The source whose queue ``topic`` is, or None for any other topic."""
    if topic.startswith(SOURCE_TOPIC_PREFIX) and len(topic) > len(SOURCE_TOPIC_PREFIX):
        return topic[len(SOURCE_TOPIC_PREFIX) :]
    return None


def is_valid_source_name(source: str) -> bool:
    """True when ``urls.{source}`` is a legal Kafka topic name."""
    return len(source) <= MAX_SOURCE_NAME_LENGTH and bool(_TOPIC_NAME.match(source))


# --- Redis keys ----------------------------------------------------------------------
# The original's token bucket. Nothing reads or writes it since pacing replaced it (see
# PACE_RATE_PREFIX): kept so that `image-crawler halt` can still zero a bucket an older
# worker of a rolling upgrade may be reading.
TOKENS_PREFIX: Final = "currtokens:"
# Pacing (replaces currtokens:{source}). The rate (requests/s, a float) the leading monitor
# grants the source now: its configured rate (computed or overridden, and at most one
# request per robots.txt Crawl-delay, see CRAWL_DELAY_PREFIX), cut while the
# source's server pushes back; "0" while the source is halted. SET every loop with a short
# expiry (PACE_RATE_TTL_MS): no monitor, no rate, no request.
PACE_RATE_PREFIX: Final = "pace_rate:"
# The earliest Unix time (seconds, "%.6f") at which the next request to the source may
# start: the theoretical arrival time of the generic cell rate algorithm, advanced by
# 1/rate for each request a worker is granted, and pushed forward by a Retry-After.
# Written by the workers' pacing script only; it expires a little after it has passed.
PACE_NEXT_PREFIX: Final = "pace_next:"
# How many backoff signals (BACKOFF_STATUSES, and responses much slower than the source's
# usual) workers saw, an integer the monitor reads every loop to cut the source's rate.
BACKOFF_SIGNALS_PREFIX: Final = "backoff_signals:"
OVERRIDE_RATE_PREFIX: Final = "override_rate:"
OVERRIDE_RATE_ALIAS_PREFIX: Final = "override-rate:"
HALTED_SET: Final = "halted"
TEMP_HALTED_SET: Final = "temp_halted"
STATUS_60S_PREFIX: Final = "status60s:"
STATUS_1HR_PREFIX: Final = "status1hr:"
STATUS_12HR_PREFIX: Final = "status12hr:"
LAST_50_PREFIX: Final = "statuslast50req:"
NUM_RESIZED: Final = "num_resized"
RESIZE_ERRORS: Final = "resize_errors"
INBOUND_SOURCES_SET: Final = "inbound_sources"
NUM_SPLIT: Final = "num_split"
# Beyond the original: messages that could not be parsed, per consuming process.
NUM_MALFORMED: Final = "num_malformed"
# Beyond the original: each source's pacing as the leading monitor decided it, a hash of
# source -> ``PacingInfo`` JSON (effective and configured rate, why, and when), for operators
# (`redis-cli hgetall crawl_rates`) and `image-crawler status`, and for the next leader,
# which resumes each cut from it instead of starting at the configured rate.
RATES_HASH: Final = "crawl_rates"
# Beyond the original: which crawl monitor leads. Only the holder writes pacing rates and
# runs the breakers, so that two monitors never double a rate. A string, the holder's token
# ("{host}:{pid}:{random}"), with an expiry the holder renews every loop; a standby monitor
# takes it once it expires (or is released on a clean stop) and refills from its next loop.
MONITOR_LEADER_KEY: Final = "monitor_leader"
# Beyond the original: robots.txt (RFC 9309). What a host's /robots.txt said, one string
# per host ("robots:{scheme}://{host}:{port}", the key a worker builds with robots_key),
# compact JSON written by the worker that fetched it (worker/politeness/robots.py,
# RobotsEntry.to_json: "v" 2, "s" status, "f"/"e" fetched/expires at, "u" unavailable
# since, "n" failures, "d" the first 16 hex digits of the file's SHA-256, "t" the product
# token the rules were decided for, "r" the rules, "m" the tdmrep.json rules; "rz"/"mz"
# the same deflated and base85-encoded where that is shorter): after a 2xx, the lines of
# the file that apply to "t" (at most ROBOTS_MAX_BYTES read), or the whole file without
# "t" when no shorter; "allow everything" after a 4xx, or "unavailable, ask again at
# ..." after a 5xx, 429, timeout or network error. An entry of the format before (long
# names, the whole file in "text") is still read; one decided for another token is
# fetched again. Expires after
# ROBOTS_CACHE_S (or, unavailable, ROBOTS_UNAVAILABLE_MAX_S after the first failure).
# A host whose name did not resolve (status DnsError) is asked again after
# DNS_NEGATIVE_TTL_S, and its entry expires a minute after that.
# Its "m" is the host's /.well-known/tdmrep.json (TDMREP_PATH), fetched right after the
# file when it is available, under the same limits: its readable rules after a 2xx with
# rules, else absent (no reservation known).
ROBOTS_PREFIX: Final = "robots:"
# Held (SET NX, with an expiry) by the one worker fetching a host's robots.txt, so that the
# cluster fetches it once; the others wait for ``robots:{origin}``.
ROBOTS_LOCK_PREFIX: Final = "robots_lock:"
# A set of sources whose robots.txt is not obeyed: an operator has the sites' permission
# (`image-crawler robots-exempt SOURCE`, or `redis-cli sadd robots_exempt SOURCE`).
ROBOTS_EXEMPT_SET: Final = "robots_exempt"
# The largest Crawl-delay (seconds, at most the worker's MAX_CRAWL_DELAY_S) of the hosts
# of a source that workers have read robots.txt files of; it expires with the files
# (ROBOTS_CACHE_S). The leading monitor caps the source's rate at 1 / delay, trusting the
# value as written. The sources that have one are
# listed in the set CRAWL_DELAYED_SET, which the monitor reads every loop (and cleans).
CRAWL_DELAY_PREFIX: Final = "crawl_delay:"
CRAWL_DELAYED_SET: Final = "crawl_delayed"
# Politeness per host (issue 36): the host is the unit of politeness inside a source.
# Each host's pacing state, a hash "pace_host:{source}:{host}" (the host lower-cased, or
# its registered domain under PACING_KEY=domain), written by the workers' pacing script
# where slots are granted (worker/politeness/hosts.py says what each field means): its
# next slot, adaptive rate, robots.txt Crawl-delay and breaker. It expires once the host
# has been idle for a while (10 minutes, longer while it is halted or Crawl-delayed).
# Operators write two of its fields: "halt" (any text: the host gets no request until it
# is removed) and "override" (the host's rate, requests/s, under the source's); a hash
# holding either never expires.
PACE_HOST_PREFIX: Final = "pace_host:"
# The operator's ceiling (requests/s, a float) for any one host of a source; unset: the
# worker's MAX_HOST_RATE, or the source's rate.
HOST_RATE_PREFIX: Final = "host_rate:"
# Which hosts a source's outcomes came from in the last minute, for its breakers (a host
# never halts its source, see crawl_monitor/policy/breakers.py): sorted sets of host ->
# Unix time of its latest outcome ("hosts60s:{source}"), and of its latest error that is
# not a backoff status ("error_hosts60s:{source}"). Written by the workers' stats flush,
# in the same call as the windows: trimmed to the last 60 s and to the newest
# SPREAD_HOSTS_KEPT members, and expiring SPREAD_KEYS_TTL_S after the last outcome.
HOSTS_60S_PREFIX: Final = "hosts60s:"
ERROR_HOSTS_60S_PREFIX: Final = "error_hosts60s:"
SPREAD_HOSTS_KEPT: Final = 1000
SPREAD_KEYS_TTL_S: Final = 120
# Beyond the original (issue 18): each source's backlog, the consumer lag of the workers'
# group (image_handlers) on urls.{source}, summed over partitions: URLs split but not yet
# taken. A hash source -> count, rewritten by the monitor each
# LOG_FREQUENCY_S (crawl_monitor/backlog.py); BACKLOG_AT holds the Unix time (seconds)
# of that measurement, so that a reader can tell a stale figure (no monitor) from a fresh one.
BACKLOG_HASH: Final = "backlog"
BACKLOG_AT: Final = "backlog_measured_at"
# Beyond the original (issue 18): URLs a worker found deleted unread (its group's
# committed offset was below the log start of urls.{source}), per source; the worker also
# logs ``urls_lost``.
URLS_LOST: Final = "urls_lost"
# Beyond the original: the whole crawl is paused while this key exists, whatever its
# source's state. Its value is a ``CrawlPause`` (JSON; any other text is an operator's
# pause, its text the reason). ``image-crawler up`` SETs it when its data folder's disk
# has less free space than DISK_RESERVE_MB and DELs it once space is back; the leading
# monitor then paces every source at 0 (workers start no request) and no monitor splits
# ``inbound_images``, until it is gone. Log events: ``disk_full``,
# ``disk_space_recovered`` (``up``), ``crawl_paused``, ``crawl_pause_lifted`` (monitor).
CRAWL_PAUSED_KEY: Final = "crawl_paused"
PAUSE_DISK_FULL: Final = "disk_full"
PAUSE_OPERATOR: Final = "operator"

# Beyond the original (issue 30): re-checks ended, per source and LinkCheckMessage status,
# a hash of "{source}:{status}" -> count that the workers' stats flush HINCRBYs. One hash,
# not a key per source and status: a reader gets the counts of the sources that have any
# with one HGETALL, where 10,000 sources would otherwise cost it 40,000 mostly empty
# replies every LOG_FREQUENCY_S (measured: the monitor's counters read went from 73 to
# 142 ms). A source name never holds ":", so the field splits at its last one.
RECHECKS_HASH: Final = "rechecks"
# Beyond the original (issue 38): which per-status error counters exist, a set of their
# names (resize_errors:{source}:{status}) that the workers' stats flush SADDs in the same
# call as it INCRs them. `image-crawler status` reads the counters it names instead of
# SCANning the keyspace for them: with a million hosts' keys a SCAN took 9 s.
# ERROR_REASONS_COMPLETE exists once the set names every counter, those written before it
# was kept included (image_crawler/error_reasons.py fills it in: the monitor at its
# start, `status` when it has to SCAN); without it readers SCAN, as before.
ERROR_REASONS_SET: Final = "error_reasons"
ERROR_REASONS_COMPLETE: Final = "error_reasons_complete"
# Beyond the original (issue 38): each worker's resolver figures (queries, cache hits,
# failures by kind, names cached), a hash of worker name -> JSON written by the worker
# every DNS_REPORT_EVERY_S and deleted when it stops (image_crawler/dns_stats.py), for
# `image-crawler status` and the monitor's dashboard. A field older than DNS_STALE_S is a
# worker that stopped reporting; the next report of any worker deletes those older than
# DNS_FORGET_S, so that workers gone without a goodbye do not pile up.
DNS_WORKERS_HASH: Final = "dns_workers"
DNS_REPORT_EVERY_S: Final = 5.0
DNS_STALE_S: Final = 60.0
DNS_FORGET_S: Final = 3600.0
# Beyond the original (issue 53): the offsets of a worker queue's partition finished past
# its committed offset, a sorted set of "{offset}:{crc32 of the message, 8 hex digits}"
# scored by the offset (finished_key), written by the worker that owns the partition as
# they end (20 ms later) and at each commit, and read by whoever is assigned it next,
# who counts those messages finished without fetching them again (worker/finished.py).
# A revoke also marks there the messages whose request is still running after its wait,
# "{offset}:r{until, Unix ms}":
# the next owner holds them back until the old one replaces the marker (by the finished
# member, or by nothing when it gave up) or until passes. Entries below the commit are
# removed; the key expires 14 days after its last write.
FINISHED_PREFIX: Final = "finished:"
# Beyond the original (issue 53): the messages of a worker queue's partition crawled to
# their end lately, a sorted set of 8-byte BLAKE2b digests of the message (16 hex digits)
# scored by when (Unix ms), written with the finished offsets by the partition's owner
# and asked for every record it reads: a copy of one crawled within COPY_WINDOW_S (a send the broker
# stored twice) is counted finished without a request (worker/copies.py). Older digests
# are removed at each write; the key expires a window after its last one.
CRAWLED_PREFIX: Final = "crawled:"

# Beyond the original (issue 54): the deduplication stage's placements per source and
# kind (DUPLICATE_KINDS: exact, near, unique), a hash of "{source}:{kind}" -> count, for
# `image-crawler status`, the monitor's dashboard and its /metrics. The stage HSETs
# absolute values it keeps in its own durable state (dedup/counts.py), never HINCRBY: an
# input read again after a crash is placed again, and counted once. Written after each
# batch, and whole after a restart or an outage; Redis away delays it, never the stage.
# One hash, as RECHECKS_HASH and for its reason; a source an older worker did not name
# is "" (the field ":exact"). A source name never holds ":", so a field splits at its last.
PLACEMENTS_HASH: Final = "dedup_placements"

LAST_N_STATUSES: Final = 50
# (key prefix, window length in seconds) of the time-based sliding windows.
STATUS_WINDOWS: Final[tuple[tuple[str, float], ...]] = (
    (STATUS_60S_PREFIX, 60.0),
    (STATUS_1HR_PREFIX, 3600.0),
    (STATUS_12HR_PREFIX, 43200.0),
)


def finished_key(topic: str, partition: int) -> str:
    return f"{FINISHED_PREFIX}{topic}:{partition}"


def crawled_key(topic: str, partition: int) -> str:
    return f"{CRAWLED_PREFIX}{topic}:{partition}"


def tokens_key(source: str) -> str:
    return f"{TOKENS_PREFIX}{source}"


def pace_rate_key(source: str) -> str:
    return f"{PACE_RATE_PREFIX}{source}"


def pace_next_key(source: str) -> str:
    return f"{PACE_NEXT_PREFIX}{source}"


def override_key(source: str) -> str:
    return f"{OVERRIDE_RATE_PREFIX}{source}"


def override_alias_key(source: str) -> str:
    return f"{OVERRIDE_RATE_ALIAS_PREFIX}{source}"


def backoff_signals_key(source: str) -> str:
    return f"{BACKOFF_SIGNALS_PREFIX}{source}"


def robots_key(origin: str) -> str:
    """``origin`` is "{scheme}://{host}:{port}", the port always written."""
    return f"{ROBOTS_PREFIX}{origin}"


def robots_lock_key(origin: str) -> str:
    return f"{ROBOTS_LOCK_PREFIX}{origin}"


def crawl_delay_key(source: str) -> str:
    return f"{CRAWL_DELAY_PREFIX}{source}"


def pace_host_key(source: str, host: str) -> str:
    # A source name never holds ":", so the key splits at its first one.
    return f"{PACE_HOST_PREFIX}{source}:{host}"


def host_rate_key(source: str) -> str:
    return f"{HOST_RATE_PREFIX}{source}"


def last50_key(source: str) -> str:
    return f"{LAST_50_PREFIX}{source}"


def hosts60s_key(source: str) -> str:
    return f"{HOSTS_60S_PREFIX}{source}"


def error_hosts60s_key(source: str) -> str:
    return f"{ERROR_HOSTS_60S_PREFIX}{source}"


def num_resized_key(source: str) -> str:
    return f"{NUM_RESIZED}:{source}"


def resize_errors_key(source: str, status: str | None = None) -> str:
    if status is None:
        return f"{RESIZE_ERRORS}:{source}"
    return f"{RESIZE_ERRORS}:{source}:{status}"


def rechecks_field(source: str, status: str) -> str:
    """The field of RECHECKS_HASH that counts ``source``'s re-checks that found ``status``
    (one of RECHECK_STATUSES)."""
    return f"{source}:{status}"


def source_and_check(field: str) -> tuple[str, str]:
    """The (source, status) a field of RECHECKS_HASH counts."""
    source, _, status = field.rpartition(":")
    return source, status


def placements_field(source: str, kind: str) -> str:
    """The field of PLACEMENTS_HASH that counts ``source``'s images placed as ``kind``
    (one of DUPLICATE_KINDS)."""
    return f"{source}:{kind}"


def source_and_kind(field: str) -> tuple[str, str]:
    """The (source, kind) a field of PLACEMENTS_HASH counts."""
    source, _, kind = field.rpartition(":")
    return source, kind


def urls_lost_key(source: str) -> str:
    return f"{URLS_LOST}:{source}"


def window_member(status: str, unix_time_s: float) -> str:
    """A sliding-window member, ``"{status}:{time}"``."""
    return f"{status}:{unix_time_s:.6f}"


def status_of_window_member(member: str) -> str:
    return member.split(":", 1)[0]


# --- The host index: what operators see of hosts (issue 36) -----------------------------
# Each source's hosts by how the workers' pacing script last paced them: a sorted set
# "host_index:{source}" of host -> HOST_INDEX_BAND x its state's place in HOST_STATES + the
# Unix time (s, Redis' clock, to the ms) it was last asked about (host_index_score), so
# that a host is one member in one band, and the hosts of one state asked about in the
# last HOST_ACTIVE_S are one ZCOUNT. Written only by the pacing script
# (worker/politeness/lua/pacing_acquire.lua) as it decides slots: a host's member at once
# when its state changes, else at most every HostSettings.index_refresh_s (10 s) while it
# is asked about, in one ZADD per source and ask; the host's hash (pace_host:) keeps what
# was written in its fields "why" (HOST_WHY) and "seen". Read, never SCANned, by the
# monitor every LOG_FREQUENCY_S (/metrics, the dashboard) and by `image-crawler status`
# (image_crawler/host_index.py). Members idle longer than HOST_IDLE_S are removed when
# their band is next written; the key expires HOST_IDLE_S after its last write.
HOST_INDEX_PREFIX: Final = "host_index:"
# A band per state: Unix times stay below it until the year 2286.
HOST_INDEX_BAND: Final = 1e10
# A host asked about this recently (s) is active.
HOST_ACTIVE_S: Final = 60.0
# How long an idle host's hash is kept (s): the pacing rule's default idle expiry
# (worker/politeness/hosts.py, HostSettings.idle_s), and the host index's trim.
HOST_IDLE_S: Final = 600.0
HOST_AT_PACE: Final = "at_pace"  # nothing of its own slows it: it goes at its source's pace
HOST_PACED: Final = "paced"  # paced below its source's rate by a rule of its own
HOST_BACKED_OFF: Final = "backed_off"  # its server pushed back: its rate was cut
HOST_HALTED: Final = "halted"  # it gets no request now
# In band order: a state's place is its band.
HOST_STATES: Final = (HOST_AT_PACE, HOST_PACED, HOST_BACKED_OFF, HOST_HALTED)
# Why a host is in its state: the hash's "why" field, as the pacing script decided it.
WHY_PACE: Final = "pace"  # its interval is its source's or shorter
WHY_SLOW_START: Final = "slow"  # a new host, climbing from its start rate
WHY_CRAWL_DELAY: Final = "delay"  # its robots.txt Crawl-delay is the longer interval
WHY_CAP: Final = "cap"  # its ceiling (override, host_rate:{source}, MAX_HOST_RATE)
WHY_CLIMB: Final = "climb"  # climbing to its ceiling, which rose (no cut)
WHY_CUT: Final = "cut"  # cut by 429s, 503s, timeouts or slow answers; climbing back
WHY_BREAKER: Final = "halt"  # halted by its breaker until its "until"
WHY_OPERATOR: Final = "op"  # halted by an operator (its "halt" field)
WHY_GONE: Final = "gone"  # given up: its URLs end as HostUnavailable
HOST_WHY: Final[Mapping[str, str]] = {
    WHY_PACE: HOST_AT_PACE,
    WHY_SLOW_START: HOST_PACED,
    WHY_CRAWL_DELAY: HOST_PACED,
    WHY_CAP: HOST_PACED,
    WHY_CLIMB: HOST_PACED,
    WHY_CUT: HOST_BACKED_OFF,
    WHY_BREAKER: HOST_HALTED,
    WHY_OPERATOR: HOST_HALTED,
    WHY_GONE: HOST_HALTED,
}


# The fields of a pace_host hash that operators write (`image-crawler halt|resume|override
# --host`, or redis-cli): "halt" (any text: why; no request until it is removed) and
# "override" (the host's rate, requests/s); a hash holding either is kept for good, its
# "exp" (the expiry last set) "". Resuming a host removes "halt" and its breaker's fields.
HOST_HALT_FIELD: Final = "halt"
HOST_OVERRIDE_FIELD: Final = "override"
HOST_EXPIRES_FIELD: Final = "exp"
HOST_BREAKER_FIELDS: Final = ("fails", "since", "until", "halts", "gone")


def host_index_key(source: str) -> str:
    return f"{HOST_INDEX_PREFIX}{source}"


def host_index_score(state: str, unix_s: float) -> float:
    """A host's score in its source's host index: ``state``'s band + ``unix_s``."""
    return HOST_STATES.index(state) * HOST_INDEX_BAND + unix_s


@dataclasses.dataclass(frozen=True, slots=True)
class HostIndexEntry:
    """What a host index score says: the host's state, and when it was last asked
    about (Unix s); ``state`` is None for a score in no band."""

    state: str | None
    asked_at_s: float

    @classmethod
    def of(cls, score: float) -> HostIndexEntry:
        band = math.floor(score / HOST_INDEX_BAND)
        state = HOST_STATES[band] if 0 <= band < len(HOST_STATES) else None
        return cls(state, score - band * HOST_INDEX_BAND)


# --- Statuses ------------------------------------------------------------------------
class Status(enum.StrEnum):
    """The outcome of one URL: an HTTP code as a string, or an error name.

    The members are every status the crawler names; other HTTP codes travel as their
    digits ("418"). A member equals its string, so statuses read back from Redis or Kafka
    compare equal to them. ``Status.expected``, ``.retried`` and ``.backoff`` say what a
    status means: whether the sets below (``EXPECTED_STATUSES``, ``RETRYABLE_STATUSES``,
    ``BACKOFF_STATUSES``) hold it.
    """

    OK = "200"
    MULTIPLE_CHOICES = "300"
    MOVED_PERMANENTLY = "301"
    FOUND = "302"
    NOT_MODIFIED = "304"  # a re-check's conditional request: the file is unchanged
    BAD_REQUEST = "400"
    UNAUTHORIZED = "401"
    FORBIDDEN = "403"
    NOT_FOUND = "404"  # to link_rot
    GONE = "410"  # to link_rot when a re-check sees it; to crawl_errors otherwise
    TOO_MANY_REQUESTS = "429"
    INTERNAL_SERVER_ERROR = "500"
    BAD_GATEWAY = "502"
    SERVICE_UNAVAILABLE = "503"
    GATEWAY_TIMEOUT = "504"
    # The download (worker/download/fetch.py).
    TIMEOUT = "Timeout"
    SERVER_DISCONNECTED = "ServerDisconnected"
    CONNECTION_ERROR = "ConnectionError"
    BLOCKED = "Blocked"  # a non-public address, refused before connecting
    # The host's name did not resolve: NXDOMAIN or no address, or no answer after the
    # resolver's tries (worker/download/dns.py). Never a request; final, as a 404 is (to
    # crawl_errors), and never a breaker error: a host never halts its source.
    DNS_ERROR = "DnsError"
    INVALID_URL = "InvalidURL"
    TOO_LARGE = "TooLarge"
    TOO_MANY_REDIRECTS = "TooManyRedirects"
    PAYLOAD_ERROR = "PayloadError"
    BAD_RESPONSE = "BadResponse"
    CLIENT_ERROR = "ClientError"
    # The image (worker/images/kernel.py, worker/images/pool.py).
    UNIDENTIFIED_IMAGE = "UnidentifiedImageError"
    DECOMPRESSION_BOMB = "DecompressionBombError"
    IMAGE_DECODE_ERROR = "ImageDecodeError"
    PROCESS_CRASHED = "ProcessCrashed"
    # The image is outside what its message's encoding accepts (Encoding: min_image_size,
    # max_image_area, max_aspect_ratio), img2dataset's filters: the asker's choice, never
    # the server's fault, so expected.
    IMAGE_TOO_SMALL = "ImageTooSmall"
    IMAGE_AREA_TOO_LARGE = "ImageAreaTooLarge"
    ASPECT_RATIO_TOO_LARGE = "AspectRatioTooLarge"
    # The message.
    MALFORMED = "Malformed"
    INTERNAL_ERROR = "InternalError"  # a bug: the message is dead-lettered
    # robots.txt: URLs never requested.
    ROBOTS_DISALLOWED = "RobotsDisallowed"  # the host's robots.txt disallows it
    # Its host's robots.txt could not be fetched for ROBOTS_UNAVAILABLE_MAX_S.
    ROBOTS_UNAVAILABLE = "RobotsUnavailable"
    # The server asked that the image not be indexed (X-Robots-Tag noindex, noimageindex,
    # none or a past unavailable_after; robots.txt Content-Signal search=no): no
    # thumbnail, no metadata; crawl_errors carries the directives that said so.
    NO_INDEX = "NoIndex"
    # Its host stayed failing for HOST_GIVE_UP_S (worker/politeness/hosts.py): not tried
    # again, and never a breaker error (a host never halts its source).
    HOST_UNAVAILABLE = "HostUnavailable"
    # Written by the original crawler's workers for a URL that got no token; nothing
    # writes it now, but the status windows of a crawl upgraded in place may still hold
    # it, and it was never an error.
    LEGACY_NO_RATE_TOKEN = "NoRateToken"

    @staticmethod
    def expected(status: str) -> bool:
        """An expected outcome: never a breaker error."""
        return status in EXPECTED_STATUSES

    @staticmethod
    def retried(status: str) -> bool:
        """Tried again by the worker that saw it."""
        return status in RETRYABLE_STATUSES

    @staticmethod
    def backoff(status: str) -> bool:
        """A server asking us to slow down."""
        return status in BACKOFF_STATUSES


# What a resolution message's ``opt_outs`` may name: X-Robots-Tag's noai and noimageai,
# TDMRep's reservation (header or /.well-known/tdmrep.json), and robots.txt Content
# Signals' ai-train=no and ai-input=no.
OPT_OUTS: Final = ("noai", "noimageai", "tdm-reservation", "ai-train", "ai-input")
# A host's /.well-known/tdmrep.json is read with its robots.txt, under the same limits,
# and cached with it (robots:{origin}).
TDMREP_PATH: Final = "/.well-known/tdmrep.json"

# These never trip a breaker.
EXPECTED_STATUSES: Final[frozenset[str]] = frozenset(
    {
        Status.OK,
        Status.MULTIPLE_CHOICES,
        Status.MOVED_PERMANENTLY,
        Status.FOUND,
        Status.NOT_MODIFIED,
        Status.NOT_FOUND,
        Status.UNIDENTIFIED_IMAGE,
        Status.IMAGE_TOO_SMALL,
        Status.IMAGE_AREA_TOO_LARGE,
        Status.ASPECT_RATIO_TOO_LARGE,
        Status.ROBOTS_DISALLOWED,
        Status.ROBOTS_UNAVAILABLE,
        Status.NO_INDEX,
        Status.HOST_UNAVAILABLE,
        Status.DNS_ERROR,
        Status.LEGACY_NO_RATE_TOKEN,
    }
)
# Tried again by the worker that saw them, after an exponential backoff with jitter (and
# never before a Retry-After has passed), up to MAX_ATTEMPTS tries in all.
RETRYABLE_STATUSES: Final[frozenset[str]] = frozenset(
    {
        Status.BAD_REQUEST,
        Status.UNAUTHORIZED,
        Status.FORBIDDEN,
        Status.TOO_MANY_REQUESTS,
        Status.INTERNAL_SERVER_ERROR,
        Status.BAD_GATEWAY,
        Status.SERVICE_UNAVAILABLE,
        Status.GATEWAY_TIMEOUT,
        Status.SERVER_DISCONNECTED,
    }
)
# A server asking us to slow down: each one is a backoff signal that cuts the source's
# rate. While the rate is above its floor they are not breaker errors (the rate is still
# falling); at the floor they count as errors again.
BACKOFF_STATUSES: Final[frozenset[str]] = frozenset(
    {Status.TOO_MANY_REQUESTS, Status.SERVICE_UNAVAILABLE, Status.TIMEOUT}
)
# Whose Retry-After holds back the whole source.
RETRY_AFTER_STATUSES: Final[frozenset[str]] = frozenset(
    {Status.TOO_MANY_REQUESTS, Status.SERVICE_UNAVAILABLE}
)
# A URL is attempted at most this many times in all (MAX_ATTEMPTS), counting the
# ``attempts`` an inbound message already carries.
MAX_ATTEMPTS: Final = 5
# The longest Retry-After obeyed (MAX_RETRY_AFTER_S); longer ones are capped and logged.
MAX_RETRY_AFTER_S: Final = 3600.0
# Seconds between the monitor's monitoring_update events (LOG_FREQUENCY_S).
LOG_FREQUENCY_S: Final = 5.0
# On SIGTERM, how long the monitor's splitter may take to finish its batch before it is
# cancelled: whoever stops a monitor waits at least this long.
MONITOR_STOP_GRACE_S: Final = 30.0

# robots.txt: how long a host's file is cached for the whole cluster (ROBOTS_CACHE_S, the
# RFC's ceiling of 24 hours); how long its URLs wait while it cannot be fetched
# (ROBOTS_UNAVAILABLE_MAX_S); the longest Crawl-delay obeyed (MAX_CRAWL_DELAY_S); how much
# of a file is read (the RFC asks for at least 500 KiB) and how many redirects followed.
ROBOTS_CACHE_S: Final = 86400.0
ROBOTS_UNAVAILABLE_MAX_S: Final = 86400.0
MAX_CRAWL_DELAY_S: Final = 60.0
ROBOTS_MAX_BYTES: Final = 512 * 1024
ROBOTS_MAX_REDIRECTS: Final = 5

RAW_MESSAGE_CAP_BYTES: Final = 4096

# What a re-check found (LinkCheckMessage.status): the server answered 304, or 200 with
# the body of the earlier crawl (same sha256); a 200 with another body, crawled again; a
# 404 or 410; or a failure that will not be tried again (also in crawl_errors).
CHECK_UNCHANGED: Final = "unchanged"
CHECK_CHANGED: Final = "changed"
CHECK_GONE: Final = "gone"
CHECK_FAILED: Final = "failed"
RECHECK_STATUSES: Final = (CHECK_UNCHANGED, CHECK_CHANGED, CHECK_GONE, CHECK_FAILED)
# The longest ETag or Last-Modified value a re-check carries, or a resolution message
# reports: a header line is capped near 8 KiB anyway, and no real validator is close.
MAX_VALIDATOR_CHARS: Final = 1024

# Retention of the urls.{source} topics the splitter creates (URL_TOPIC_RETENTION_MS):
# -1, never delete, because a backlog may wait longer than any broker default (7 days on
# Apache Kafka) and a deleted URL is one the crawl never ends.
URL_TOPIC_RETENTION_MS: Final = -1


def utc_now_iso() -> str:
    """Wall-clock time as ISO-8601 with an explicit UTC offset."""
    return datetime.now(UTC).isoformat()


# --- Messages ------------------------------------------------------------------------
class MalformedMessage(ValueError):
    """A message that cannot be decoded into the shape its topic promises."""


def _decode_object(raw: bytes | str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MalformedMessage(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise MalformedMessage(f"not a JSON object but {type(value).__name__}")
    return value


def _required_str(obj: dict[str, Any], field: str) -> str:
    value = obj.get(field)
    if not isinstance(value, str) or not value.strip():
        raise MalformedMessage(f"field {field!r} is missing, empty or not a string")
    return value.strip()


def _attempts(obj: dict[str, Any]) -> int:
    value = obj.get("attempts", 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MalformedMessage("field 'attempts' is not a non-negative integer")
    return value


def _encode(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
# Control characters (CR and LF among them), DEL and C1, and anything beyond Latin-1. A
# pattern, not a loop over the characters: every 200 with validators is checked (0.19 us
# against 2.0 us for a 35-character ETag).
_NOT_IN_A_HEADER = re.compile(r"[^\x20-\x7e\xa0-\xff]")


def is_validator(value: object) -> bool:
    """Whether ``value`` may be reported and sent back as an ETag or Last-Modified: a
    non-empty string of at most MAX_VALIDATOR_CHARS printable Latin-1 characters. It goes
    into a request header, so nothing that could end or split the header line is."""
    return (
        isinstance(value, str)
        and bool(value.strip())
        and len(value) <= MAX_VALIDATOR_CHARS
        and _NOT_IN_A_HEADER.search(value) is None
    )


def _validator(obj: dict[str, Any], field: str) -> str | None:
    """An ETag or Last-Modified value as an earlier crawl reported it, None when absent."""
    value = obj.get(field)
    if value is None:
        return None
    if not is_validator(value):
        raise MalformedMessage(
            f"field {field!r} is not a header value (a non-empty string of at most "
            f"{MAX_VALIDATOR_CHARS} printable Latin-1 characters)"
        )
    assert isinstance(value, str)
    return value.strip()


def _sha256(obj: dict[str, Any]) -> str | None:
    value = obj.get("sha256")
    if value is None:
        return None
    if not isinstance(value, str) or not _SHA256_HEX.match(value.lower()):
        raise MalformedMessage("field 'sha256' is not 64 hex digits")
    return value.lower()


@dataclasses.dataclass(frozen=True, slots=True)
class Earlier:
    """What an earlier crawl of a URL reported of its file (its resolution message's
    ``etag``, ``last_modified`` and ``sha256``): a message that carries any of them is a
    re-check. The validators are sent back as ``If-None-Match`` and ``If-Modified-Since``;
    ``sha256`` tells a 200 with the same body (a server that ignores the condition) from a
    changed file."""

    etag: str | None = None
    last_modified: str | None = None
    sha256: str | None = None

    @classmethod
    def from_fields(cls, obj: dict[str, Any]) -> Earlier | None:
        """The re-check fields of a decoded message, None for a plain crawl."""
        etag = _validator(obj, "etag")
        last_modified = _validator(obj, "last_modified")
        sha256 = _sha256(obj)
        if etag is None and last_modified is None and sha256 is None:
            return None
        return cls(etag=etag, last_modified=last_modified, sha256=sha256)

    def put(self, obj: dict[str, Any]) -> None:
        """Add the fields that are set to ``obj``, a message being encoded."""
        if self.etag is not None:
            obj["etag"] = self.etag
        if self.last_modified is not None:
            obj["last_modified"] = self.last_modified
        if self.sha256 is not None:
            obj["sha256"] = self.sha256


# What an image may be encoded as (Encoding), with img2dataset's names and meanings.
RESIZE_MODES: Final = ("no", "keep_ratio", "keep_ratio_largest", "center_crop", "border")
ENCODE_FORMATS: Final = ("jpg", "png", "webp")
# The largest side an encoding may ask for: a 16384 px square is 268 Mpx, three times the
# decoded-pixel limit, so anything larger is a mistake, not a dataset.
MAX_IMAGE_SIZE: Final = 16384
# The most the caption and the kept columns of one message may take, as JSON: LAION's
# captions average under 100 bytes and its rows' columns under 300, and each message is
# stored in inbound_images and a urls.{source} topic, so 16 KiB is room, not a budget.
MAX_ROW_DATA_BYTES: Final = 16 * 1024


@dataclasses.dataclass(frozen=True, slots=True)
class Encoding:
    """How a crawled image is stored: resized, cropped or padded, and encoded, as
    img2dataset's options of the same names do it (defaults too), for a dataset.

    ``image_size`` is in pixels; ``resize_mode`` one of RESIZE_MODES: ``no``,
    ``keep_ratio`` (the smaller side becomes image_size), ``keep_ratio_largest`` (the
    larger one does), ``center_crop`` (keep_ratio, then the centre square) or ``border``
    (keep_ratio_largest, then padded with white to a square); ``resize_only_if_bigger``
    leaves an image that is not bigger as it is (no crop, no border either).
    ``encode_format`` is one of ENCODE_FORMATS, the object's extension too;
    ``encode_quality`` 1-100 for jpg and webp, the compression level 0-9 for png. An image
    whose smaller side is under ``min_image_size``, whose width * height is over
    ``max_image_area``, or whose longer side over its shorter is over ``max_aspect_ratio``
    is refused (ImageTooSmall, ImageAreaTooLarge, AspectRatioTooLarge); None: no limit.

    Without one, a worker makes the original's thumbnail: at most 640 px, never enlarged,
    a JPEG of quality 85 (worker/images/kernel.py).
    """

    image_size: int = 256
    resize_mode: str = "border"
    resize_only_if_bigger: bool = False
    encode_format: str = "jpg"
    encode_quality: int = 95
    min_image_size: int = 0
    max_image_area: int | None = None
    max_aspect_ratio: float | None = None

    def __post_init__(self) -> None:
        problem = self.problem()
        if problem is not None:
            raise ValueError(problem)

    def problem(self) -> str | None:
        """Why these values are not an encoding, or None."""
        if not _is_int(self.image_size) or not 1 <= self.image_size <= MAX_IMAGE_SIZE:
            return f"image_size must be an integer 1-{MAX_IMAGE_SIZE}, not {self.image_size!r}"
        if self.resize_mode not in RESIZE_MODES:
            return f"resize_mode must be one of {', '.join(RESIZE_MODES)}, not {self.resize_mode!r}"
        if not isinstance(self.resize_only_if_bigger, bool):
            return (
                f"resize_only_if_bigger must be true or false, not {self.resize_only_if_bigger!r}"
            )
        if self.encode_format not in ENCODE_FORMATS:
            formats = ", ".join(ENCODE_FORMATS)
            return f"encode_format must be one of {formats}, not {self.encode_format!r}"
        low, high = (0, 9) if self.encode_format == "png" else (1, 100)
        if not _is_int(self.encode_quality) or not low <= self.encode_quality <= high:
            return (
                f"encode_quality of {self.encode_format} must be an integer {low}-{high}, "
                f"not {self.encode_quality!r}"
            )
        if not _is_int(self.min_image_size) or self.min_image_size < 0:
            return f"min_image_size must be an integer >= 0, not {self.min_image_size!r}"
        area = self.max_image_area
        if area is not None and (not _is_int(area) or area < 1):
            return f"max_image_area must be an integer >= 1 or null, not {area!r}"
        ratio = self.max_aspect_ratio
        if ratio is not None and (
            not isinstance(ratio, int | float) or isinstance(ratio, bool) or not ratio >= 1
        ):
            return f"max_aspect_ratio must be a number >= 1 or null, not {ratio!r}"
        return None

    @property
    def extension(self) -> str:
        return self.encode_format

    def to_obj(self) -> dict[str, Any]:
        """Its JSON object: only the fields that are not the defaults, as each message
        carries it (100 bytes less a message than all of them)."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != f.default
        }

    @classmethod
    def from_obj(cls, value: object) -> Encoding:
        """An encoding from its JSON object (fields left out take their defaults);
        MalformedMessage, naming the field, for anything else."""
        if not isinstance(value, dict):
            raise MalformedMessage(f"field 'encoding' is not an object but {type(value).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - names)
        if unknown:
            raise MalformedMessage(f"field 'encoding' has unknown field(s) {', '.join(unknown)}")
        try:
            return cls(**value)
        except ValueError as e:
            raise MalformedMessage(f"field 'encoding': {e}") from None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True, slots=True)
class RowData:
    """What a dataset keeps of a URL's input row beside its image, carried unchanged from
    the inbound message to its resolution message: ``caption`` (text, byte for byte) and
    ``columns``, the row's kept columns by name (JSON values). Both together take at most
    MAX_ROW_DATA_BYTES as JSON; more is a malformed message, never a cut one."""

    caption: str | None = None
    columns: Mapping[str, Any] | None = None

    def put(self, obj: dict[str, Any]) -> None:
        """Add the fields that are set to ``obj``, a message being encoded."""
        if self.caption is not None:
            obj["caption"] = self.caption
        if self.columns is not None:
            obj["columns"] = dict(self.columns)

    @classmethod
    def from_fields(cls, obj: dict[str, Any]) -> RowData | None:
        """The row data of a decoded message, None when it carries none."""
        caption = obj.get("caption")
        columns = obj.get("columns")
        if caption is None and columns is None:
            return None
        if caption is not None and not isinstance(caption, str):
            raise MalformedMessage(f"field 'caption' is not a string but {type(caption).__name__}")
        if columns is not None and not isinstance(columns, dict):
            raise MalformedMessage(f"field 'columns' is not an object but {type(columns).__name__}")
        data = cls(caption=caption, columns=columns)
        size = data.size_bytes()
        if size > MAX_ROW_DATA_BYTES:
            raise MalformedMessage(
                f"caption and columns take {size} bytes as JSON, over the limit of "
                f"{MAX_ROW_DATA_BYTES} (MAX_ROW_DATA_BYTES)"
            )
        return data

    def size_bytes(self) -> int:
        """What the caption and columns take in a message, as JSON."""
        obj: dict[str, Any] = {}
        self.put(obj)
        return len(_encode(obj))


def _encoding(obj: dict[str, Any]) -> Encoding | None:
    value = obj.get("encoding")
    return None if value is None else Encoding.from_obj(value)


@dataclasses.dataclass(frozen=True, slots=True)
class InboundImage:
    """A message of ``inbound_images``: one URL to crawl, or with ``earlier``, to re-check.

    ``row`` is what a dataset keeps beside the image (a caption, kept columns), and
    ``encoding`` how the image is to be stored; both optional, and both go to the
    resolution message (``row`` as it came)."""

    url: str
    uuid: str
    source: str
    attempts: int = 0
    earlier: Earlier | None = None
    row: RowData | None = None
    encoding: Encoding | None = None

    def to_json(self) -> bytes:
        obj: dict[str, Any] = {"url": self.url, "uuid": self.uuid, "source": self.source}
        _put_task_fields(obj, self.attempts, self.earlier, self.row, self.encoding)
        return _encode(obj)

    @classmethod
    def from_json(cls, raw: bytes | str) -> InboundImage:
        obj = _decode_object(raw)
        return cls(
            url=_required_str(obj, "url"),
            uuid=_required_str(obj, "uuid"),
            source=_required_str(obj, "source"),
            attempts=_attempts(obj),
            earlier=Earlier.from_fields(obj),
            row=RowData.from_fields(obj),
            encoding=_encoding(obj),
        )

    def to_source_task(self) -> SourceTask:
        return SourceTask(
            url=self.url,
            uuid=self.uuid,
            attempts=self.attempts,
            earlier=self.earlier,
            row=self.row,
            encoding=self.encoding,
        )


def _put_task_fields(
    obj: dict[str, Any],
    attempts: int,
    earlier: Earlier | None,
    row: RowData | None,
    encoding: Encoding | None,
) -> None:
    if attempts:
        obj["attempts"] = attempts
    if earlier is not None:
        earlier.put(obj)
    if row is not None:
        row.put(obj)
    if encoding is not None:
        obj["encoding"] = encoding.to_obj()


@dataclasses.dataclass(frozen=True, slots=True)
class SourceTask:
    """A message of ``urls.{source}``: the inbound message without its source field."""

    url: str
    uuid: str
    attempts: int = 0
    earlier: Earlier | None = None
    row: RowData | None = None
    encoding: Encoding | None = None

    def to_json(self) -> bytes:
        obj: dict[str, Any] = {"url": self.url, "uuid": self.uuid}
        _put_task_fields(obj, self.attempts, self.earlier, self.row, self.encoding)
        return _encode(obj)

    @classmethod
    def from_json(cls, raw: bytes | str) -> SourceTask:
        obj = _decode_object(raw)
        return cls(
            url=_required_str(obj, "url"),
            uuid=_required_str(obj, "uuid"),
            attempts=_attempts(obj),
            earlier=Earlier.from_fields(obj),
            row=RowData.from_fields(obj),
            encoding=_encoding(obj),
        )

    def with_source(self, source: str) -> InboundImage:
        return InboundImage(
            url=self.url,
            uuid=self.uuid,
            source=source,
            attempts=self.attempts,
            earlier=self.earlier,
            row=self.row,
            encoding=self.encoding,
        )


def object_key(uuid: str, encoding: Encoding | None) -> str:
    """The key of an image in the store: the original's ``{uuid}.jpg`` thumbnail, or
    ``{uuid}.{encode_format}`` for an encoding."""
    return f"{uuid}.{'jpg' if encoding is None else encoding.extension}"


@dataclasses.dataclass(frozen=True, slots=True)
class StoredImage:
    """What was stored of an image that was asked an encoding: its object's key and its
    pixel size (after resize, crop or border), in its resolution message's ``image``."""

    key: str
    width: int
    height: int

    def to_obj(self) -> dict[str, Any]:
        return {"key": self.key, "width": self.width, "height": self.height}

    @classmethod
    def from_obj(cls, value: dict[str, Any]) -> StoredImage:
        return cls(key=value["key"], width=value["width"], height=value["height"])


@dataclasses.dataclass(frozen=True, slots=True)
class ResolutionMessage:
    """Published to ``image_metadata_updates`` for every crawled image.

    ``sha256`` is the hex SHA-256 of the downloaded body and ``phash`` the image's 64-bit
    DCT perceptual hash as 16 hex digits (``imagehash.phash``'s algorithm, see
    worker/images/phash.py); both are None only in messages of workers older than them.
    ``etag`` and ``last_modified`` are the answer's ``ETag`` and ``Last-Modified`` headers
    exactly as the server sent them, left out of the JSON when it sent none: a re-check
    sends them back. ``opt_outs`` names what the server reserved (OPT_OUTS; in the order
    found) and ``tdm_policy`` is the TDMRep policy URL given with a ``tdm-reservation``:
    both are left out of the JSON when empty, so a message of a server that says nothing
    is as before. ``row`` (``caption``, ``columns``) is the inbound message's, unchanged,
    and ``image`` what was stored for a message that asked an encoding; both left out when
    the message had none. ``has_exif`` (left out when false) says that an EXIF message of
    the image follows, on the same topic and partition: a consumer that joins the two
    knows when it has both.
    """

    identifier: str
    width: int
    height: int
    filesize: int
    compression_quality: int | None
    opt_outs: tuple[str, ...] = ()
    tdm_policy: str | None = None
    sha256: str | None = None
    phash: str | None = None
    etag: str | None = None
    last_modified: str | None = None
    row: RowData | None = None
    image: StoredImage | None = None
    has_exif: bool = False
    # The inbound message's source (issue 54: the deduplication stage says which source
    # each copy is at); None only in messages of workers older than it.
    source: str | None = None

    def to_json(self) -> bytes:
        # Not ``dataclasses.asdict``, which deep-copies each value: 6.3 us against 3.2 us a
        # message (one per image), for the same flat dict.
        obj: dict[str, Any] = {
            "identifier": self.identifier,
            "width": self.width,
            "height": self.height,
            "filesize": self.filesize,
            "compression_quality": self.compression_quality,
        }
        if self.source is not None:
            obj["source"] = self.source
        if self.sha256 is not None:
            obj["sha256"] = self.sha256
        if self.phash is not None:
            obj["phash"] = self.phash
        if self.etag is not None:
            obj["etag"] = self.etag
        if self.last_modified is not None:
            obj["last_modified"] = self.last_modified
        if self.opt_outs:
            obj["opt_outs"] = list(self.opt_outs)
        if self.tdm_policy is not None:
            obj["tdm_policy"] = self.tdm_policy
        if self.row is not None:
            self.row.put(obj)
        if self.image is not None:
            obj["image"] = self.image.to_obj()
        if self.has_exif:
            obj["has_exif"] = True
        return _encode(obj)

    @classmethod
    def from_json(cls, raw: bytes | str) -> ResolutionMessage:
        obj = _decode_object(raw)
        return cls(
            identifier=obj["identifier"],
            width=obj["width"],
            height=obj["height"],
            filesize=obj["filesize"],
            compression_quality=obj["compression_quality"],
            opt_outs=tuple(obj.get("opt_outs") or ()),
            tdm_policy=obj.get("tdm_policy"),
            sha256=obj.get("sha256"),
            phash=obj.get("phash"),
            etag=obj.get("etag"),
            last_modified=obj.get("last_modified"),
            row=RowData.from_fields(obj),
            image=StoredImage.from_obj(obj["image"]) if obj.get("image") else None,
            has_exif=obj.get("has_exif") is True,
            source=obj.get("source"),
        )


@dataclasses.dataclass(frozen=True, slots=True)
class ExifMessage:
    """Published to ``image_metadata_updates`` when an image has EXIF data.

    ``exif`` maps lower-case hex tag ids (``"0x13b"``) to plain JSON values.
    """

    identifier: str
    exif: dict[str, Any]

    def to_json(self) -> bytes:
        return _encode({"identifier": self.identifier, "exif": self.exif})

    @classmethod
    def from_json(cls, raw: bytes | str) -> ExifMessage:
        obj = _decode_object(raw)
        return cls(identifier=obj["identifier"], exif=obj["exif"])


DUPLICATE_KINDS: Final = ("exact", "near", "unique")


@dataclasses.dataclass(frozen=True, slots=True)
class DuplicateMessage:
    """Published to ``image_duplicates`` for every image of ``image_metadata_updates``
    (beyond the original, issue 54): its cluster of the same photograph.

    ``kind`` is ``exact`` (the very bytes of the cluster's canonical, its first-seen
    image), ``near`` (its perceptual hash within the stage's radius and its aspect ratio
    the same), or ``unique`` (it is a canonical: the first of its cluster, or of none).
    ``duplicate_of`` and ``duplicate_of_source`` name the canonical, ``distance`` the
    Hamming distance of the two hashes (0 for exact); all three None for ``unique``.
    Clusters are stars: ``duplicate_of`` is always a ``unique`` image. A message placed
    again (at least once) gets the same answer.
    """

    identifier: str
    source: str | None
    kind: str
    duplicate_of: str | None = None
    duplicate_of_source: str | None = None
    distance: int | None = None

    def to_json(self) -> bytes:
        return _encode(
            {
                "identifier": self.identifier,
                "source": self.source,
                "kind": self.kind,
                "duplicate_of": self.duplicate_of,
                "duplicate_of_source": self.duplicate_of_source,
                "distance": self.distance,
            }
        )

    @classmethod
    def from_json(cls, raw: bytes | str) -> DuplicateMessage:
        obj = _decode_object(raw)
        if obj.get("kind") not in DUPLICATE_KINDS:
            raise MalformedMessage(f"field 'kind' is not one of {DUPLICATE_KINDS}")
        return cls(
            identifier=obj["identifier"],
            source=obj.get("source"),
            kind=obj["kind"],
            duplicate_of=obj.get("duplicate_of"),
            duplicate_of_source=obj.get("duplicate_of_source"),
            distance=obj.get("distance"),
        )


@dataclasses.dataclass(frozen=True, slots=True)
class LinkRotMessage:
    """Published to ``link_rot`` for a URL that answered 404."""

    identifier: str
    timestamp: str

    def to_json(self) -> bytes:
        return _encode(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, raw: bytes | str) -> LinkRotMessage:
        obj = _decode_object(raw)
        return cls(identifier=obj["identifier"], timestamp=obj["timestamp"])


@dataclasses.dataclass(frozen=True, slots=True)
class LinkCheckMessage:
    """Published to ``link_checks`` once for every re-check that ends.

    ``status`` is one of RECHECK_STATUSES; ``http_status`` the final answer's HTTP code
    (304, or 200 for ``unchanged``; 200 for ``changed``; 404 or 410 for ``gone``), or None
    when a ``failed`` check got no answer; ``error`` (``failed`` only, left out of the
    JSON otherwise) the crawl status it ended with, as in ``crawl_errors``.
    """

    identifier: str
    url: str
    status: str
    http_status: int | None
    time: str
    error: str | None = None

    def to_json(self) -> bytes:
        obj: dict[str, Any] = {
            "identifier": self.identifier,
            "url": self.url,
            "status": self.status,
            "http_status": self.http_status,
            "time": self.time,
        }
        if self.error is not None:
            obj["error"] = self.error
        return _encode(obj)

    @classmethod
    def from_json(cls, raw: bytes | str) -> LinkCheckMessage:
        obj = _decode_object(raw)
        return cls(
            identifier=obj["identifier"],
            url=obj["url"],
            status=obj["status"],
            http_status=obj["http_status"],
            time=obj["time"],
            error=obj.get("error"),
        )


@dataclasses.dataclass(frozen=True, slots=True)
class CrawlError:
    """Published to ``crawl_errors`` for a URL that will not be tried again (not 404).

    ``directives`` (``NoIndex`` only; left out of the JSON otherwise) are what the server
    said that kept the image out of the index, as it said them ("noindex",
    "image-crawler: noimageindex", "content-signal: search=no").
    """

    identifier: str
    url: str
    source: str
    status: str
    attempts: int
    time: str
    directives: tuple[str, ...] = ()

    def to_json(self) -> bytes:
        obj = dataclasses.asdict(self)
        if self.directives:
            obj["directives"] = list(self.directives)
        else:
            del obj["directives"]
        return _encode(obj)

    @classmethod
    def from_json(cls, raw: bytes | str) -> CrawlError:
        obj = _decode_object(raw)
        fields = {f.name: obj[f.name] for f in dataclasses.fields(cls) if f.name != "directives"}
        return cls(**fields, directives=tuple(obj.get("directives") or ()))


@dataclasses.dataclass(frozen=True, slots=True)
class UnparseableMessage:
    """Published to ``crawl_errors`` for a message that could not be parsed."""

    raw: str
    error: str
    topic: str
    time: str

    @classmethod
    def from_raw(cls, raw: bytes | None, error: str, topic: str) -> UnparseableMessage:
        text = (raw or b"")[:RAW_MESSAGE_CAP_BYTES].decode("utf-8", errors="replace")
        encoded = text.encode()
        if len(encoded) > RAW_MESSAGE_CAP_BYTES:
            # Each invalid byte became U+FFFD, three bytes in UTF-8 (a character cut in
            # two at the cap is one). Cut again, dropping the character that straddles.
            text = encoded[:RAW_MESSAGE_CAP_BYTES].decode("utf-8", errors="ignore")
        return cls(raw=text, error=error, topic=topic, time=utc_now_iso())

    def to_json(self) -> bytes:
        return _encode(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, raw: bytes | str) -> UnparseableMessage:
        obj = _decode_object(raw)
        return cls(**{f.name: obj[f.name] for f in dataclasses.fields(cls)})


# --- Computed rates --------------------------------------------------------------------
# A source's computed rate is linear in its image count between these two anchors,
# (image count, requests/s), and clamped at both ends; an override replaces it.
MIN_IMAGES: Final = 5_000
MAX_IMAGES: Final = 500_000_000
MIN_RATE_RPS: Final = 0.2
MAX_RATE_RPS: Final = 200.0


# --- Pacing, as the monitor reports it -------------------------------------------------
# Why a source's effective rate is what it is (PacingInfo.state).
PACE_CONFIGURED: Final = "configured"  # at its configured rate
PACE_BACKOFF: Final = "backoff"  # cut: its server pushed back in the last loop
PACE_RECOVERING: Final = "recovering"  # climbing back (additive increase)
PACE_FLOOR: Final = "floor"  # held at the floor; backoff statuses are breaker errors again
PACE_HALTED: Final = "halted"  # in halted or temp_halted: no request
PACE_STOPPED: Final = "stopped"  # configured at 0 (an override of 0)
PACE_STATES: Final = frozenset(
    {PACE_CONFIGURED, PACE_BACKOFF, PACE_RECOVERING, PACE_FLOOR, PACE_HALTED, PACE_STOPPED}
)


# --- Backlog and ETA -------------------------------------------------------------------
# One rule for the monitor (monitoring_update, /metrics) and `image-crawler status`.


def eta_s(backlog: int, rate_rps: float) -> float:
    """Seconds to crawl ``backlog`` URLs at ``rate_rps`` requests/s: 0 when nothing waits,
    infinite when URLs wait and the rate is 0 (halted, stopped, or not a known source)."""
    if backlog <= 0:
        return 0.0
    if rate_rps <= 0:
        return math.inf
    return backlog / rate_rps


def crawl_eta_s(backlog: Mapping[str, int], rates: Mapping[str, float]) -> float:
    """The crawl's ETA: the largest ETA of the known sources (``rates``: each one's
    effective rate, requests/s) that are being crawled, since sources are crawled in
    parallel. A source without a rate (halted, stopped) waits outside it, or the crawl's
    ETA would be infinite for as long as any one source is halted; it is infinite only
    when such sources are all that has a backlog. A source that is not known is never
    crawled until it is: its backlog is outside the ETA."""
    crawled = [eta_s(backlog.get(s, 0), rate) for s, rate in rates.items() if rate > 0]
    eta = max(crawled, default=0.0)
    if eta == 0.0 and any(backlog.get(s, 0) > 0 for s in rates):
        return math.inf
    return eta


@dataclasses.dataclass(frozen=True, slots=True)
class PacingInfo:
    """One source's pacing in ``crawl_rates``: the rate requests are paced at now
    (``rate_rps``), the rate it would have without backoff (``configured_rps``: computed,
    an override, or the cap of a robots.txt Crawl-delay, named by ``origin``:
    ``"computed"``, the override's key prefix, or ``"crawl_delay"``), and why (``state``,
    one of ``PACE_STATES``, and ``why``, a sentence for operators), and when the leader's
    adaptive step set it (``decided_at_s``, Unix s on the leader's clock; None in a halted
    record, and in records of monitors older than it): a monitor that takes the lead
    resumes a cut from a record that is recent enough (``crawl_monitor.policy.takeover``).
    """

    rate_rps: float
    configured_rps: float
    origin: str
    state: str
    why: str
    decided_at_s: float | None = None

    def to_json(self) -> bytes:
        # By hand rather than dataclasses.asdict, which copies every field recursively: a
        # new leading monitor writes one for every known source in its first loop.
        return _encode(
            {
                "rate_rps": self.rate_rps,
                "configured_rps": self.configured_rps,
                "origin": self.origin,
                "state": self.state,
                "why": self.why,
                "decided_at_s": self.decided_at_s,
            }
        )

    @classmethod
    def from_json(cls, raw: bytes | str) -> PacingInfo:
        obj = _decode_object(raw)
        try:
            decided_at_s = obj.get("decided_at_s")
            return cls(
                rate_rps=float(obj["rate_rps"]),
                configured_rps=float(obj["configured_rps"]),
                origin=str(obj["origin"]),
                state=str(obj["state"]),
                why=str(obj["why"]),
                # Missing in the records of monitors older than it: their age is unknown.
                decided_at_s=None if decided_at_s is None else float(decided_at_s),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise MalformedMessage(f"not a pacing record: {e!r}") from None


@dataclasses.dataclass(frozen=True, slots=True)
class CrawlPause:
    """Why the whole crawl is paused (the value of ``CRAWL_PAUSED_KEY``).

    ``reason`` is ``PAUSE_DISK_FULL`` (written by ``image-crawler up``) or
    ``PAUSE_OPERATOR``; ``message`` is a sentence for operators; ``since_s`` is when the
    pause began (Unix s, None when unknown). For a full disk: the folder whose filesystem
    is short (``path``), its free space, the reserve, how much more must be freed before
    the crawl resumes (``needed_bytes``), and the biggest parts of the data folder
    (``biggest``: (name, bytes) pairs, largest first).
    """

    reason: str
    message: str
    since_s: float | None = None
    path: str | None = None
    free_bytes: int | None = None
    reserve_bytes: int | None = None
    needed_bytes: int | None = None
    biggest: tuple[tuple[str, int], ...] = ()

    def to_json(self) -> bytes:
        return _encode(
            {
                "reason": self.reason,
                "message": self.message,
                "since_s": self.since_s,
                "path": self.path,
                "free_bytes": self.free_bytes,
                "reserve_bytes": self.reserve_bytes,
                "needed_bytes": self.needed_bytes,
                "biggest": [{"path": name, "bytes": size} for name, size in self.biggest],
            }
        )

    @classmethod
    def from_json(cls, raw: bytes | str) -> CrawlPause:
        """The pause ``raw`` says; text that is not a pause record (``redis-cli set
        crawl_paused maintenance``) is an operator's pause with that text as its message."""
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        try:
            obj = _decode_object(text)
            return cls(
                reason=str(obj["reason"]),
                message=str(obj.get("message") or obj["reason"]),
                since_s=_optional(obj.get("since_s"), float),
                path=_optional(obj.get("path"), str),
                free_bytes=_optional(obj.get("free_bytes"), int),
                reserve_bytes=_optional(obj.get("reserve_bytes"), int),
                needed_bytes=_optional(obj.get("needed_bytes"), int),
                biggest=tuple((str(b["path"]), int(b["bytes"])) for b in obj.get("biggest", ())),
            )
        except (MalformedMessage, KeyError, TypeError, ValueError):
            return cls(reason=PAUSE_OPERATOR, message=text.strip() or "paused by an operator")


def _optional(value: Any, kind: type[Any]) -> Any:
    return None if value is None else kind(value)
