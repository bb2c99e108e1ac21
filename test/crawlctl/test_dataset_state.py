"""A download's state (crawlctl/dataset/state.py) and the cutting of its list (plan.py)."""

from __future__ import annotations

from pathlib import Path

from crawlctl.dataset.layout import Ending, InputRow, Layout
from crawlctl.dataset.plan import plan_list
from crawlctl.dataset.rows import FailedRow, ListColumns, ListRow, read_list
from crawlctl.dataset.state import DatasetState, RunInfo
from image_crawler.contract import ResolutionMessage

IMAGE = Ending("200", ResolutionMessage("r-000", 10, 10, 100, None), exif={"0x13b": "Ann"})


def test_a_list_is_cut_into_shards_and_its_bad_rows_end_at_once(tmp_path: Path) -> None:
    path = tmp_path / "urls.txt"
    path.write_text("".join(f"http://127.0.0.2/{n}.jpg\n" for n in range(5)) + "nope\n")
    with DatasetState(tmp_path / "out") as state:
        planned = plan_list(read_list(path, "txt", ListColumns()), Layout(2), state)
    assert (planned.rows, planned.shards, planned.failed) == (6, 3, 1)
    assert [r.url for r in state.read_input(2)] == ["http://127.0.0.2/4.jpg", "nope"]
    assert state.endings(2) == {"000021": Ending("InvalidURL", detail="not an http(s) URL: 'nope'")}
    assert (state.root / "input").is_dir() and state.root.name == ".image-crawler"


def test_an_unreadable_row_group_is_as_many_failed_rows(tmp_path: Path) -> None:
    items = [ListRow("http://127.0.0.2/a", None, {}), FailedRow("rows 2-4 cannot be read", count=3)]
    with DatasetState(tmp_path) as state:
        planned = plan_list(items, Layout(2), state)
    assert (planned.rows, planned.failed) == (4, 3)
    assert set(state.endings(0)) == {"000001"} and set(state.endings(1)) == {"000010", "000011"}
    assert state.endings(1)["000010"].status == "Malformed"


def test_a_caption_too_large_for_a_message_ends_its_row_saying_so(tmp_path: Path) -> None:
    with DatasetState(tmp_path) as state:
        plan_list([ListRow("http://127.0.0.2/a", "x" * 20_000, {})], Layout(10), state)
    (ending,) = state.endings(0).values()
    assert ending.status == "Malformed" and "20014 bytes as JSON, over 16384" in (
        ending.detail or ""
    )
    assert state.read_input(0)[0].caption == "x" * 20_000  # still in its Parquet row


def test_endings_keep_one_per_key_an_image_over_a_failure(tmp_path: Path) -> None:
    with DatasetState(tmp_path) as state:
        state.record(0, "000000", Ending("503", detail="after 5 tries"))
        state.record(0, "000000", IMAGE)
        state.record(0, "000000", Ending("404"))
        state.record(0, "000001", Ending("404"))
        state.record(0, "000001", IMAGE)
        state.flush()
    with (state.root / "ended" / "00000.jsonl").open("a") as f:
        f.write('{"key": "000002", "sta')  # cut short by a crash
    assert DatasetState(tmp_path).endings(0) == {"000000": IMAGE, "000001": IMAGE}


def test_a_shard_written_is_forgotten_and_the_rest_kept(tmp_path: Path) -> None:
    with DatasetState(tmp_path) as state:
        for shard in (0, 1):
            state.write_input(shard, [InputRow(shard, 0, "http://127.0.0.2/a")])
            state.record(shard, Layout(1).key(shard, 0), IMAGE)
            state.mark_sent(shard)
        state.flush()
        state.forget(0)
    assert (state.sent(), sorted(state.ended_shards())) == ({1}, [1])
    assert not state.has_input(0) and state.has_input(1)


def test_offsets_and_the_run_survive_a_restart(tmp_path: Path) -> None:
    state = DatasetState(tmp_path)
    state.save_offsets({("image_metadata_updates", 0): 12, ("link_rot", 3): 0})
    info = RunInfo("a1b2c3d4e5f6", "dataset", 6, 3, {"image_size": 256})
    state.save_run(info)
    again = DatasetState(tmp_path)
    assert again.load_offsets() == {("image_metadata_updates", 0): 12, ("link_rot", 3): 0}
    assert again.load_run() == info
    assert info.identifier("000021") == "a1b2c3d4e5f6-000021"
    identifiers = ("a1b2c3d4e5f6-000021", "other-000021", None, "a1b2c3d4e5f6-x")
    assert [info.key_of(i) for i in identifiers] == ["000021", None, None, None]
    state.clear_crawl()
    assert [p.name for p in state.root.iterdir()] == ["run.json"]
