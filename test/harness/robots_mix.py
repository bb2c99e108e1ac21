"""A realistic mix of robots.txt files, for tests and benchmarks (test/data/robots_mix/).

``files()`` are 269 real robots.txt files of popular sites, one in six of the 1,613
collected for Protego's benchmark, taken evenly along their sizes (so that the sample
keeps the collection's size distribution, its long tail included); where they come from
and their terms: test/data/robots_mix/README.md.

``MIX`` is what a host's robots.txt fetch ends in, in the shares Common Crawl measured
over the 2 million top sites of three Tranco lists (commoncrawl/robotstxt-experiments,
``robotstxt-status-counts-topk.csv``, stratum 2M, crawl CC-MAIN-2025-38, the sites with a
capture): a file (with rules, or a redirect to one), a file without rules, a 4xx (401,
403, 404...: everything allowed) or a 5xx (unreachable for now). ``host_outcome(i)``
gives host ``i`` its outcome and, for a file, one of ``files()``, deterministically.
"""

from __future__ import annotations

import functools
import gzip
import json
from pathlib import Path
from typing import Final

MIX_FILE: Final = Path(__file__).resolve().parent.parent / "data" / "robots_mix" / "robots.jsonl.gz"

FILE, NO_RULES, CLIENT_ERROR, SERVER_ERROR = "file", "no_rules", "4xx", "5xx"
# CC-MAIN-2025-38, 2M: "Robots.txt with rules" 589,735 and "HTTP redirect not resolved"
# 44,714 (a redirect, mostly to the same site's file); "Robots.txt no rules" 39,845;
# "HTTP allow all" 135,453 and "HTTP forbidden" 41,627; "HTTP defer visits" 23,803.
MIX: Final = ((FILE, 634_449), (NO_RULES, 39_845), (CLIENT_ERROR, 177_080), (SERVER_ERROR, 23_803))
# Hosts whose /.well-known/tdmrep.json answers with rules (rare on the web).
TDMREP_SHARE: Final = 0.01
TDMREP_FILE: Final = json.dumps(
    [
        {"location": "/images/*", "tdm-reservation": 1, "tdm-policy": "https://example.org/tdm"},
        {"location": "/", "tdm-reservation": 0},
    ]
)


@functools.cache
def files() -> tuple[tuple[str, str], ...]:
    """(site, text) of each file of the sample, its text decoded as the worker decodes it
    (UTF-8, undecodable bytes replaced)."""
    with gzip.open(MIX_FILE, "rt", encoding="utf-8") as lines:
        rows = [json.loads(line) for line in lines]
    return tuple((row["site"], row["text"]) for row in rows)


def host_outcome(i: int) -> tuple[str, str]:
    """Host ``i``'s robots.txt outcome (``MIX``) and, for ``FILE``, its text (else "")."""
    at = (i * 7919) % sum(count for _, count in MIX)  # spread, not in runs
    for outcome, count in MIX:
        if at < count:
            if outcome != FILE:
                return outcome, ""
            sample = files()
            return outcome, sample[(i * 104_729) % len(sample)][1]
        at -= count
    raise AssertionError("unreachable: at < the total")


def has_tdmrep(i: int) -> bool:
    return (i * 2_654_435_761) % 10_000 < TDMREP_SHARE * 10_000
