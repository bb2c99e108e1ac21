"""Is this response much slower than the host's usual? A backoff signal if so.

A server that starts to struggle often answers slowly before it answers 503, so a sharp
rise in response time is one of the signals that cut a host's rate. Each host keeps
one small record: an exponentially weighted mean of its response times (seconds from
the request to the response headers) and how many it has seen. The rule:

- no verdict until ``min_samples`` responses have been seen (one slow first answer of a
  cold server says nothing);
- a response is slow when ``t > max(factor * baseline, baseline + margin_s)``: the
  factor catches a slow server getting much slower, the margin keeps a fast one (10 ms
  usual) from being "slow" at 40 ms;
- every response moves the baseline; a slow one moves it only a little and counts only
  as far as the slow line (``slow_weight``), so one outlier barely shifts the baseline
  while a lasting rise becomes the new normal within a few dozen responses and stops
  being a signal (the rate has been cut by then; it need not be cut for ever).

Pure: no clock, no I/O. The times are given by the caller.
"""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict
from collections.abc import Hashable
from typing import Final


@dataclasses.dataclass(frozen=True, slots=True)
class LatencyPolicy:
    """The rule's parameters: ``factor`` and ``margin_s`` draw the slow line,
    ``min_samples`` responses come before any verdict, ``weight`` is how much a normal
    response moves the baseline and ``slow_weight`` how much a slow one does."""

    factor: float = 3.0
    margin_s: float = 1.0
    min_samples: int = 10
    weight: float = 0.1
    slow_weight: float = 0.05

    def __post_init__(self) -> None:
        if not self.factor >= 1.0:
            raise ValueError(f"factor must be >= 1, got {self.factor}")
        if not self.margin_s >= 0.0:
            raise ValueError(f"margin_s must be >= 0, got {self.margin_s}")
        if self.min_samples < 1:
            raise ValueError(f"min_samples must be >= 1, got {self.min_samples}")
        for name in ("weight", "slow_weight"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"{name} must be in (0, 1], got {value}")

    def slow_line_s(self, baseline_s: float) -> float:
        """Response times above this are slow, for a source whose usual is ``baseline_s``."""
        return max(self.factor * baseline_s, baseline_s + self.margin_s)


@dataclasses.dataclass(frozen=True, slots=True)
class Baseline:
    """One source's usual response time (``mean_s``) over ``samples`` responses."""

    mean_s: float = 0.0
    samples: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """Whether a response was ``slow``, and the source's ``baseline`` after it."""

    slow: bool
    baseline: Baseline


def judge(baseline: Baseline, response_s: float, policy: LatencyPolicy) -> Verdict:
    """The verdict on one response of ``response_s`` seconds, and the updated baseline.

    A time that is negative, infinite or NaN is no measurement: not slow, baseline kept.
    """
    if not (math.isfinite(response_s) and response_s >= 0.0):
        return Verdict(False, baseline)
    samples = baseline.samples + 1
    if baseline.samples < policy.min_samples:
        # Warming up: a plain mean for the first samples (an average weighted from one
        # first sample would remember it for far too long), then the weighted mean.
        weight = max(policy.weight, 1.0 / samples)
        mean = baseline.mean_s + weight * (response_s - baseline.mean_s)
        return Verdict(False, Baseline(mean, samples))
    line = policy.slow_line_s(baseline.mean_s)
    slow = response_s > line
    if slow:
        # Counted as if it had arrived at the slow line: a 60 s outlier moves a 0.1 s
        # baseline by slow_weight * 1 s, not slow_weight * 60 s.
        mean = baseline.mean_s + policy.slow_weight * (line - baseline.mean_s)
    else:
        mean = baseline.mean_s + policy.weight * (response_s - baseline.mean_s)
    # Past min_samples the count has no use: capped, so it never grows.
    return Verdict(slow, Baseline(mean, min(samples, policy.min_samples)))


# The most hosts a worker keeps a baseline of; the least recently answered go first.
MAX_WATCHED: Final = 100_000


class LatencyWatch:
    """The baselines of the hosts one worker fetches from: one ``Baseline`` each, for
    the ``max_watched`` hosts answered last (a forgotten host starts again, without a
    verdict for ``min_samples`` answers)."""

    def __init__(self, policy: LatencyPolicy | None = None, max_watched: int = MAX_WATCHED) -> None:
        self.policy = policy or LatencyPolicy()
        self._max_watched = max_watched
        self._baselines: OrderedDict[Hashable, Baseline] = OrderedDict()

    def observe(self, key: Hashable, response_s: float) -> bool:
        """Record a response of ``key``'s host that took ``response_s`` seconds to its
        headers; True if it was much slower than the host's usual."""
        baselines = self._baselines
        verdict = judge(baselines.pop(key, Baseline()), response_s, self.policy)
        baselines[key] = verdict.baseline
        if len(baselines) > self._max_watched:
            baselines.popitem(last=False)
        return verdict.slow

    def baseline(self, key: Hashable) -> Baseline | None:
        """The host's baseline, None before its first response."""
        return self._baselines.get(key)

    def forget(self, key: Hashable) -> None:
        """Drop the host's record."""
        self._baselines.pop(key, None)

    def __len__(self) -> int:
        return len(self._baselines)
