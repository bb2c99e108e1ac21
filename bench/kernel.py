"""The kernel: CPU per image of exactly the function the worker's pool runs per image.

``worker.images.pool.PoolProcessor`` runs ``worker.images.kernel.process_image(body,
DEFAULT_LIMITS)`` in its pool processes (decode once, dimensions, JPEG quality, EXIF,
thumbnail, JPEG encode). Here the same call runs in a tight loop in this one process, over
the same bodies the crawl serves, timed with ``time.process_time`` (this process's user +
system CPU) after one warm-up round.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from worker.images.kernel import DEFAULT_LIMITS, ImageFailure, process_image


def measure_kernel(bodies: Sequence[bytes], *, rounds: int = 2) -> dict[str, Any]:
    """Time ``process_image`` on every body ``rounds`` times (after a warm-up round).

    Returns the mean CPU seconds per image (each body weighted equally, as the crawl
    serves them round-robin), the spread over bodies, and failures (there must be none).
    """
    failures = sum(isinstance(process_image(b, DEFAULT_LIMITS), ImageFailure) for b in bodies)
    return {
        "function": "worker.images.kernel.process_image(body, DEFAULT_LIMITS)",
        **time_per_image(lambda body: process_image(body, DEFAULT_LIMITS), bodies, rounds),
        "failures": failures,
    }


def time_per_image(
    function: Callable[[bytes], object], bodies: Sequence[bytes], rounds: int
) -> dict[str, Any]:
    """CPU (``time.process_time``) and wall seconds per image of ``function`` over
    ``bodies``, ``rounds`` times, each body weighted equally; the caller warms it up."""
    per_body = [0.0] * len(bodies)
    wall_started, cpu_started = time.perf_counter(), time.process_time()
    for _ in range(rounds):
        for i, body in enumerate(bodies):
            started = time.process_time()
            function(body)
            per_body[i] += time.process_time() - started
    cpu_total = time.process_time() - cpu_started
    wall_total = time.perf_counter() - wall_started
    means = [t / rounds for t in per_body]
    return {
        "images": len(bodies) * rounds,
        "rounds": rounds,
        "cpu_s_per_image": cpu_total / (len(bodies) * rounds),
        "wall_s_per_image": wall_total / (len(bodies) * rounds),
        "cpu_s_per_image_by_body": {
            "min": min(means),
            "median": statistics.median(means),
            "max": max(means),
        },
    }
