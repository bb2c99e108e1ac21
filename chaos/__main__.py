"""``python -m chaos [--minutes M] [--seed S] [--dir DIR]``: one fault campaign.

Prints its seed first (``--seed`` replays it: the same feed, the same faults at the same
moments), a line per fault, and at the end one summary line, PASS or FAIL; exits 0 only
on PASS. Everything it saw is in the run folder: each process's log, ``ledger.jsonl``,
``origin-requests.jsonl`` and ``summary.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import secrets
import sys
import time
from pathlib import Path

from chaos.campaign import Campaign, say, summarize, write_summary

DEFAULT_ROOT = Path.home() / ".cache" / "image-crawler" / "chaos"
FAILURE_FIELDS = (
    "lost",
    "wrong",
    "thumbnails_missing",
    "over_bound_by_2_or_more",
    "over_bound",
    "retry_after_broken",
    "requests_while_halted",
    "halt",
    "leftovers",
    "exit_codes",
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--minutes", type=float, default=5.0, help="how long faults go on")
    parser.add_argument(
        "--seed", type=int, default=None, help="replay a campaign (default: random)"
    )
    parser.add_argument("--dir", type=Path, default=None, help="the run folder")
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=300.0,
        help="after the faults, give up when no uuid has ended for this many seconds",
    )
    args = parser.parse_args()
    # The campaign's own Kafka clients meet every broker fault: their complaints are
    # expected, and the ledger counts what they retried.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    run_dir = args.dir or DEFAULT_ROOT / f"{time.strftime('%Y%m%d-%H%M%S')}-{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    say(f"chaos seed {seed} (replay: python -m chaos --seed {seed} --minutes {args.minutes:g})")
    say(f"run folder {run_dir}")
    campaign = Campaign(run_dir, seed, args.minutes, args.drain_timeout)
    extra = asyncio.run(campaign.run())
    line, summary, passed = summarize(campaign, extra)
    write_summary(run_dir, summary)
    print(line, flush=True)
    if not passed:  # what failed, in the output (CI keeps no run folder)
        for name in FAILURE_FIELDS:
            if summary.get(name):
                print(f"  {name}: {json.dumps(summary[name])[:2000]}", flush=True)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
