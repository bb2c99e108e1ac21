"""bench --recheck: the re-checks built from the first crawl's resolution messages, the
outputs of the second pass counted apart, its figures, verdicts and table rows."""

from __future__ import annotations

import copy
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bench import report
from bench.crawl import (
    Outputs,
    RecheckPlan,
    _Recheck,
    _recheck_figures,
    _tasks,
    recheck_plan,
    source_names,
)
from image_crawler import contract as c

ORIGIN = "http://127.0.0.1:8000"
SHA = "ab" * 32


def _resolution(uuid: str, **fields: Any) -> bytes:
    message = c.ResolutionMessage(uuid, 640, 480, 1000, 85, **fields)
    return message.to_json()


def test_a_recheck_is_the_crawl_s_message_with_its_validators() -> None:
    tasks, uuids = _tasks(source_names(1), 4, (ORIGIN,), "run", 0, 6)
    validators: dict[str, dict[str, Any]] = {
        uuids[0]: {
            "etag": '"e0"',
            "last_modified": "Fri, 02 Jan 2026 03:04:05 GMT",
            "sha256": SHA,
        },
        uuids[1]: {"sha256": SHA},
        uuids[2]: {},  # a resolution of a worker that reported none
        uuids[3]: {"etag": "bad\r\nheader"},  # not fit for a request header
        # uuids[4]: no resolution (the crawl ended in an error)
        uuids[5]: {"last_modified": "Fri, 02 Jan 2026 03:04:05 GMT"},
    }

    plan = recheck_plan(tasks, validators)

    assert plan.uuids == [uuids[0], uuids[1], uuids[5]]
    assert (plan.no_resolution, plan.no_validators) == (1, 2)
    assert plan.carrying == {"etag": 1, "last_modified": 2, "sha256": 2}
    by_uuid = {c.SourceTask.from_json(v).uuid: (t, p, v) for t, p, v in tasks}
    for (topic, partition, value), uuid in zip(plan.tasks, plan.uuids, strict=True):
        crawled = c.SourceTask.from_json(by_uuid[uuid][2])
        recheck = c.SourceTask.from_json(value)
        assert (topic, partition) == by_uuid[uuid][:2]  # the same queue and partition
        assert (recheck.url, recheck.uuid, recheck.attempts) == (crawled.url, uuid, 0)
        assert crawled.earlier is None
        assert recheck.earlier == c.Earlier(**validators[uuid])


def test_outputs_of_the_recheck_pass_count_apart() -> None:
    outputs = Outputs()
    outputs.wanted = {"run-1", "run-2"}
    outputs.add(c.METADATA_TOPIC, _resolution("run-1", sha256=SHA, etag='"e1"'))
    outputs.add(c.METADATA_TOPIC, json.dumps({"identifier": "run-1", "exif": {}}).encode())
    outputs.add(c.METADATA_TOPIC, _resolution("run-2", sha256=SHA))
    assert outputs.validators == {
        "run-1": {"sha256": SHA, "etag": '"e1"'},
        "run-2": {"sha256": SHA},
    }
    assert (outputs.done_wanted, outputs.resolutions, outputs.exifs) == (2, 2, 1)

    outputs.rechecking = True
    outputs.checks_wanted = {"run-1", "run-2"}
    check = c.LinkCheckMessage("run-1", "u", c.CHECK_UNCHANGED, 304, c.utc_now_iso())
    outputs.add(c.LINK_CHECKS_TOPIC, check.to_json())
    outputs.add(c.LINK_CHECKS_TOPIC, check.to_json())  # delivered twice: counted once
    changed = c.LinkCheckMessage("run-2", "u", c.CHECK_CHANGED, 200, c.utc_now_iso())
    outputs.add(c.LINK_CHECKS_TOPIC, changed.to_json())
    # A changed image is crawled again: its resolution is the re-check pass's.
    outputs.add(c.METADATA_TOPIC, _resolution("run-2", sha256="cd" * 32))
    outputs.add(c.LINK_ROT_TOPIC, c.LinkRotMessage("run-1", c.utc_now_iso()).to_json())

    assert outputs.checks_done == 2
    assert outputs.check_statuses == {"run-1": "unchanged", "run-2": "changed"}
    assert outputs.check_http_statuses == Counter({"304": 1, "200": 1})
    assert [m["identifier"] for m in outputs.check_examples] == ["run-2"]
    assert (outputs.recheck_resolutions, outputs.recheck_errors) == (1, Counter({"404": 1}))
    # The crawl's figures are the crawl's.
    assert (outputs.resolutions, outputs.errors) == (2, Counter())
    assert outputs.validators["run-2"] == {"sha256": SHA}


def _window(uuids: list[str], cpu: list[dict[str, float]]) -> _Recheck:
    plan = RecheckPlan([], uuids, 1, 0, {"etag": 3, "last_modified": 3, "sha256": 3})
    return _Recheck(
        plan,
        t0=100.0,
        produce_s=0.05,
        t_seen=104.0,
        finished=True,
        worker_cpu=cpu,
        other_cpu={"kafka": 0.5},
    )


def test_recheck_cpu_is_per_unchanged_image() -> None:
    outputs = Outputs()
    uuids = ["a", "b", "c", "d"]
    for i, uuid in enumerate(uuids):
        outputs.checked_at[uuid] = 101.0 + i
        outputs.check_statuses[uuid] = c.CHECK_UNCHANGED
    outputs.check_statuses["d"] = c.CHECK_FAILED
    cpu = [{"main": 0.006, "children": 0.002, "main_system": 0.001, "children_system": 0.0}]
    crawl = {"images_requested": 5, "worker_cpu_s_per_image": 0.02}

    figures = _recheck_figures(_window(uuids, cpu), outputs, crawl)

    assert figures["statuses"] == {"unchanged": 3, "failed": 1}
    assert figures["cpu_s_per_image"] == pytest.approx(0.008 / 3)
    assert figures["main"] == pytest.approx(0.002)
    assert figures["pool"] == pytest.approx(0.002 / 3)
    assert figures["ratio"] == pytest.approx(0.008 / 3 / 0.02)
    assert figures["full_crawl_cpu_s_per_image"] == 0.02
    assert (figures["images"], figures["rechecks"], figures["checks_done"]) == (5, 4, 4)
    assert figures["not_rechecked"] == {"no_resolution": 1, "no_validators": 0}
    assert figures["wall_s"] == pytest.approx(4.0)
    assert figures["checks_per_s"] == pytest.approx(1.0)

    idle_pool = [{"main": 0.006, "children": -1e-15, "main_system": 0.0, "children_system": 0.0}]
    assert _recheck_figures(_window(uuids, idle_pool), outputs, crawl)["pool"] == 0.0

    nothing = _recheck_figures(_window(uuids, cpu), Outputs(), crawl)
    assert nothing["cpu_s_per_image"] is None and nothing["ratio"] is None
    assert nothing["statuses"] == {} and nothing["wall_s"] == pytest.approx(4.0)


# --- the report -----------------------------------------------------------------------


def _result() -> dict[str, Any]:
    """A result of a bench before --recheck (its first run is 1 source, 10,000 images)."""
    path = Path(__file__).parent / "data" / "bench-result-layout.json"
    return dict(json.loads(path.read_text()))


def _recheck(ratio: float, statuses: dict[str, int]) -> dict[str, Any]:
    full = 0.0159
    return {
        "images": 10_000,
        "rechecks": 10_000,
        "not_rechecked": {"no_resolution": 0, "no_validators": 0},
        "carrying": {"etag": 10_000, "last_modified": 10_000, "sha256": 10_000},
        "finished": True,
        "checks_done": sum(statuses.values()),
        "statuses": statuses,
        "http_statuses": {"304": statuses.get("unchanged", 0)},
        "examples": [],
        "resolutions": 0,
        "errors": {},
        "produce_s": 0.4,
        "wall_s": 20.0,
        "completed_by_s": {"1%": 0.3, "100%": 20.0},
        "checks_per_s": 500.0,
        "worker_cpu_s": ratio * full * 10_000,
        "cpu_s_per_image": ratio * full,
        "main": ratio * full * 0.9,
        "pool": ratio * full * 0.1,
        "full_crawl_cpu_s_per_image": full,
        "ratio": ratio,
        "other_cpu_s": {},
    }


def _recheck_rows(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["target"]: v for v in report.verdicts(result) if "re-check" in v["target"]}


def test_without_recheck_there_are_no_recheck_rows() -> None:
    result = _result()
    assert _recheck_rows(result) == {}
    assert "re-check" not in report.render_text(result)


def test_recheck_verdicts_and_table() -> None:
    result = copy.deepcopy(_result())
    result["runs"][0]["recheck"] = _recheck(0.046, {"unchanged": 10_000})
    rows = _recheck_rows(result)
    assert list(rows) == [
        "re-checks of unchanged images that came back unchanged, 1 source(s)",
        "re-check CPU / full crawl CPU per image, 1 source(s)",
    ]
    statuses, ratio = rows.values()
    assert statuses["ok"] and statuses["shown"] == "10000 of 10000"
    assert ratio["ok"] and ratio["shown"] == "0.046" and ratio["limit"] == "<= 0.1"

    result["verdicts"] = report.verdicts(result)
    text = report.render_text(result)
    for figure in (
        "[1 src, 1 wkr, 10000 img] re-check CPU per image (main + pool)",
        "0.7 ms (0.7 ms + 0.1 ms)",
        "[1 src, 1 wkr, 10000 img] full crawl CPU per image; re-check / full crawl",
        "15.9 ms; 0.046",
        "re-checks: statuses (HTTP)",
        "unchanged 10000 of 10000 (304 10000)",
        "500.0 checks/s; 20.0 s",
        "PASS  re-check CPU / full crawl CPU per image, 1 source(s): 0.046 (<= 0.1)",
    ):
        assert figure in text, figure
    assert "not re-checked" not in text
    markdown = report.render_markdown(result)
    assert "| re-check CPU / full crawl CPU per image, 1 source(s) | 0.046 | <= 0.1 | pass |" in (
        markdown
    )


def test_a_recheck_that_did_not_come_back_unchanged_fails() -> None:
    result = copy.deepcopy(_result())
    recheck = _recheck(0.12, {"unchanged": 9_990, "changed": 4, "failed": 1})
    recheck["not_rechecked"] = {"no_resolution": 2, "no_validators": 0}
    recheck["errors"] = {"Timeout": 1}
    result["runs"][0]["recheck"] = recheck
    rows = _recheck_rows(result)
    statuses = rows["re-checks of unchanged images that came back unchanged, 1 source(s)"]
    assert not statuses["ok"]
    assert statuses["shown"] == "9990 of 10000 (changed 4, failed 1, missing 5)"
    ratio = rows["re-check CPU / full crawl CPU per image, 1 source(s), 10 not unchanged"]
    assert not ratio["ok"]

    result["verdicts"] = report.verdicts(result)
    text = report.render_text(result)
    assert "2 without a resolution, 0 without validators; 0, {'Timeout': 1}" in text
    assert "FAIL  re-checks of unchanged images that came back unchanged" in text


def test_a_recheck_with_nothing_unchanged_has_no_ratio() -> None:
    result = copy.deepcopy(_result())
    recheck = _recheck(0.0, {})
    recheck.update(
        ratio=None,
        cpu_s_per_image=None,
        main=None,
        pool=None,
        checks_per_s=None,
        completed_by_s={},
        http_statuses={},
    )
    result["runs"][0]["recheck"] = recheck
    rows = _recheck_rows(result)
    assert [r["shown"] for r in rows.values()] == ["0 of 10000 (missing 10000)"]
    result["verdicts"] = report.verdicts(result)
    assert "none of 10000 (none)" in report.render_text(result)
