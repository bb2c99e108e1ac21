"""``python -m bench.pacing``: the politeness figures, from the tests that hold them.

Runs ``test/e2e/test_pacing_crawl.py`` (the real monitor and workers against a local origin
that times every request) with ``PACING_REPORT_DIR`` set, so that each test keeps its
figures, and renders them as markdown: the busiest window of each width at 50, 5 and
0.5 requests/s with two workers, the utilisation under a backlog, the Retry-After
holds, and the capacity-discovery trace (requests and 503s per second). The tests'
assertions are the targets: the command exits with pytest's status. About 7 minutes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TESTS = "test/e2e/test_pacing_crawl.py"


def _row(cells: Sequence[object]) -> str:
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def render_pacing(report: Mapping[str, Any]) -> list[str]:
    widths = report["widths_s"]
    lines = [
        f"Two workers, one source each at 50, 5 and 0.5 requests/s; the busiest window of "
        f"each width over the whole run (rebalance included), against `rate x w + 1`, and "
        f"the requests of {report['measured_s']:g} s under a backlog:",
        "",
        _row(["source", *(f"w = {w:g} s" for w in widths), "utilisation"]),
        _row(["---"] * (len(widths) + 2)),
    ]
    for figures in report.values():
        if not isinstance(figures, dict):
            continue
        cells = [f"{figures['max_in_window'][str(w)]} / {figures['bound'][str(w)]}" for w in widths]
        lines.append(_row([f"{figures['rate_rps']:g}/s", *cells, f"{figures['utilisation']:.1%}"]))
    return lines


def render_retry_after(report: Mapping[str, Any]) -> list[str]:
    lines = [
        f"Retry-After on a 429, two workers on one source at {report['rate_rps']:g}/s, "
        "`MAX_RETRY_AFTER_S=3`; the next request (from either worker) after the 429:",
        "",
        _row(["Retry-After", "treated as", "hold", "next request after"]),
        _row(["---"] * 4),
    ]
    for case in report["cases"]:
        lines.append(
            _row(
                [
                    f"`{case['retry_after']}`",
                    case["why"],
                    f"{case['hold_s']:g} s",
                    f"{case['resumed_s']:.2f} s",
                ]
            )
        )
    return lines


def render_capacity(report: Mapping[str, Any]) -> list[str]:
    low, high = report["capacity_rps"]
    pacing = report["pacing_at_the_raise"]
    trace = report["trace"]
    lines = [
        f"A server that takes {low:g} requests/s (503 beyond), configured at "
        f"{report['configured_rps']:g}/s; after {report['raised_after_s']:g} s it takes "
        f"{high:g}/s:",
        "",
        f"- busiest 5 s after the first 30 s: {report['max_rate_after_30_s']:.1f} requests/s "
        "(target <= 22)",
        f"- 503s in the first {report['raised_after_s']:g} s: "
        f"{report['refused_share_low']:.2%} of requests (target <= 5%)",
        f"- over 45/s {report['back_over_45_after_s']:g} s after the server could take "
        f"{high:g}/s (target <= 90 s)",
        f"- pacing just before: {pacing['rate_rps']:.1f} of {pacing['configured_rps']:g}/s, "
        f"{pacing['state']}: {pacing['why']}",
        "",
        "Requests per second at the origin, and 503s, ten seconds a line:",
        "",
        "```",
    ]
    requests, refused = trace["requests"], trace["refused"]
    for start in range(0, len(requests), 10):
        sent = " ".join(f"{n:3d}" for n in requests[start : start + 10])
        failed = " ".join(f"{n:3d}" for n in refused[start : start + 10])
        lines.append(f"{start:4d}s  {sent:<40}  503: {failed}")
    lines.append("```")
    return lines


def render(reports: Mapping[str, Mapping[str, Any]], header: str) -> str:
    lines = [f"# Pacing figures ({header})", ""]
    for name, render_one in (
        ("pacing", render_pacing),
        ("retry_after", render_retry_after),
        ("capacity", render_capacity),
    ):
        if name in reports:
            lines += [*render_one(reports[name]), ""]
    return "\n".join(lines)


def _head() -> str:
    result = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    return result.stdout.strip() or "unknown commit"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pacing", description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "pacing.md")
    parser.add_argument("-k", default="", help="pytest -k expression (default: all three)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pacing-") as directory:
        command = [sys.executable, "-m", "pytest", TESTS, "-q", "-s", "-p", "no:cacheprovider"]
        if args.k:
            command += ["-k", args.k]
        status = subprocess.run(
            command, cwd=ROOT, env={**os.environ, "PACING_REPORT_DIR": directory}
        )
        reports = {
            path.stem: json.loads(path.read_text()) for path in Path(directory).glob("*.json")
        }
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    header = f"{_head()}, {when}, {platform.machine()}, {os.cpu_count()} CPUs"
    text = render(reports, header)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    (args.out.with_suffix(".json")).write_text(json.dumps(reports, indent=1) + "\n")
    print(text)
    print(f"\nwritten to {args.out}")
    return status.returncode


if __name__ == "__main__":
    raise SystemExit(main())
