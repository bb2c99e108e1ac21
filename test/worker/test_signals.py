"""The opt-out signals a server sends: X-Robots-Tag, TDMRep and Content Signals."""

from __future__ import annotations

import datetime as dt

import pytest

from worker.politeness.signals import (
    NO_SIGNALS,
    Signals,
    TdmRep,
    content_signals,
    tdm_headers,
    x_robots_tag,
)

TOKEN = "image-crawler"
NOW = dt.datetime(2026, 11, 26, 12, 0, tzinfo=dt.UTC)


def xrt(*values: str) -> Signals:
    return x_robots_tag(values, TOKEN, NOW)


@pytest.mark.parametrize(
    ("values", "noindex"),
    [
        (["noindex"], ("noindex",)),
        (["NoImageIndex"], ("noimageindex",)),
        (["none"], ("none",)),
        (["nofollow, NOINDEX"], ("noindex",)),
        (["nofollow", "noindex"], ("noindex",)),  # a second instance of the header
        (["image-crawler: noindex"], ("image-crawler: noindex",)),
        (["Image-Crawler: noimageindex, nofollow"], ("image-crawler: noimageindex",)),
        (["otherbot: nofollow, image-crawler: noindex"], ("image-crawler: noindex",)),
        (
            ["unavailable_after: 25 Jun 2010 15:00:00 PST"],
            ("unavailable_after: 25 Jun 2010 15:00:00 PST",),
        ),
        (["unavailable_after: 2026-11-01"], ("unavailable_after: 2026-11-01",)),
        (["unavailable_after: 2026-11-26T11:00:00Z"], ("unavailable_after: 2026-11-26T11:00:00Z",)),
        (
            ["unavailable_after: Friday, 25-Jun-10 15:00:00 GMT, nofollow"],
            ("unavailable_after: Friday, 25-Jun-10 15:00:00 GMT",),
        ),
    ],
)
def test_directives_that_keep_an_image_out_of_the_index(values, noindex):
    assert xrt(*values).noindex == noindex


@pytest.mark.parametrize(
    "values",
    [
        [],
        [""],
        ["nofollow, noarchive, nosnippet, notranslate"],
        ["max-image-preview: large, max-snippet: -1"],
        ["otherbot: noindex"],
        ["otherbot: noindex, noimageindex"],  # the group runs to the next agent
        ["googlebot: none", "bingbot: noindex"],
        ["unavailable_after: 2030-01-01"],  # not yet
        ["unavailable_after: some day"],  # unreadable: changes nothing
        ["noindexing, index, all"],
        ["image-crawlerx: noindex"],
    ],
)
def test_directives_that_change_nothing(values):
    assert xrt(*values) == NO_SIGNALS


def test_ai_directives_are_opt_outs_not_noindex():
    assert xrt("noai, noimageai") == Signals(opt_outs=("noai", "noimageai"))
    assert xrt("NOAI", "noai") == Signals(opt_outs=("noai",))
    assert xrt("image-crawler: noimageai") == Signals(opt_outs=("noimageai",))
    assert xrt("otherbot: noai") == NO_SIGNALS
    both = xrt("noindex, noai")
    assert both.noindex == ("noindex",) and both.opt_outs == ("noai",)


def test_a_hostile_header_costs_a_bounded_amount_of_work():
    huge = ", ".join(["nofollow"] * 100_000) + ", noindex"
    assert xrt(huge) == NO_SIGNALS  # the directive past the cap is not read
    many = ["nofollow"] * 10_000 + ["noindex"]
    assert xrt(*many) == NO_SIGNALS
    assert xrt("unavailable_after: " + "1" * 10_000) == NO_SIGNALS
    assert xrt(":::,,,:,: :") == NO_SIGNALS


@pytest.mark.parametrize(
    ("reservation", "policy", "expected"),
    [
        ("1", None, Signals(opt_outs=("tdm-reservation",))),
        (
            " 1 ",
            "https://example.org/policy.json",
            Signals((), ("tdm-reservation",), "https://example.org/policy.json"),
        ),
        ("0", "https://example.org/policy.json", NO_SIGNALS),
        (None, "https://example.org/policy.json", NO_SIGNALS),
        ("yes", None, NO_SIGNALS),
        ("1", "x" * 5000, Signals(opt_outs=("tdm-reservation",))),
        ("1", "https://e.org/\x00", Signals(opt_outs=("tdm-reservation",))),
    ],
)
def test_tdm_headers(reservation, policy, expected):
    assert tdm_headers(reservation, policy) == expected


TDMREP = """[
  {"location": "/public/*", "tdm-reservation": 0},
  {"location": "/images/*.jpg$", "tdm-reservation": 1, "tdm-policy": "https://e.org/p.json"},
  {"location": "/images/", "tdm-reservation": 1},
  {"location": "/x", "tdm-reservation": true},
  {"location": 7, "tdm-reservation": 1},
  "junk"
]"""


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/public/images/a.jpg", NO_SIGNALS),  # the first rule that matches applies
        (
            "/images/a.jpg",
            Signals(opt_outs=("tdm-reservation",), tdm_policy="https://e.org/p.json"),
        ),
        ("/images/a.jpg?size=2", Signals(opt_outs=("tdm-reservation",))),
        ("/images/a.png", Signals(opt_outs=("tdm-reservation",))),
        ("/x", NO_SIGNALS),  # a boolean is not 0 or 1
        ("/other/a.jpg", NO_SIGNALS),
    ],
)
def test_tdmrep_rules(path, expected):
    rules = TdmRep.parse(TDMREP)
    assert len(rules) == 3
    assert rules.signals(path) == expected


@pytest.mark.parametrize(
    "text",
    [None, "", "not json", "{}", '{"location": "/", "tdm-reservation": 1}', "[" * 100_000, "null"],
)
def test_a_tdmrep_file_that_cannot_be_read_reserves_nothing(text):
    assert TdmRep.parse(text).signals("/a.jpg") == NO_SIGNALS


def test_a_tdmrep_pattern_of_many_stars_matches_quickly():
    rules = TdmRep.parse('[{"location": "/' + "*a" * 500 + '$", "tdm-reservation": 1}]')
    assert rules.signals("/" + "a" * 5000 + "b") == NO_SIGNALS


ROBOTS = """# Cloudflare's managed robots.txt looks like this
User-Agent: *
Content-Signal: search=yes, ai-train=no
Allow: /

User-agent: otherbot
Content-Signal: search=no
Disallow: /
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (ROBOTS, Signals(opt_outs=("ai-train",))),
        (
            "User-agent: *\nContent-Signal: search=no, ai-input=no\n",
            Signals(("content-signal: search=no",), ("ai-input",)),
        ),
        (
            "User-agent: *\ncontent-signal: AI-Train=NO # no training\n",
            Signals(opt_outs=("ai-train",)),
        ),
        ("User-agent: *\nContent-Signal: search=yes, ai-train=yes, ai-input=yes\n", NO_SIGNALS),
        ("User-agent: *\nDisallow: /private\n", NO_SIGNALS),
        ("", NO_SIGNALS),
        # Before any group: in no group, so for no one.
        ("Content-Signal: search=no\nUser-agent: *\nAllow: /\n", NO_SIGNALS),
        # Our own group wins over *'s.
        (
            "User-agent: *\nContent-Signal: ai-train=no\n\n"
            "User-agent: image-crawler\nContent-Signal: search=yes\n",
            NO_SIGNALS,
        ),
        (
            "User-agent: IMAGE-CRAWLER\nUser-agent: otherbot\nContent-Signal: search=no\n",
            Signals(noindex=("content-signal: search=no",)),
        ),
        # A "no" said in one group that applies stays "no".
        (
            "User-agent: *\nContent-Signal: ai-train=no\nUser-agent: x\nAllow: /\n"
            "User-agent: *\nContent-Signal: ai-train=yes\n",
            Signals(opt_outs=("ai-train",)),
        ),
        ("User-agent: *\nContent-Signal: search=maybe, ai-train, =no\n", NO_SIGNALS),
    ],
)
def test_content_signals(text, expected):
    assert content_signals(text, TOKEN) == expected


def test_signals_combine():
    a = Signals(opt_outs=("noai",), tdm_policy="https://a")
    b = Signals(noindex=("noindex",), opt_outs=("noai", "ai-train"), tdm_policy="https://b")
    assert (a | b) == Signals(("noindex",), ("noai", "ai-train"), "https://a")
    assert (a | NO_SIGNALS) is a and (NO_SIGNALS | a) is a
    assert not NO_SIGNALS


@pytest.mark.parametrize(
    ("location", "path", "matches"),
    [
        ("/", "/anything", True),
        ("", "/anything", True),
        ("images", "/images/a.jpg", True),
        ("/a*b", "/axxb", True),
        ("/a*b", "/axxbyy", True),
        ("/a*b$", "/axxbyy", False),
        ("/a*b$", "/axbxb", True),
        ("/a$", "/a", True),
        ("/a$", "/ab", False),
        ("*.jpg$", "/x/y.jpg", True),
        ("*.jpg$", "/x/y.jpg.png", False),
        ("/a**b*c", "/abc", True),
        ("/a*b*c", "/acb", False),
        ("/ab*ba$", "/aba", False),  # the parts may not overlap
    ],
)
def test_tdmrep_locations_match_as_robots_txt_paths(location, path, matches):
    rules = TdmRep.parse(f'[{{"location": "{location}", "tdm-reservation": 1}}]')
    assert bool(rules.signals(path)) is matches
