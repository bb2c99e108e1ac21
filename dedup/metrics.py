"""The stage's ``/metrics`` (METRICS_PORT): placements by source and kind, and the index."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

REGISTRY = CollectorRegistry()
PLACED = Counter(
    "dedup_images_placed",
    "Images placed in a cluster, by their source and kind (exact, near, unique).",
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
