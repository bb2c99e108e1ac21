"""Cutting a URL list into shards, once: each shard's rows to its input file, and the rows
that cannot be crawled ended at once (they are rows of the dataset all the same)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from crawlctl.commands.produce import Ignored
from crawlctl.dataset.layout import Ending, InputRow, Layout
from crawlctl.dataset.rows import FailedRow, ListItem, ListRow
from crawlctl.dataset.state import DatasetState
from image_crawler.contract import MAX_ROW_DATA_BYTES, RowData, Status


@dataclasses.dataclass(frozen=True, slots=True)
class Planned:
    """How many rows and shards the list made, and how many rows ended at once."""

    rows: int
    shards: int
    failed: int


def plan_list(
    items: Iterable[ListItem],
    layout: Layout,
    state: DatasetState,
    note: Callable[[str], None] = lambda line: None,
) -> Planned:
    """Every row of ``items`` to its shard's input file in ``state``; a row that cannot be
    crawled (``FailedRow``, or a caption and columns over MAX_ROW_DATA_BYTES) ended in its
    shard's ledger. ``note`` hears of the columns not used."""
    shard_rows: list[InputRow] = []
    row = failed = 0
    for item in items:
        if isinstance(item, Ignored):
            note(str(item))
            continue
        for _ in range(item.count if isinstance(item, FailedRow) else 1):
            shard, index = layout.place(row)
            input_row, ending = _placed(item, shard, index)
            shard_rows.append(input_row)
            if ending is not None:
                state.record(shard, layout.key(shard, index), ending)
                failed += 1
            row += 1
            if len(shard_rows) == layout.per_shard:
                state.write_input(shard, shard_rows)
                shard_rows = []
    if shard_rows:
        state.write_input(shard_rows[0].shard, shard_rows)
    state.flush()
    return Planned(rows=row, shards=layout.shards(row), failed=failed)


def _placed(item: ListRow | FailedRow, shard: int, index: int) -> tuple[InputRow, Ending | None]:
    if isinstance(item, FailedRow):
        status = (
            Status.MALFORMED if item.url is None and item.reason != "no url" else Status.INVALID_URL
        )
        row = InputRow(shard, index, item.url, item.caption, item.columns)
        return row, Ending(status, detail=item.reason)
    row = InputRow(shard, index, item.url, item.caption, item.columns)
    size = RowData(item.caption, dict(item.columns) or None).size_bytes()
    if size > MAX_ROW_DATA_BYTES:
        detail = f"caption and columns take {size} bytes as JSON, over {MAX_ROW_DATA_BYTES}"
        return row, Ending(Status.MALFORMED, detail=detail)
    return row, None
