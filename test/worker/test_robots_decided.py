"""What the robots.txt cache keeps of a file (``decided_rules``: the lines that apply to
our token) answers every question as the whole file does, over a sample of real files
(test/data/robots_mix/) and the parser tables of test_robots_rules.py; and the entry's
format in Redis: compact, compressed where that is shorter, read back whole, the format
before it still read."""

from __future__ import annotations

import gc
import json
import random
import re

import pytest

from test.harness.robots_mix import TDMREP_FILE, files
from test.worker.test_robots_rules import GOOGLE_CASES, MORE_CASES, RFC_CASES
from worker.politeness.robots import RobotsEntry, file_digest
from worker.politeness.robots_rules import RobotsRules, decided_rules
from worker.politeness.signals import TdmRep, compact_tdmrep

TOKENS = ("image-crawler", "googlebot", "Bingbot", "GPTBot", "foo")
_PATTERN_LINE = re.compile(r"^\s*(?:dis)?allow\s*:?\s*(\S+)", re.IGNORECASE | re.MULTILINE)


def paths_of(text: str, rng: random.Random, count: int = 40) -> list[str]:
    """Paths a file's rules are about: each pattern of the file (any group's) made a
    path (its ``*`` filled, its ``$`` dropped or kept), a step beside it, and common
    paths."""
    paths = ["/", "/index.html", "/a.jpg", "/images/photo.jpg", "/search?q=x", "/robots.txt"]
    for pattern in _PATTERN_LINE.findall(text):
        filled = pattern.replace("*", rng.choice(["", "x", "abc/def", "?a=1"]))
        paths += [filled.rstrip("$"), filled, filled + "x", filled.rstrip("/$") + "/z.png"]
    rng.shuffle(paths)
    kept = paths[: min(300, max(count, len(paths) // 4))]
    return [p if p.startswith("/") else "/" + p for p in kept]


def assert_same_answers(text: str, token: str, paths: list[str], decide=decided_rules) -> None:
    whole = RobotsRules.parse(text, token)
    kept = RobotsRules.parse(decide(text, token), token)
    assert kept.crawl_delay_s == whole.crawl_delay_s
    assert kept.signals == whole.signals
    for path in paths:
        url = f"https://www.example.com{path}"
        assert kept.allows(url) == whole.allows(url), (token, path)


@pytest.mark.parametrize("site_text", files(), ids=[site for site, _ in files()])
def test_a_real_files_decided_rules_answer_as_the_file(site_text: tuple[str, str]) -> None:
    site, text = site_text
    rng = random.Random(site)
    paths = paths_of(text, rng)
    for token in TOKENS:
        assert_same_answers(text, token, paths)


@pytest.mark.parametrize(
    ("robots", "token", "url", "expected"),
    [pytest.param(*case.values, id=case.id) for case in RFC_CASES + GOOGLE_CASES + MORE_CASES],
)
def test_the_parser_tables_answer_the_same_from_the_decided_rules(robots, token, url, expected):
    whole = RobotsRules.parse(robots, token)
    kept = RobotsRules.parse(decided_rules(robots, token), token)
    assert kept.allows(url) == whole.allows(url)
    assert kept.crawl_delay_s == whole.crawl_delay_s


def test_the_check_sees_the_wrong_group_kept() -> None:
    text = "User-agent: *\nDisallow: /a\n\nUser-agent: image-crawler\nDisallow: /b\n"
    assert decided_rules(text, "image-crawler") == "User-agent: *\ndisallow: /b\n"

    def star_group(text: str, token: str) -> str:
        return decided_rules(text, "no-group-of-its-own")

    with pytest.raises(AssertionError):
        assert_same_answers(text, "image-crawler", ["/a", "/b"], decide=star_group)


SIGNALS_AND_DELAY = """\
User-agent: GPTBot
Disallow: /

User-agent: image-crawler
User-agent: other
Disallow: /private/  # ours
Crawl-delay: 5
Content-Signal: search=yes, ai-train=no
Sitemap: https://example.com/sitemap.xml

User-agent: *
Disallow: /
Content-Signal: ai-input=no

user-agent: Image-Crawler
allow: /private/open$
"""


def test_only_our_groups_are_kept_with_their_delay_and_signals() -> None:
    kept = decided_rules(SIGNALS_AND_DELAY, "image-crawler")
    assert kept == (
        "User-agent: *\n"
        "disallow: /private/\n"
        "crawl-delay: 5\n"
        "allow: /private/open$\n"
        "content-signal: search=yes, ai-train=no\n"
    )
    assert_same_answers(
        SIGNALS_AND_DELAY, "image-crawler", ["/", "/private/a", "/private/open", "/x"]
    )
    rules = RobotsRules.parse(kept, "image-crawler")
    assert rules.crawl_delay_s == 5 and rules.signals.opt_outs == ("ai-train",)


def test_a_parsed_file_leaves_no_cyclic_garbage() -> None:
    # A worker on a long tail parses two files a new host (the fetched one, then what it
    # keeps of it): each was a reference cycle left to the cyclic collector.
    gc.collect()
    gc.disable()
    try:
        kept = decided_rules(SIGNALS_AND_DELAY, "image-crawler")
        rules = RobotsRules.parse(kept, "image-crawler")
        assert not rules.allows("https://example.org/private/a")
        assert rules.allows("https://example.org/private/open")
        del rules
        assert gc.collect() == 0
    finally:
        gc.enable()


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("", ""),
        ("# nothing but a comment\n", ""),
        ("User-agent: GPTBot\nDisallow: /\n", ""),  # not ours: everything allowed
        ("Disallow: /outside-any-group\n", ""),
        (
            "User-agent: *\nContent-Signal: search=no\n",
            "User-agent: *\ncontent-signal: search=no\n",
        ),
    ],
)
def test_files_that_say_nothing_to_us_keep_little(text: str, kept: str) -> None:
    assert decided_rules(text, "image-crawler") == kept
    assert_same_answers(text, "image-crawler", ["/", "/outside-any-group"])


# --- the entry in Redis ----------------------------------------------------------------------
def test_an_entry_is_read_back_whole_and_long_texts_are_compressed() -> None:
    _, text = max(files(), key=lambda f: len(decided_rules(f[1], "image-crawler")))
    kept = decided_rules(text, "image-crawler")
    tdmrep = compact_tdmrep(TDMREP_FILE)
    entry = RobotsEntry(
        "200", kept, 1.5, 86401.5, tdmrep=tdmrep, digest=file_digest(text), token="image-crawler"
    )
    raw = entry.to_json()
    assert RobotsEntry.from_json(raw) == entry
    stored = json.loads(raw)
    assert stored["v"] == 2 and "rz" in stored and "r" not in stored
    assert len(raw) < len(kept) / 2  # this file's rules compress well
    assert stored["d"] == file_digest(text) and len(stored["d"]) == 16


def test_a_short_entry_is_plain_json_without_defaults() -> None:
    entry = RobotsEntry("404", None, 1.0, 2.0)
    assert json.loads(entry.to_json()) == {"v": 2, "s": "404", "f": 1.0, "e": 2.0}
    small = RobotsEntry("200", "User-agent: *\ndisallow: /a\n", 1.0, 2.0, token="t")
    assert json.loads(small.to_json())["r"] == small.text
    assert RobotsEntry.from_json(small.to_json()) == small


def test_an_entry_of_the_format_before_is_read() -> None:
    # As versions before ENTRY_VERSION wrote it: the whole file, long names.
    old = json.dumps(
        {
            "status": "503",
            "text": None,
            "fetched_at": 10.0,
            "expires_at": 70.0,
            "unavailable_since": 5.0,
            "failures": 2,
            "tdmrep": None,
        }
    )
    assert RobotsEntry.from_json(old) == RobotsEntry("503", None, 10.0, 70.0, 5.0, 2)
    old_file = json.dumps(
        {"status": "200", "text": SIGNALS_AND_DELAY, "fetched_at": 1, "expires_at": 2}
    )
    entry = RobotsEntry.from_json(old_file)
    assert entry is not None and entry.text == SIGNALS_AND_DELAY
    assert entry.token is None and entry.digest is None


@pytest.mark.parametrize(
    "raw",
    [
        '{"v": 3, "s": "200", "f": 1, "e": 2}',
        '{"v": 2, "s": "200", "f": 1, "e": 2, "rz": "%%"}',
        '{"v": 2, "f": 1, "e": 2}',
        "[1]",
        "7",
    ],
)
def test_what_is_not_an_entry_is_fetched_again(raw: str) -> None:
    assert RobotsEntry.from_json(raw) is None


def test_a_compacted_tdmrep_reads_as_the_file() -> None:
    text = json.dumps(
        [
            {"location": "/a/*", "tdm-reservation": 1, "tdm-policy": " https://p.example ", "x": 1},
            {"location": 5, "tdm-reservation": 1},  # unreadable: skipped
            {"location": "/b$", "tdm-reservation": 0},
        ]
    )
    compact = compact_tdmrep(text)
    assert compact is not None and len(compact) < len(text)
    for path in ("/a/x", "/b", "/bb", "/c"):
        assert TdmRep.parse(compact).signals(path) == TdmRep.parse(text).signals(path)
    assert compact_tdmrep("[]") is None and compact_tdmrep("not json") is None


# --- the worker's copy ----------------------------------------------------------------------
def _known_of(text: str | None) -> object:
    from worker.politeness.robots import _Known

    return _Known(RobotsEntry("200", text, 1.0, 2.0), None)


def test_a_workers_parsed_hosts_are_bounded_by_count_and_by_their_rules_size() -> None:
    from redis.asyncio import Redis

    from worker.politeness.robots import RobotsGuard
    from worker.settings import RobotsSettings

    settings = RobotsSettings(local_hosts=5, local_rules_chars=1000)
    # A client that is never asked anything: it connects only when it is.
    guard = RobotsGuard(Redis(), None, None, settings)  # type: ignore[arg-type]
    for i in range(8):
        guard._remember(f"https://h{i}:443", _known_of("x" * 10))  # type: ignore[arg-type]
    assert list(guard._known) == [f"https://h{i}:443" for i in range(3, 8)]
    # One long file pushes out the hosts used least recently, until the rules fit.
    guard._remember("https://long:443", _known_of("y" * 700))  # type: ignore[arg-type]
    assert list(guard._known) == ["https://h7:443", "https://long:443"]
    assert guard._known_chars == 110 + 800
    # Remembered again (re-read from Redis): counted once, the oldest pushed out.
    guard._remember("https://h7:443", _known_of("x" * 10))  # type: ignore[arg-type]
    assert list(guard._known) == ["https://long:443", "https://h7:443"]
    assert guard._known_chars == 910
    # A host longer than the whole budget is still kept, alone (it is being used).
    guard._remember("https://huge:443", _known_of("z" * 5000))  # type: ignore[arg-type]
    assert list(guard._known) == ["https://huge:443"]
