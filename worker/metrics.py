"""The worker's Prometheus metrics (served on METRICS_PORT, image_crawler/metrics.py).

Names follow Prometheus's conventions: counters end in ``_total``, units are base units
(``_bytes``, ``_seconds``). The only unbounded label is ``source``, which the crawl
has a known, configured set of; ``status`` takes the contract's statuses (HTTP codes and
error names; for ``crawler_rechecks_total``, a re-check's verdict, one of
``RECHECK_STATUSES``), ``dependency`` one of ``DEPENDENCIES`` (``local_store`` is the
thumbnail folder of THUMBNAIL_STORE=local) and ``kind`` one of the resolver's
``FAILURE_KINDS`` (worker/download/dns.py). Each worker process exports its own counts;
Prometheus sums them over the workers.
"""

from __future__ import annotations

from typing import Final

from prometheus_client import Counter, Gauge

DEPENDENCIES: Final = ("kafka", "redis", "s3", "local_store")

REQUESTS = Counter(
    "crawler_requests",
    "Image requests started (granted by pacing), per source.",
    ["source"],
)
OUTCOMES = Counter(
    "crawler_outcomes",
    "Attempts ended, per source and status (an HTTP code or an error name).",
    ["source", "status"],
)
RECHECKS = Counter(
    "crawler_rechecks",
    "Re-checks ended, per source and what they found (unchanged, changed, gone, failed).",
    ["source", "status"],
)
DOWNLOADED_BYTES = Counter(
    "crawler_downloaded_bytes",
    "Bytes of image bodies downloaded, per source.",
    ["source"],
)
URLS_LOST = Counter(
    "crawler_urls_lost",
    "URLs deleted from urls.{source} before any worker read them (committed offset "
    "below the log start), per source.",
    ["source"],
)
TASKS_IN_FLIGHT = Gauge("crawler_tasks_in_flight", "Task slots in use in this worker.")
TASK_SLOTS = Gauge("crawler_task_slots", "Task slots of this worker (MAX_TASKS).")
IMAGE_POOL_QUEUE = Gauge(
    "crawler_image_pool_queue",
    "Downloaded images waiting for, or in, the image-decoding pool.",
)
DEPENDENCY_UP = Gauge(
    "crawler_dependency_up",
    "1 while the dependency answers, 0 during an outage.",
    ["dependency"],
)
DEPENDENCY_OUTAGES = Counter(
    "crawler_dependency_outages",
    "Outages of a dependency seen by this worker (each counted when it starts).",
    ["dependency"],
)
URLS_WAITING = Gauge(
    "crawler_urls_waiting",
    "URLs read and waiting in this worker for their host (no task slot held).",
)
URLS_FINISHED_SKIPPED = Counter(
    "crawler_urls_finished_skipped",
    "URLs read again after a rebalance and not fetched again, because the partition's "
    "previous owner had finished them past its commit (worker/finished.py), per source.",
    ["source"],
)
URLS_COPIES_SKIPPED = Counter(
    "crawler_urls_copies_skipped",
    "URLs read and not fetched because they were copies, byte for byte, of a message of "
    "their partition crawled less than COPY_WINDOW_S before (worker/copies.py), per source.",
    ["source"],
)
URLS_PARKED = Counter(
    "crawler_urls_parked",
    "URLs appended again to the end of urls.{source} because their host could not take "
    "them for long (its queue full, or waited PARK_AFTER_S), per source.",
    ["source"],
)
SLOTS_LATE = Counter(
    "crawler_pacing_slots_late",
    "Pacing slots given up because this worker reached them too late (its event loop "
    "was busy): their requests asked for another slot.",
)
# The worker's resolver (worker/download/dns.py): one process's counts.
DNS_QUERIES = Counter(
    "crawler_dns_queries",
    "Names looked up (one lookup of a name, its A and AAAA queries, however many requests "
    "asked for it at once).",
)
DNS_CACHE_HITS = Counter(
    "crawler_dns_cache_hits",
    "Lookups answered without a query of their own: from the cache (a cached failure "
    "included), or by a query of the same name already in flight.",
)
DNS_FAILURES = Counter(
    "crawler_dns_failures",
    "Lookups that failed, by kind: nxdomain, nodata (the name has no address), servfail, "
    "timeout (no answer after the resolver's tries), refused, other.",
    ["kind"],
)
DNS_NAMES_CACHED = Gauge(
    "crawler_dns_names_cached",
    "Names (with their address family) in the resolver's cache, answers and remembered "
    "failures, expired ones not yet dropped included.",
)
