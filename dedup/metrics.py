"""The stage's ``/metrics`` (METRICS_PORT): placements by source and kind (each counted once,
as in Redis's ``dedup_placements``: a placement read again after a crash is not counted
again), the index, and whether Redis takes the counts."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

REGISTRY = CollectorRegistry()
PLACED = Counter(
    "dedup_images_placed",
    "Images placed in a cluster, by their source and kind (exact, near, unique); one read "
    "again after a crash is not counted again.",
    ["source", "kind"],
    registry=REGISTRY,
)
UNPARSEABLE = Counter(
    "dedup_messages_unparseable",
    "Messages of image_metadata_updates that are neither a resolution nor an EXIF message.",
    registry=REGISTRY,
)
CANONICALS = Gauge(
    "dedup_canonicals", "Canonical images in the index (each cluster's first).", registry=REGISTRY
)
REDIS_UP = Gauge(
    "dedup_redis_up",
    "1 while the placement counts' last write to Redis (dedup_placements) succeeded, else 0.",
    registry=REGISTRY,
)
