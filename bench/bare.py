"""The bare Pillow pipeline: the floor a thumbnailer on Pillow can reach.

Per image, in this process: ``Image.open`` on the body, ``draft("RGB", target)`` (libjpeg
decodes straight to 1/2, 1/4 or 1/8 of the size: the DCT-reduced decode), a NEAREST
resize to the target when the drafted size is not it, and a JPEG encode at quality 85.
No EXIF, no quality estimate, no alpha handling: what the worker does beyond this is
its own cost. ``target`` is the worker's own ``thumbnail_size(w, h, 640)``.

Timed like the kernel (``bench.kernel``): one warm-up round, then ``rounds`` rounds over
every body, CPU from ``time.process_time``.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

from PIL import Image

from bench.kernel import time_per_image
from worker.images.kernel import thumbnail_size

THUMBNAIL_PX = 640
QUALITY = 85


def bare_thumbnail(body: bytes, max_px: int = THUMBNAIL_PX, quality: int = QUALITY) -> bytes:
    with Image.open(io.BytesIO(body)) as im:
        target = thumbnail_size(im.width, im.height, max_px)
        im.draft("RGB", target)
        frame = im.resize(target, Image.Resampling.NEAREST) if im.size != target else im
        out = io.BytesIO()
        frame.save(out, "JPEG", quality=quality)
        return out.getvalue()


def measure_bare(bodies: Sequence[bytes], *, rounds: int = 3) -> dict[str, Any]:
    """CPU seconds per image of ``bare_thumbnail`` over ``bodies`` (each weighted equally)."""
    for body in bodies:
        bare_thumbnail(body)
    return {
        "pipeline": "Image.open, draft('RGB', target), resize(target, NEAREST), "
        f"save JPEG q{QUALITY}",
        **time_per_image(bare_thumbnail, bodies, rounds),
    }
