"""Thumbnail quality: PSNR of the worker's thumbnails against a full-decode Lanczos one.

For one body: the worker's thumbnail *as stored* (``process_image(body).thumbnail``, the
JPEG, decoded back by Pillow, ``convert("RGB")``) against a reference made from the same
body: a full Pillow decode (no draft), the kernel's own mode handling (``_resizable``
then ``_flatten``: alpha composited onto white), ``convert("RGB")``, and one Lanczos
resize to the thumbnail's own size (no ``reducing_gap``). PSNR in dB over R, G and B:
10 * log10(255^2 / MSE), the MSE over every pixel and channel. Identical images give
``PSNR_CAP_DB`` (not infinity: the figures go to JSON).

``measure_quality`` does it for every file of the corpus and summarises all files, each
kind apart ("mixed" is the comparison's subset): mean, worst (and its file), count
under 30 dB.
"""

from __future__ import annotations

import io
import math
import statistics
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

import numpy as np
from PIL import Image

from worker.images.kernel import (
    DEFAULT_LIMITS,
    ImageLimits,
    ProcessedImage,
    _flatten,
    _resizable,
    process_image,
)

if TYPE_CHECKING:
    from bench.corpus import Corpus

PSNR_CAP_DB: Final = 100.0
UNDER_DB: Final = 30.0


def reference_thumbnail(body: bytes, size: tuple[int, int]) -> Image.Image:
    """The reference: full decode, the kernel's mode handling, RGB, one Lanczos resize
    to ``size`` (width, height)."""
    with Image.open(io.BytesIO(body)) as im:
        im.load()
        frame = _flatten(_resizable(im)).convert("RGB")
        return frame.resize(size, Image.Resampling.LANCZOS)


def psnr(a: Image.Image, b: Image.Image) -> float:
    """PSNR in dB of two images of the same size, over R, G and B."""
    if a.size != b.size:
        raise ValueError(f"sizes differ: {a.size} and {b.size}")
    x = np.asarray(a.convert("RGB"), dtype=np.float64)
    y = np.asarray(b.convert("RGB"), dtype=np.float64)
    mse = float(np.mean((x - y) ** 2))
    if mse == 0:
        return PSNR_CAP_DB
    return min(PSNR_CAP_DB, 10 * math.log10(255.0**2 / mse))


def thumbnail_psnr(
    body: bytes, thumbnail: bytes | None = None, limits: ImageLimits = DEFAULT_LIMITS
) -> float:
    """PSNR of ``thumbnail`` (default: ``process_image(body, limits).thumbnail``) as
    stored, against ``reference_thumbnail(body, its size)``."""
    if thumbnail is None:
        result = process_image(body, limits)
        if not isinstance(result, ProcessedImage):
            raise ValueError(f"process_image failed: {result}")
        thumbnail = result.thumbnail
    with Image.open(io.BytesIO(thumbnail)) as stored:
        got = stored.convert("RGB")
    return psnr(got, reference_thumbnail(body, got.size))


def summarise(readings: Iterable[tuple[str, float]]) -> dict[str, Any]:
    """(file, PSNR) pairs -> count, mean, worst (+ file), median, count under 30 dB."""
    pairs = list(readings)
    if not pairs:
        return {"count": 0}
    worst_file, worst = min(pairs, key=lambda p: p[1])
    values = [v for _, v in pairs]
    return {
        "count": len(values),
        "mean_db": statistics.fmean(values),
        "median_db": statistics.median(values),
        "worst_db": worst,
        "worst_file": worst_file,
        "under_30_db": sum(v < UNDER_DB for v in values),
    }


def measure_quality(corpus: Corpus) -> dict[str, Any]:
    """``thumbnail_psnr`` of every file of ``corpus``: all, and per kind."""
    started = time.monotonic()
    per_file: list[dict[str, Any]] = []
    for f in corpus.files:
        body = (corpus.directory / f.name).read_bytes()
        per_file.append({"file": f.name, "kind": f.kind, "psnr_db": round(thumbnail_psnr(body), 3)})
    kinds = sorted({p["kind"] for p in per_file})
    return {
        "definition": "PSNR (dB, R+G+B) of process_image's stored thumbnail vs a full "
        "decode resized once with LANCZOS to the same size",
        "all": summarise((p["file"], p["psnr_db"]) for p in per_file),
        "by_kind": {
            k: summarise((p["file"], p["psnr_db"]) for p in per_file if p["kind"] == k)
            for k in kinds
        },
        "per_file": per_file,
        "seconds": round(time.monotonic() - started, 1),
    }
