"""bench.report: the verdicts and table rows of the comparison with img2dataset and the
bare Pillow pipeline, and of thumbnail quality; results written before them still render."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from bench import report


def _old_result() -> dict[str, Any]:
    """A result of a bench before issue 19 (the layout run: no comparison, no quality),
    kept beside this test because bench/results/ commits only the latest run."""
    result = json.loads((Path(__file__).parent / "data" / "bench-result-layout.json").read_text())
    for key in ("comparison", "quality"):
        result.pop(key, None)
    result["verdicts"] = [
        v
        for v in result["verdicts"]
        if "PSNR" not in v["target"]
        and "img2dataset" not in v["target"]
        and "bare" not in v["target"]
    ]
    return result


def _comparison(worker: float, peer: float | None, bare: float) -> dict[str, Any]:
    crawl = {
        "config": {"workers": 1},
        "images_ok": 3000,
        "errors": {},
        "worker_cpu_s_per_image": worker,
        "worker_main_cpu_s_per_image": worker / 3,
        "worker_children_cpu_s_per_image": worker * 2 / 3,
        "images_per_s": 120.0,
    }
    return {
        "corpus": {
            "kind": "mixed",
            "files": 100,
            "size_bytes": {"mean": 273_348},
            "long_side_px": [1026, 2047],
            "quality": [75, 95],
        },
        "worker_cpu_s_per_image": worker,
        "crawl": crawl,
        "peer": None
        if peer is None
        else {
            "version": "1.47.0",
            "cpu_s_per_image": peer,
            "cpu_s_per_image_by_repeat": [peer, peer * 1.01, peer * 0.99],
            "repeats": 3,
            "images": 3000,
            "startup_cpu_s": 3.5,
            "all_succeeded": True,
            "thumbnails_checked": {
                "thumbnails": 9000,
                "not_jpeg": 0,
                "wrong_size": 0,
                "luma_table_not_quality": 0,
                "bytes_mean": 45_000,
            },
        },
        "bare": {"cpu_s_per_image": bare, "measurements": [{"cpu_s_per_image": bare}] * 2},
        "kernel_on_mixed": {"cpu_s_per_image": 0.006, "measurements": []},
        "ratios": {
            "worker_over_peer": worker / peer if peer else None,
            "worker_over_bare": worker / bare,
            "kernel_over_bare": 0.006 / bare,
        },
    }


def _quality(mean: float, worst: float) -> dict[str, Any]:
    summary = {"count": 300, "mean_db": mean, "worst_db": worst, "worst_file": "0155-x.jpg",
               "under_30_db": int(worst < 30)}  # fmt: skip
    mixed = {**summary, "count": 100, "mean_db": mean + 1}
    return {"all": summary, "by_kind": {"large": summary, "mixed": mixed}}


def _new_rows(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    old = {v["target"] for v in report.verdicts(_old_result())}
    return {v["target"]: v for v in report.verdicts(result) if v["target"] not in old}


def test_old_results_render_without_the_new_rows() -> None:
    result = _old_result()
    text = report.render_text(result)
    assert "img2dataset" not in text and "PSNR" not in text
    assert report.render_markdown(result).startswith("Benchmark of ")
    assert [v["target"] for v in report.verdicts(result)] == [
        v["target"] for v in result["verdicts"]
    ]


def test_comparison_and_quality_verdicts() -> None:
    result = copy.deepcopy(_old_result())
    result["comparison"] = _comparison(worker=0.0070, peer=0.0130, bare=0.0057)
    result["quality"] = _quality(mean=36.4, worst=31.2)
    rows = _new_rows(result)
    peer = rows["worker CPU / img2dataset CPU per image, mixed corpus"]
    assert peer["ok"] and peer["value"] == pytest.approx(0.0070 / 0.0130)
    assert peer["limit"] == f"<= {report.WORKER_OVER_PEER_MAX}"
    bare = rows["worker CPU / bare Pillow pipeline CPU per image, mixed corpus"]
    assert bare["ok"] and bare["shown"] == "1.23"
    assert rows["thumbnail PSNR mean, all 300 files"]["ok"]
    assert rows["thumbnail PSNR worst image, all 300 files"]["shown"] == "31.20 dB (0155-x.jpg)"
    assert rows["thumbnail PSNR mean, 100 mixed files"]["value"] == pytest.approx(37.4)
    assert len(rows) == 6

    result["verdicts"] = report.verdicts(result)
    text = report.render_text(result)
    for figure in (
        "img2dataset 1.47.0 CPU per image (start-up subtracted)",
        "13.0 ms (median of 3: 13.0 ms / 13.1 ms / 12.9 ms)",
        "img2dataset start-up CPU (subtracted); thumbnails",
        "bare Pillow pipeline CPU per image (before / after)",
        "kernel CPU per image, mixed files",
        "[mixed, 1 src, 1 wkr, 3000 img] worker CPU per image (main + pool)",
        "worker / img2dataset (CPU per image, mixed)",
        "worker / bare Pillow (CPU per image, mixed)",
        "thumbnail PSNR, all 300 files: mean / worst / under 30 dB",
        "thumbnail PSNR, 100 mixed files",
        "PASS  worker CPU / img2dataset CPU per image",
    ):
        assert figure in text, figure
    assert "| worker / img2dataset (CPU per image, mixed) | 0.54 |" in report.render_markdown(
        result
    )


def test_failing_comparison_and_quality() -> None:
    result = copy.deepcopy(_old_result())
    result["comparison"] = _comparison(worker=0.0144, peer=0.0124, bare=0.0057)
    result["comparison"]["peer"]["all_succeeded"] = False
    result["comparison"]["crawl"]["errors"] = {"Timeout": 2}
    result["quality"] = _quality(mean=33.0, worst=26.5)
    rows = _new_rows(result)
    name = "worker CPU / img2dataset CPU per image, mixed corpus, 2 worker errors"
    assert not rows[name + ", img2dataset had failures"]["ok"]
    assert not rows["worker CPU / bare Pillow pipeline CPU per image, mixed corpus, "
                    "2 worker errors"]["ok"]  # fmt: skip
    assert not rows["thumbnail PSNR mean, all 300 files"]["ok"]
    assert not rows["thumbnail PSNR worst image, 100 mixed files"]["ok"]


def test_without_the_peer_there_is_no_peer_verdict() -> None:
    result = copy.deepcopy(_old_result())
    result["comparison"] = _comparison(worker=0.0070, peer=None, bare=0.0057)
    rows = _new_rows(result)
    assert list(rows) == ["worker CPU / bare Pillow pipeline CPU per image, mixed corpus"]
    result["verdicts"] = report.verdicts(result)
    assert "not measured (--no-peer)" in report.render_text(result)
