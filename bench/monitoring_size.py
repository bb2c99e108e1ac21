"""The size of one ``monitoring_update`` line with many busy sources.

Builds what the monitor sees in the middle of a long crawl of ``N`` sources, every one of
them active (``sample``): a month's counters (successes from a thousand to five million,
a few percent errors), a last-50 histogram of two to four statuses, image counts from
5,000 to 500 million (the computed rates' many decimals), pacing as the regulator writes
it (most at their configured rate, some cut or recovering with their reasons, some capped
by a robots.txt Crawl-delay, a few halted), and a backlog for nearly every source. It
then logs the event through the monitor's own logging set-up (structlog's JSON lines)
and counts the bytes of the line, for each ``MONITORING_TOP_SOURCES`` asked for.

The same script runs on an older checkout (``build_update`` without a backlog): it then
measures that version's line, which is how the figure before the backlog was taken::

    python -m bench.monitoring_size                  # 1,000 sources
    python -m bench.monitoring_size --sources 10000 --top 0,100
    git archive OLD | tar -x -C /tmp/old && cp bench/monitoring_size.py /tmp/old/bench/ \\
        && (cd /tmp/old && python -m bench.monitoring_size)
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import io
import random
from collections.abc import Sequence
from typing import Any, Final

import structlog

from crawl_monitor import monitoring
from crawl_monitor.policy.adaptive import AT_CONFIGURED
from crawl_monitor.policy.decision import HALTED_WHY, TEMP_HALTED_WHY, RegulatorSnapshot
from crawl_monitor.policy.rates import compute_crawl_rate, crawl_delay_why
from crawl_monitor.settings import MonitorSettings
from image_crawler import contract as c
from image_crawler.logs import configure_logging

# The length of a log interval (LOG_FREQUENCY_S).
INTERVAL_S: Final = 5.0
# Names of real image sources, made distinct by a number: their lengths are realistic.
_STEMS: Final = (
    "flickr",
    "wikimedia",
    "smithsonian_national_museum_of_natural_history",
    "metropolitan_museum_of_art",
    "brooklynmuseum",
    "clevelandmuseum",
    "sciencemuseum",
    "nappy",
    "rawpixel",
    "europeana",
    "phylopic",
    "iNaturalist".lower(),
    "nypl",
    "stocksnap",
    "digitaltmuseum",
)
_STATUSES: Final = (
    "404",
    "301",
    "500",
    "503",
    "429",
    "403",
    "UnidentifiedImageError",
    "ServerDisconnected",
    "Timeout",
)


@dataclasses.dataclass(frozen=True, slots=True)
class Sample:
    before: monitoring.Counters
    now: monitoring.Counters
    snapshot: RegulatorSnapshot
    # Source -> URLs waiting (crawl_monitor.backlog.Backlog's ``sources``).
    backlog: dict[str, int]


def _log_uniform(rng: random.Random, low: float, high: float) -> float:
    return float(low * (high / low) ** rng.random())


def _last_50(rng: random.Random) -> dict[str, int]:
    others = rng.sample(_STATUSES, rng.randint(1, 3))
    counts = {status: rng.randint(1, 4) for status in others}
    counts["200"] = 50 - sum(counts.values())
    return counts


def _pacing(rng: random.Random, rate: float) -> c.PacingInfo:
    """Pacing with the shares and reasons the regulator gives a busy crawl."""
    draw = rng.random()
    if draw < 0.06:
        signals = rng.randint(1, 5)
        plural = "" if signals == 1 else "s"
        why = f"{signals} backoff signal{plural} in the last second: cut to 0.7 x"
        return c.PacingInfo(round(rate * 0.7, 6), rate, "computed", c.PACE_BACKOFF, why)
    if draw < 0.10:
        why = f"recovering +{rate / 20:.3g}/s, last cut {rng.uniform(2, 60):.3g} s ago"
        return c.PacingInfo(round(rate * 0.85, 6), rate, "computed", c.PACE_RECOVERING, why)
    if draw < 0.12:
        capped = min(rate, 0.5)
        return c.PacingInfo(capped, capped, "crawl_delay", c.PACE_CONFIGURED, crawl_delay_why(2.0))
    if draw < 0.14:
        return c.PacingInfo(0.0, rate, "computed", c.PACE_HALTED, TEMP_HALTED_WHY)
    if draw < 0.15:
        return c.PacingInfo(0.0, rate, "computed", c.PACE_HALTED, HALTED_WHY)
    return c.PacingInfo(round(rate, 6), rate, "computed", c.PACE_CONFIGURED, AT_CONFIGURED)


def sample(n_sources: int, seed: int = 18) -> Sample:
    """What the monitor sees of ``n_sources`` busy sources (see the module)."""
    rng = random.Random(seed)
    names = [f"{_STEMS[i % len(_STEMS)]}_{i}" for i in range(n_sources)]
    rates: dict[str, float] = {}
    pacing: dict[str, c.PacingInfo] = {}
    last: dict[str, dict[str, int]] = {}
    successful: dict[str, int] = {}
    errors: dict[str, int] = {}
    successful_before: dict[str, int] = {}
    errors_before: dict[str, int] = {}
    backlog: dict[str, int] = {}
    for name in names:
        rate = compute_crawl_rate(int(_log_uniform(rng, 5_000, 500_000_000)))
        info = _pacing(rng, rate)
        rates[name] = info.configured_rps
        pacing[name] = info
        last[name] = _last_50(rng)
        done = int(_log_uniform(rng, 1_000, 5_000_000))
        successful[name] = done
        errors[name] = int(done * rng.uniform(0.005, 0.05))
        step = int(info.rate_rps * INTERVAL_S)
        successful_before[name] = max(0, done - step)
        errors_before[name] = errors[name]
        backlog[name] = 0 if rng.random() < 0.05 else int(_log_uniform(rng, 10, 20_000_000))
    halted = frozenset(n for n, p in pacing.items() if p.why == HALTED_WHY)
    temp_halted = frozenset(n for n, p in pacing.items() if p.why == TEMP_HALTED_WHY)
    total = sum(successful.values())
    total_errors = sum(errors.values())
    now = monitoring.Counters(
        num_resized=total,
        resize_errors=total_errors,
        num_split=total + total_errors + sum(backlog.values()),
        successful=successful,
        errors=errors,
    )
    before = monitoring.Counters(
        num_resized=sum(successful_before.values()),
        resize_errors=total_errors,
        num_split=now.num_split - 500,
        successful=successful_before,
        errors=errors_before,
    )
    snapshot = RegulatorSnapshot(rates, pacing, halted, temp_halted, last)
    return Sample(before, now, snapshot, backlog)


def build(s: Sample, top_sources: int) -> monitoring.MonitoringUpdate:
    """The event's contents, by whichever ``build_update`` this checkout has."""
    parameters = inspect.signature(monitoring.build_update).parameters
    if "backlog" not in parameters:  # before the backlog: every active source listed
        return monitoring.build_update(s.now, s.before, INTERVAL_S, s.snapshot)
    from crawl_monitor.backlog import Backlog

    backlog = Backlog(s.backlog, 1_800_000_000.0)
    return monitoring.build_update(
        s.now, s.before, INTERVAL_S, s.snapshot, backlog, top_sources=top_sources
    )


def line_bytes(update: monitoring.MonitoringUpdate) -> int:
    """The bytes of the ``monitoring_update`` line the monitor prints, newline included."""
    out = io.StringIO()
    configure_logging("INFO")
    structlog.configure(
        logger_factory=structlog.PrintLoggerFactory(file=out), cache_logger_on_first_use=False
    )
    structlog.get_logger("crawl_monitor.monitoring").info(
        "monitoring_update", general=update.general, specific=update.specific
    )
    return len(out.getvalue().encode())


def measure(n_sources: int, tops: Sequence[int]) -> list[dict[str, Any]]:
    s = sample(n_sources)
    results = []
    for top in tops:
        update = build(s, top)
        results.append(
            {
                "sources": n_sources,
                "top_sources": top,
                "listed": len(update.specific),
                "bytes": line_bytes(update),
                "has_backlog": "backlog" in update.general,
            }
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sources", type=int, default=1000)
    default_top = getattr(MonitorSettings(), "monitoring_top_sources", 0)
    parser.add_argument(
        "--top",
        default=f"0,{default_top}" if default_top else "0",
        help="MONITORING_TOP_SOURCES values, comma separated (0: every source; default: 0 "
        "and the monitor's default)",
    )
    args = parser.parse_args()
    tops = [int(t) for t in args.top.split(",")]
    for r in measure(args.sources, tops):
        per_day = 86400 / INTERVAL_S * r["bytes"]
        print(
            f"{r['sources']} sources, MONITORING_TOP_SOURCES={r['top_sources']}"
            f"{'' if r['has_backlog'] else ' (no backlog: before issue 18)'}: "
            f"{r['listed']} listed, {r['bytes']:,} bytes a line, "
            f"{per_day / 1e9:.2f} GB a day at one line every {INTERVAL_S:g} s"
        )


if __name__ == "__main__":
    main()
