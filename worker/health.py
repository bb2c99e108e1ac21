"""What a worker's ``/healthz`` says: the problems an orchestrator should act on.

A worker is unhealthy (503, with its problems) while:

- it is starting: its Kafka clients are not started yet, which lasts as long as the
  broker cannot be reached (a health check's start period covers a normal start);
- it is stopping: SIGTERM came, it drains its in-flight work and hands back the rest;
- a dependency (kafka, redis, s3 or local_store) has been away for longer than
  ``outage_max_s``: the worker makes no progress. If the fault is on the worker's side (a
  connection that hangs, a mount gone) a restart is what helps, and if it is not, a
  restart loses nothing (an unfinished message is not committed, and runs again).

Shorter outages are not problems: a Redis failover or a broker restart takes seconds, and
the worker rides them out (its URLs wait). Nor is having nothing to do: a worker that
holds no partition (more workers than partitions, no source yet) is healthy. A worker
whose event loop is blocked does not answer at all: the check's own timeout says so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Final, Literal

from worker.sinks.base import DEPENDENCY_STATES, DependencyStates

# A dependency away for longer than this makes the worker unhealthy: past a failover or a
# restart, long enough that an orchestrator's retries do not restart workers for a blip.
OUTAGE_MAX_S: Final = 60.0

Phase = Literal["starting", "running", "stopping"]


def health_problems(
    phase: Phase, away_s: Mapping[str, float], outage_max_s: float = OUTAGE_MAX_S
) -> list[str]:
    """The problems of a worker in ``phase`` whose dependencies have been away for
    ``away_s`` (seconds, by name); empty when it is healthy."""
    problems = []
    if phase == "starting":
        problems.append("starting: the Kafka clients are not started (is the broker reachable?)")
    elif phase == "stopping":
        problems.append("stopping: draining in-flight work")
    for dependency, lasted_s in sorted(away_s.items()):
        if lasted_s > outage_max_s:
            problems.append(
                f"{dependency} unavailable for {lasted_s:.0f} s (more than {outage_max_s:g} s)"
            )
    return problems


class WorkerHealth:
    """The worker's phase and dependencies, read at each ``/healthz`` request."""

    def __init__(
        self,
        stop: asyncio.Event,
        *,
        states: DependencyStates = DEPENDENCY_STATES,
        outage_max_s: float = OUTAGE_MAX_S,
    ) -> None:
        self._stop = stop
        self._states = states
        self._outage_max_s = outage_max_s
        self._running = False

    def running(self) -> None:
        """The worker has started: its clients are up, it takes work."""
        self._running = True

    @property
    def phase(self) -> Phase:
        if self._stop.is_set():
            return "stopping"
        return "running" if self._running else "starting"

    def problems(self) -> list[str]:
        return health_problems(self.phase, self._states.away_s(), self._outage_max_s)
