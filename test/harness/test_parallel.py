"""The suite's parallel run (test/harness/parallel.py): its order and its lock."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from test.harness import parallel


@dataclass
class FakeItem:
    nodeid: str
    marks: dict[str, pytest.Mark] = field(default_factory=dict)

    def get_closest_marker(self, name: str) -> pytest.Mark | None:
        return self.marks.get(name)


def item(nodeid: str, *marks: pytest.MarkDecorator) -> pytest.Item:
    return cast(pytest.Item, FakeItem(nodeid, {m.mark.name: m.mark for m in marks}))


def names(items: list[pytest.Item]) -> list[str]:
    return [i.nodeid for i in items]


def test_the_longest_start_first_and_the_timing_bound_last() -> None:
    items = [
        item("unit_a"),
        item("slow_timing", pytest.mark.timing("r")),
        item("e2e_short", pytest.mark.integration),
        item("unit_b"),
        item("quick_timing", pytest.mark.timing("r")),
        item("e2e_long", pytest.mark.integration),
        item("unknown_e2e", pytest.mark.integration),
    ]
    durations = {
        "slow_timing": 300.0,
        "quick_timing": 1.0,
        "e2e_short": 2.0,
        "e2e_long": 60.0,
        "unit_b": 0.5,
    }
    assert names(parallel.run_order(items, durations)) == [
        "e2e_long",
        "unknown_e2e",  # an unknown test with services: taken as 5 s
        "e2e_short",
        "unit_b",
        "unit_a",  # an unknown test without: taken as short
        "slow_timing",
        "quick_timing",
    ]


def test_ties_keep_the_collection_order() -> None:
    items = [item(f"t{n}") for n in range(20)]
    assert names(parallel.run_order(items, {})) == [f"t{n}" for n in range(20)]


@pytest.mark.parametrize("mark", [pytest.mark.timing(), pytest.mark.timing("  ")])
def test_a_timing_mark_needs_a_reason(mark: pytest.MarkDecorator) -> None:
    with pytest.raises(pytest.UsageError, match="needs a reason"):
        parallel.check_timing_marker(item("t", mark))
    parallel.check_timing_marker(item("t", pytest.mark.timing("asserts gaps")))


def test_durations_keep_every_service_test_and_the_slow_others(tmp_path: Path) -> None:
    durations = parallel.Durations()
    reports: list[tuple[str, float, dict[str, Any]]] = [
        ("fast_unit", 0.01, {}),
        ("fast_unit", 0.01, {}),
        ("slow_unit", 0.3, {}),
        ("fast_e2e", 0.02, {"integration": 1}),
        ("long_e2e", 40.0, {"integration": 1}),
        ("long_e2e", 2.0, {"integration": 1}),  # its teardown
    ]
    for nodeid, seconds, keywords in reports:
        durations.add(
            cast(pytest.TestReport, FakeReport(nodeid=nodeid, duration=seconds, keywords=keywords))
        )
    path = tmp_path / "durations.json"
    durations.store(path)
    assert json.loads(path.read_text()) == {"fast_e2e": 0.02, "long_e2e": 42.0, "slow_unit": 0.3}
    assert parallel.load_durations(path)["long_e2e"] == 42.0
    assert parallel.load_durations(tmp_path / "missing.json") == {}


@dataclass
class FakeReport:
    nodeid: str
    duration: float
    keywords: dict[str, Any]


# --- the lock -------------------------------------------------------------------------

WAIT_S = 10.0


def test_an_exclusive_holder_waits_for_the_shared_ones_and_keeps_new_ones_out(
    tmp_path: Path,
) -> None:
    lock = parallel.RunLock(tmp_path)
    release_first = threading.Event()
    first_holds = threading.Event()
    exclusive_holds = threading.Event()
    release_exclusive = threading.Event()
    late_holds = threading.Event()
    order: list[str] = []

    def shared(holds: threading.Event, release: threading.Event | None, name: str) -> None:
        with lock.shared():
            order.append(name)
            holds.set()
            if release is not None:
                release.wait(WAIT_S)

    def exclusive() -> None:
        with lock.exclusive():
            order.append("exclusive")
            exclusive_holds.set()
            release_exclusive.wait(WAIT_S)

    first = threading.Thread(target=shared, args=(first_holds, release_first, "first"))
    first.start()
    assert first_holds.wait(WAIT_S)
    writer = threading.Thread(target=exclusive)
    writer.start()
    # The writer now holds the gate and waits for the first reader: a new reader waits too.
    assert not exclusive_holds.wait(0.3)
    late = threading.Thread(target=shared, args=(late_holds, None, "late"))
    late.start()
    assert not late_holds.wait(0.3)

    release_first.set()
    assert exclusive_holds.wait(WAIT_S)
    assert not late_holds.wait(0.3)  # nothing beside the exclusive holder
    release_exclusive.set()
    assert late_holds.wait(WAIT_S)
    for thread in (first, writer, late):
        thread.join(WAIT_S)
    assert order == ["first", "exclusive", "late"]


def test_shared_holders_run_side_by_side(tmp_path: Path) -> None:
    lock = parallel.RunLock(tmp_path)
    with lock.shared():
        holds = threading.Event()

        def other() -> None:
            with lock.shared():
                holds.set()

        thread = threading.Thread(target=other)
        thread.start()
        assert holds.wait(WAIT_S)
        thread.join(WAIT_S)


def test_a_named_lock_is_held_by_one_at_a_time(tmp_path: Path) -> None:
    lock = parallel.RunLock(tmp_path)
    second_holds = threading.Event()

    def second() -> None:
        with lock.alone("source-tree"):
            second_holds.set()

    with lock.alone("source-tree"):
        thread = threading.Thread(target=second)
        thread.start()
        assert not second_holds.wait(0.3)
    assert second_holds.wait(WAIT_S)
    thread.join(WAIT_S)


def test_workers_are_two_a_core() -> None:
    assert [parallel.workers_for(n) for n in (1, 2, 4)] == [2, 4, 8]
