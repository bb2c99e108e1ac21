"""A download's own state, in the output folder's hidden ``.image-crawler/``.

- ``run.json``: the run's id (the front of every row's identifier, ``{run_id}-{key}``),
  its source and the options that make the dataset what it is; a rerun with other ones
  is refused.
- ``input/{shard}.jsonl``: each shard's rows, cut from the list once (as img2dataset
  cuts its list into feather files), so that a shard is written from its own file.
- ``sent/{shard}``: the shard's rows are all in the crawl (sent and acknowledged); a
  rerun does not send them again, the crawl's queue holds them.
- ``ended/{shard}.jsonl``: how each row ended, appended as endings come and flushed to
  disk before the consumed offsets are (``offsets.json``, renamed into place): a crash
  loses no ending, and one read again is the same row twice, which a key keeps once.
- ``kept.json`` (``--dedup`` on a shared cluster): for each cluster whose canonical is
  another crawl's image, the row of this run it keeps; saved with the offsets.

Once a shard is written whole (its stats file is in the output folder) its files here
are deleted: the state holds the shards in flight, not the dataset.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any, Final

from crawlctl.dataset.layout import Ending, InputRow, Layout

STATE_DIR: Final = ".image-crawler"


@dataclasses.dataclass(frozen=True, slots=True)
class RunInfo:
    """What a download is: ``options`` are those that make its dataset (the list, its
    columns, the shard size, the encoding, the output format), compared on a rerun."""

    run_id: str
    source: str
    rows: int
    shards: int
    options: Mapping[str, Any]

    def to_obj(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"options": dict(self.options)}

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> RunInfo:
        return cls(**{f.name: obj[f.name] for f in dataclasses.fields(cls)})

    def identifier(self, key: str) -> str:
        return f"{self.run_id}-{key}"

    def key_of(self, identifier: object) -> str | None:
        """The key in an identifier of this run; None for anything else."""
        prefix = f"{self.run_id}-"
        if isinstance(identifier, str) and identifier.startswith(prefix):
            key = identifier[len(prefix) :]
            return key if key.isdigit() else None
        return None


class DatasetState:
    """The files under ``folder/.image-crawler``."""

    def __init__(self, folder: Path, *, root: Path | None = None) -> None:
        """The state of the dataset in ``folder``, kept in its hidden folder, or in
        ``root`` (a dataset that goes to S3 keeps its state on the local disk)."""
        self.root = folder / STATE_DIR if root is None else root
        self._ledgers: dict[int, IO[str]] = {}

    def __enter__(self) -> DatasetState:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def run_path(self) -> Path:
        return self.root / "run.json"

    @property
    def images_dir(self) -> Path:
        """Where the local stack's workers store the images."""
        return self.root / "images"

    @property
    def stack_dir(self) -> Path:
        """The local stack's data folder (its broker, Redis, logs)."""
        return self.root / "stack"

    @property
    def staging_dir(self) -> Path:
        return self.root / "staging"

    def load_run(self) -> RunInfo | None:
        if not self.run_path.exists():
            return None
        return RunInfo.from_obj(json.loads(self.run_path.read_text()))

    def save_run(self, info: RunInfo) -> None:
        _write_atomically(self.run_path, json.dumps(info.to_obj(), indent=2) + "\n")

    # --- each shard's rows -------------------------------------------------------------

    def _input_path(self, shard: int) -> Path:
        return self.root / "input" / f"{Layout.name(shard)}.jsonl"

    def write_input(self, shard: int, rows: Iterable[InputRow]) -> None:
        lines = "".join(json.dumps(r.to_obj(), ensure_ascii=False) + "\n" for r in rows)
        _write_atomically(self._input_path(shard), lines)

    def read_input(self, shard: int) -> list[InputRow]:
        with self._input_path(shard).open(encoding="utf-8") as f:
            return [InputRow.from_obj(json.loads(line)) for line in f]

    def has_input(self, shard: int) -> bool:
        return self._input_path(shard).exists()

    # --- sent ----------------------------------------------------------------------------

    def mark_sent(self, shard: int) -> None:
        path = self.root / "sent" / Layout.name(shard)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()

    def sent(self) -> set[int]:
        folder = self.root / "sent"
        return (
            {int(p.name) for p in folder.iterdir() if p.name.isdigit()}
            if folder.exists()
            else set()
        )

    # --- endings -------------------------------------------------------------------------

    def _ledger_path(self, shard: int) -> Path:
        return self.root / "ended" / f"{Layout.name(shard)}.jsonl"

    def record(self, shard: int, key: str, ending: Ending) -> None:
        """Append an ending (on disk at the next ``flush``)."""
        ledger = self._ledgers.get(shard)
        if ledger is None:
            path = self._ledger_path(shard)
            path.parent.mkdir(parents=True, exist_ok=True)
            ledger = self._ledgers[shard] = path.open("a", encoding="utf-8")
        ledger.write(json.dumps({"key": key, **ending.to_obj()}, ensure_ascii=False) + "\n")

    def flush(self) -> None:
        """Every ending recorded so far on disk."""
        for ledger in self._ledgers.values():
            ledger.flush()
            os.fsync(ledger.fileno())

    def endings(self, shard: int) -> dict[str, Ending]:
        """Each ended row of ``shard`` by key: an image over a failure (a URL that ended
        twice, as at-least-once delivery allows, may have failed once and been crawled
        once), else the first recorded. A last line cut short by a crash is not one."""
        found: dict[str, Ending] = {}
        path = self._ledger_path(shard)
        if not path.exists():
            return found
        with path.open(encoding="utf-8") as f:
            for line in f:
                with contextlib.suppress(ValueError, KeyError):
                    obj = json.loads(line)
                    key, ending = obj["key"], Ending.from_obj(obj)
                    earlier = found.get(key)
                    if earlier is None or (ending.crawled and not earlier.crawled):
                        found[key] = ending
        return found

    def ended_shards(self) -> Iterator[int]:
        folder = self.root / "ended"
        if folder.exists():
            for path in folder.glob("*.jsonl"):
                if path.stem.isdigit():
                    yield int(path.stem)

    # --- offsets -------------------------------------------------------------------------

    def save_offsets(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """The next offset of each output partition, once every ending before it is on
        disk (``flush`` first)."""
        obj = [[topic, partition, offset] for (topic, partition), offset in offsets.items()]
        _write_atomically(self.root / "offsets.json", json.dumps(obj) + "\n")

    def load_offsets(self) -> dict[tuple[str, int], int]:
        path = self.root / "offsets.json"
        if not path.exists():
            return {}
        return {(t, p): o for t, p, o in json.loads(path.read_text())}

    def save_kept(self, kept: Mapping[str, str]) -> None:
        """``--dedup``'s rows kept for other crawls' canonicals (outcomes.Keeper)."""
        _write_atomically(self.root / "kept.json", json.dumps(kept) + "\n")

    def load_kept(self) -> dict[str, str]:
        path = self.root / "kept.json"
        return json.loads(path.read_text()) if path.exists() else {}

    # --- a shard written ------------------------------------------------------------------

    def forget(self, shard: int) -> None:
        """Delete what was kept for ``shard``, now written."""
        ledger = self._ledgers.pop(shard, None)
        if ledger is not None:
            ledger.close()
        for path in (
            self._ledger_path(shard),
            self._input_path(shard),
            self.root / "sent" / Layout.name(shard),
        ):
            path.unlink(missing_ok=True)

    def close(self) -> None:
        for ledger in self._ledgers.values():
            ledger.close()
        self._ledgers.clear()

    def clear_crawl(self) -> None:
        """The dataset is whole: drop the stack, the images and what was in flight, keep
        ``run.json`` (a rerun then finds nothing to do)."""
        self.close()
        for name in (
            "stack",
            "images",
            "input",
            "sent",
            "ended",
            "staging",
            "offsets.json",
            "kept.json",
            "sources.json",
        ):
            path = self.root / name
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.tmp")
    with temp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, path)
