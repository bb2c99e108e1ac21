"""The demo's plan: the bundled samples, and which of them each URL serves for which
source (``demo.plan_demo`` lays it out).

Its own module so that the demo's web server (``demo_origin``, loaded only when a demo
runs) and the command (``demo``) both import it without importing each other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Final

BROKEN_SAMPLE: Final = "broken.jpg"
_CONTENT_TYPES: Final = {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png"}


@dataclasses.dataclass(frozen=True, slots=True)
class Sample:
    name: str
    body: bytes
    content_type: str


def load_samples() -> list[Sample]:
    """The bundled sample files (images and the one broken file), by name."""
    folder = resources.files("crawlctl") / "samples"
    samples = []
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        suffix = Path(entry.name).suffix.lower()
        if entry.is_file() and suffix in _CONTENT_TYPES:
            samples.append(Sample(entry.name, entry.read_bytes(), _CONTENT_TYPES[suffix]))
    return samples


@dataclasses.dataclass(frozen=True, slots=True)
class DemoItem:
    """One URL of the demo: what the origin serves at ``path`` (None: 404) for ``source``."""

    uuid: str
    source: str
    path: str
    sample: Sample | None

    @property
    def expected_ok(self) -> bool:
        return self.sample is not None and self.sample.name != BROKEN_SAMPLE


@dataclasses.dataclass(frozen=True, slots=True)
class DemoPlan:
    items: tuple[DemoItem, ...]
    # Source -> (image count for the sources file, the rate it gives).
    sources: Mapping[str, tuple[int, float]]

    def sources_file(self) -> list[dict[str, Any]]:
        """The ``SOURCES_FILE`` content that gives each source its rate."""
        return [{"source_name": s, "image_count": n} for s, (n, _) in self.sources.items()]

    def by_source(self) -> dict[str, list[DemoItem]]:
        grouped: dict[str, list[DemoItem]] = {s: [] for s in self.sources}
        for item in self.items:
            grouped[item.source].append(item)
        return grouped
