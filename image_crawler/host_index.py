"""The host index, counted: how many hosts of each source are active, and how many of
them go at its pace, are paced below it, backed off or halted (issue 36), for the
monitor's ``/metrics`` and dashboard and for ``image-crawler status``.

The workers' pacing script keeps each source's host index (``host_index:{source}``, see
image_crawler/contract.py): a host's member says its state (the band of its score) and
when it was last asked about (refreshed every 10 s while it is). A host is active when it
was asked about in the last ``HOST_ACTIVE_S``; a count is one ZCOUNT of a band over that
window, so a source's counts cost O(log hosts) whatever its number of hosts, and nothing
SCANs the ``pace_host:`` keys. ``count_hosts`` states the rule; ``lua/host_counts.lua``
is its fast path, which counts every source asked for in one call by Redis' clock (the
clock the pacing script writes with).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from typing import Any, Final

import redis.asyncio as aioredis

from image_crawler.contract import (
    HOST_ACTIVE_S,
    HOST_BACKED_OFF,
    HOST_HALTED,
    HOST_INDEX_BAND,
    HOST_INDEX_PREFIX,
    HOST_PACED,
    HOST_STATES,
    HostIndexEntry,
)
from image_crawler.lua import lua_script

_SCRIPT: Final = lua_script("image_crawler", "host_counts.lua")

# The four counts operators see (metrics, the dashboard, `status`), in this order.
ACTIVE: Final = "active"
COUNTED: Final = (ACTIVE, HOST_PACED, HOST_BACKED_OFF, HOST_HALTED)


@dataclasses.dataclass(frozen=True, slots=True)
class HostCounts:
    """A source's hosts asked about in the last ``HOST_ACTIVE_S``, by state: at its
    pace, paced below it (slow start, Crawl-delay, a ceiling of their own, a climb),
    backed off (their rate cut by their server's pushback, climbing back) and halted
    (by their breaker, an operator, or given up)."""

    at_pace: int = 0
    paced: int = 0
    backed_off: int = 0
    halted: int = 0

    @property
    def active(self) -> int:
        return self.at_pace + self.paced + self.backed_off + self.halted

    def counted(self) -> dict[str, int]:
        """The four counts operators see, by name (``COUNTED``)."""
        return {
            ACTIVE: self.active,
            HOST_PACED: self.paced,
            HOST_BACKED_OFF: self.backed_off,
            HOST_HALTED: self.halted,
        }

    def __add__(self, other: HostCounts) -> HostCounts:
        return HostCounts(
            self.at_pace + other.at_pace,
            self.paced + other.paced,
            self.backed_off + other.backed_off,
            self.halted + other.halted,
        )


def _of(by_state: Sequence[int]) -> HostCounts:
    return HostCounts(*by_state[: len(HOST_STATES)])


def count_hosts(scores: Iterable[float], now_s: float) -> HostCounts:
    """How many of a host index's ``scores`` are in each state's window at ``now_s``:
    from its band + ``now_s`` - ``HOST_ACTIVE_S`` (included) to the next band
    (excluded); a score in no band is counted nowhere."""
    counts = [0] * len(HOST_STATES)
    for score in scores:
        state = HostIndexEntry.of(score).state
        if state is not None:
            place = HOST_STATES.index(state)
            low = place * HOST_INDEX_BAND + now_s - HOST_ACTIVE_S
            counts[place] += low <= score < (place + 1) * HOST_INDEX_BAND
    return _of(counts)


def script_args(sources: Sequence[str]) -> list[str]:
    """The script's ARGV for ``sources``."""
    return [
        HOST_INDEX_PREFIX,
        repr(HOST_INDEX_BAND),
        repr(HOST_ACTIVE_S),
        str(len(HOST_STATES)),
        *sources,
    ]


def parse_host_counts(payload: str | bytes) -> dict[str, HostCounts]:
    """The script's answer: each source that has a host index, its counts."""
    data: Any = json.loads(payload)
    counts = data.get("counts") if isinstance(data, dict) else None
    if not isinstance(counts, dict):  # cjson writes an empty table as {} or []
        return {}
    return {
        source: _of([int(n) for n in by_state])
        for source, by_state in counts.items()
        if isinstance(by_state, list) and len(by_state) == len(HOST_STATES)
    }


async def read_host_counts(redis: aioredis.Redis, sources: Sequence[str]) -> dict[str, HostCounts]:
    """Each of ``sources`` that has a host index (a sorted set with members), its
    counts, in one call; the others are left out. Raises ``RedisError``."""
    if not sources:
        return {}
    payload = await redis.eval(_SCRIPT, 0, *script_args(sources))
    return parse_host_counts(payload)
