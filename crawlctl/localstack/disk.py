"""A full disk pauses ``image-crawler up``'s crawl instead of breaking it.

Everything ``up`` keeps is in its data folder: the broker's storage (SeaweedFS), Redis's
append-only file, the outputs archive, the thumbnails (by default) and the logs. When
that folder's filesystem runs out of space, each of them fails in its own way (SeaweedFS
refuses the broker's writes, Redis refuses every write, a process whose log cannot be
written dies). So ``up`` watches the free space (``DiskGuard.check``, every
``CHECK_EVERY_S`` from its supervising loop) and pauses the crawl *before* the disk is
exhausted, while Redis can still record why:

- free space below the reserve (``DISK_RESERVE_MB``, default ``DEFAULT_RESERVE_MB``): it
  SETs ``crawl_paused`` (a ``CrawlPause``: the folder, its free space, how much more must
  be freed, the data folder's biggest parts), logs ``disk_full`` in ``DATA/logs/up.log``
  and says it on stderr. The monitor then paces every source at 0 and stops splitting
  (``crawl_monitor.pause``): requests in flight finish, none starts. The reserve is what
  they, the logs and Redis may still write meanwhile;
- free space back above the reserve plus a margin (``resume_at_bytes``, so that a crawl
  at the edge does not pause and resume every second): it DELs the key and logs
  ``disk_space_recovered``; the crawl goes on by itself.

``should_pause`` is the rule, pure; ``DiskGuard`` applies it. A pause left by an earlier
run (``up`` was killed while the disk was full) is lifted at the first check that finds
enough space. A pause an operator SET by hand (any other reason) is left alone.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Protocol

from redis.exceptions import RedisError

from image_crawler.contract import CRAWL_PAUSED_KEY, PAUSE_DISK_FULL, CrawlPause

DISK_RESERVE_ENV: Final = "DISK_RESERVE_MB"
DEFAULT_RESERVE_MB: Final = 256.0
MIB: Final = 1024 * 1024
CHECK_EVERY_S: Final = 1.0
# While paused: the key is rewritten this often (its free space, what must be freed)...
REWRITE_EVERY_S: Final = 5.0
# ...and the data folder's parts measured again this often (a walk of every file).
MEASURE_EVERY_S: Final = 60.0


def disk_reserve_bytes(environ: Mapping[str, str]) -> int:
    """``DISK_RESERVE_MB`` in bytes (0: never pause). Raises ``ValueError`` with a
    sentence for the operator when it is not a number >= 0."""
    raw = environ.get(DISK_RESERVE_ENV, "").strip()
    if not raw:
        return int(DEFAULT_RESERVE_MB * MIB)
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"{DISK_RESERVE_ENV} must be a number of MiB >= 0, got {raw!r}")
    return int(value * MIB)


def resume_at_bytes(reserve_bytes: int) -> int:
    """The free space at which a paused crawl resumes: the reserve and a quarter more (at
    least 1 MiB more)."""
    return reserve_bytes + max(reserve_bytes // 4, MIB)


def should_pause(free_bytes: int, reserve_bytes: int, *, paused: bool) -> bool:
    """Whether the crawl is paused after a check that found ``free_bytes`` free: it pauses
    below the reserve and resumes at ``resume_at_bytes``; a reserve of 0 never pauses."""
    if reserve_bytes <= 0:
        return False
    if paused:
        return free_bytes < resume_at_bytes(reserve_bytes)
    return free_bytes < reserve_bytes


def free_bytes(path: Path) -> int:
    """Bytes available to this process's user on ``path``'s filesystem."""
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


def used_bytes(path: Path) -> int:
    """Disk space used by ``path`` and everything under it (allocated blocks: a sparse
    file counts what it holds)."""
    try:
        stats = path.lstat()
    except OSError:
        return 0
    total = stats.st_blocks * 512
    if path.is_dir() and not path.is_symlink():
        try:
            children = list(os.scandir(path))
        except OSError:
            return total
        total += sum(used_bytes(Path(child.path)) for child in children)
    return total


def biggest_parts(folders: Sequence[Path]) -> tuple[tuple[str, int], ...]:
    """The entries of ``folders`` (the data folder, and the thumbnails' when it is
    elsewhere) by the space they use, largest first: which files to look at."""
    sizes: dict[str, int] = {}
    for folder in folders:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            sizes[entry.path] = used_bytes(Path(entry.path))
    return tuple(sorted(sizes.items(), key=lambda item: (-item[1], item[0])))


def human_bytes(n: int) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", MIB), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def disk_pause(
    path: Path,
    free: int,
    reserve: int,
    since_s: float,
    biggest: tuple[tuple[str, int], ...],
) -> CrawlPause:
    """The ``crawl_paused`` value for a short disk, with its sentence for operators."""
    needed = max(0, resume_at_bytes(reserve) - free)
    parts = ", ".join(f"{Path(name).name} {human_bytes(size)}" for name, size in biggest[:4])
    message = (
        f"the disk of {path} is full: {human_bytes(free)} free, below the reserve of "
        f"{human_bytes(reserve)} ({DISK_RESERVE_ENV}); free {human_bytes(needed)} more "
        f"and the crawl resumes by itself"
    ) + (f"; the data folder's biggest parts: {parts}" if parts else "")
    return CrawlPause(
        reason=PAUSE_DISK_FULL,
        message=message,
        since_s=since_s,
        path=str(path),
        free_bytes=free,
        reserve_bytes=reserve,
        needed_bytes=needed,
        biggest=biggest[:8],
    )


class PauseStore(Protocol):
    """Where the pause is kept (Redis's ``crawl_paused``); raises ``RedisError``."""

    def get(self, name: str) -> Any: ...

    def set(self, name: str, value: bytes) -> Any: ...

    def delete(self, *names: str) -> Any: ...


class EventSink(Protocol):
    def write(self, event: str, level: str = "info", **fields: Any) -> None: ...


@dataclasses.dataclass(slots=True)
class _Paused:
    """The pause in force: which folder, since when (Unix s), and its last measurement."""

    path: Path
    since_s: float
    biggest: tuple[tuple[str, int], ...]
    measured_at: float
    written_at: float | None = None


class DiskGuard:
    """Pauses the crawl while a watched folder's disk is short (see the module).

    ``folders``: the data folder first, then any other folder ``up`` writes to on another
    filesystem (the thumbnails'). ``store`` is a Redis client, ``events`` ``up``'s log,
    ``notify`` a sentence for the operator. ``free``, ``clock`` (Unix s) and ``measure``
    are the seams tests replace.
    """

    def __init__(
        self,
        folders: Sequence[Path],
        reserve_bytes: int,
        store: PauseStore,
        events: EventSink,
        notify: Callable[[str], None],
        *,
        free: Callable[[Path], int] = free_bytes,
        clock: Callable[[], float] = time.time,
        measure: Callable[[Sequence[Path]], tuple[tuple[str, int], ...]] = biggest_parts,
    ) -> None:
        self.folders = tuple(folders)
        self.reserve_bytes = reserve_bytes
        self._store = store
        self._events = events
        self._notify = notify
        self._free = free
        self._clock = clock
        self._measure = measure
        self.paused: _Paused | None = None
        self._checked_at: float | None = None
        # A pause of an earlier run may be in Redis: looked for at the first good check.
        self._stale_checked = False

    def check(self) -> None:
        """Look at the free space (at most every ``CHECK_EVERY_S``) and pause or resume."""
        now = self._clock()
        if self._checked_at is not None and now - self._checked_at < CHECK_EVERY_S:
            return
        self._checked_at = now
        short = self._shortest()
        if short is None:
            return
        path, free = short
        if should_pause(free, self.reserve_bytes, paused=self.paused is not None):
            self._pause(path, free, now)
        elif self.paused is not None:
            self._resume(path, free, now)
        elif not self._stale_checked:
            self._stale_checked = self._lift_stale()

    def _shortest(self) -> tuple[Path, int] | None:
        """The watched folder with the least free space, and that space (None: unknown)."""
        found = []
        for folder in self.folders:
            try:
                found.append((self._free(folder), folder))
            except OSError:
                continue
        if not found:
            return None
        free, folder = min(found, key=lambda item: item[0])
        return folder, free

    def _pause(self, path: Path, free: int, now: float) -> None:
        paused = self.paused
        if paused is None or paused.path != path:
            paused = self.paused = _Paused(path, now, self._measure(self.folders), now)
            pause = self._pause_value(free)
            self._events.write(
                "disk_full",
                "warning",
                path=str(path),
                free_bytes=free,
                reserve_bytes=self.reserve_bytes,
                needed_bytes=pause.needed_bytes,
                biggest=[{"path": name, "bytes": size} for name, size in paused.biggest],
            )
            self._notify(f"crawl paused: {pause.message}")
        elif now - paused.measured_at >= MEASURE_EVERY_S:
            paused.biggest = self._measure(self.folders)
            paused.measured_at = now
        if paused.written_at is None or now - paused.written_at >= REWRITE_EVERY_S:
            self._write(self._pause_value(free), now)

    def _pause_value(self, free: int) -> CrawlPause:
        assert self.paused is not None
        paused = self.paused
        return disk_pause(paused.path, free, self.reserve_bytes, paused.since_s, paused.biggest)

    def _write(self, pause: CrawlPause, now: float) -> None:
        assert self.paused is not None
        try:
            self._store.set(CRAWL_PAUSED_KEY, pause.to_json())
        except RedisError as e:  # tried again at the next check
            self._events.write("crawl_pause_unwritten", "warning", error=repr(e))
            return
        self.paused.written_at = now

    def _resume(self, path: Path, free: int, now: float) -> None:
        assert self.paused is not None
        try:
            self._store.delete(CRAWL_PAUSED_KEY)
        except RedisError as e:  # tried again at the next check
            self._events.write("crawl_pause_unwritten", "warning", error=repr(e))
            return
        paused_s = round(now - self.paused.since_s, 1)
        self.paused = None
        self._events.write(
            "disk_space_recovered", path=str(path), free_bytes=free, paused_s=paused_s
        )
        self._notify(f"crawl resumed: {human_bytes(free)} free on the disk of {path}")

    def _lift_stale(self) -> bool:
        """Lift a disk pause an earlier run left; True once Redis answered."""
        try:
            raw = self._store.get(CRAWL_PAUSED_KEY)
            if raw is not None and CrawlPause.from_json(raw).reason == PAUSE_DISK_FULL:
                self._store.delete(CRAWL_PAUSED_KEY)
                self._notify("lifted the disk-full pause an earlier run left: space is back")
        except RedisError:  # not answering yet: looked for at the next check
            return False
        return True
