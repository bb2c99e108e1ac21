"""What one robots.txt file allows, for our product token (RFC 9309).

The parsing and matching are Protego's (the parser Scrapy uses): groups chosen by the
product token case-insensitively, else ``*``; the longest matching rule wins, ``Allow``
on a tie; ``*`` and ``$`` in paths; ``/robots.txt`` always allowed. This module is the
project's one entry point to it, so that the table of parser cases in the tests runs
through exactly what the worker runs.

``decided_rules`` is what the robots.txt cache keeps of a file: the lines that apply to
our token (the group Protego chooses for it, and the ``Content-Signal`` lines
worker.politeness.signals reads for it) as a file of one ``*`` group, which answers every
question the worker asks (``allows``, ``crawl_delay_s``, ``signals``) as the whole file
does. It walks the file as Protego does, with Protego's own line reader, and asks
Protego which group applies: ``test_robots_decided.py`` holds the two to the same
answers over a sample of real files and the parser tables.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import quote

from protego import Protego

# Protego's own line reader and directive names (pinned in constraints.txt): the decided
# rules must be read as Protego reads the whole file.
from protego._protego import (
    _ALLOW_DIRECTIVE,
    _CRAWL_DELAY_DIRECTIVE,
    _DISALLOW_DIRECTIVE,
    _SITE_WIDE_DIRECTIVES,
    _USER_AGENT_DIRECTIVE,
    _extract_directive,
)

from worker.politeness.signals import (
    NO_SIGNALS,
    Signals,
    content_signal_lines,
    content_signals,
)

# RFC 9309 2.2.1: a product token is letters, "_" and "-".
PRODUCT_TOKEN: Final = re.compile(r"[A-Za-z_-]+")
DEFAULT_PRODUCT_TOKEN: Final = "image-crawler"

# RFC 9309 2.2: a line ends at CR, LF or CRLF only. Protego splits the file with
# str.splitlines(), which also breaks lines at these; in a rule they are characters of
# the path, so they are given the percent-encoding Protego would give them there (a
# "Disallow: /a<U+2028>b" must not become "Disallow: /a").
_NOT_LINE_BREAKS: Final = {ord(c): quote(c) for c in "\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"}
_NOT_LINE_BREAK_CHARS: Final = tuple(map(chr, _NOT_LINE_BREAKS))


def product_token(user_agent: str) -> str:
    """The product token at the start of a User-Agent ("image-crawler/0.1 (+...)" ->
    "image-crawler"); the default token when it starts with none."""
    match = PRODUCT_TOKEN.match(user_agent.strip())
    return match.group() if match else DEFAULT_PRODUCT_TOKEN


class RobotsRules:
    """A parsed robots.txt, asked about URLs for one product token."""

    __slots__ = ("_parsed", "_token", "signals")

    def __init__(self, parsed: Protego | None, token: str, signals: Signals = NO_SIGNALS) -> None:
        self._parsed = parsed
        self._token = token
        # The file's Content-Signal lines for us (Protego does not read them).
        self.signals = signals

    @classmethod
    def parse(cls, text: str, token: str) -> RobotsRules:
        """``text``: the file decoded as UTF-8, undecodable bytes replaced (U+FFFD)."""
        text = _prepared(text)
        return cls(_parsed(text), token, content_signals(text, token))

    @classmethod
    def allow_all(cls, token: str) -> RobotsRules:
        """What a host without a robots.txt (a 4xx) allows: everything."""
        return cls(None, token)

    def allows(self, url: str) -> bool:
        """Whether ``url`` (absolute, of this file's host) may be requested."""
        return self._parsed is None or self._parsed.can_fetch(url, self._token)

    @property
    def crawl_delay_s(self) -> float | None:
        """The group's ``Crawl-delay`` in seconds, None without a usable one."""
        if self._parsed is None:
            return None
        delay = self._parsed.crawl_delay(self._token)
        if delay is None or not delay >= 0 or delay == float("inf"):
            return None
        return float(delay)


def _parsed(text: str) -> Protego:
    """``Protego.parse(text)``, freed by reference counting alone."""
    parsed = Protego.parse(text)
    # Each of Protego's rule sets points back at its parser, which it needs only while
    # parsing (a cache of URL patterns, line numbers for its warnings). That cycle, about
    # ten objects a file, could be freed only by the cyclic collector: on a long tail of
    # new hosts (two files a host) it was all the worker's cyclic garbage
    # (bench/README.md, "Long-tail figures").
    for rule_set in parsed._user_agents.values():
        del rule_set._parser_instance
    return parsed


def _prepared(text: str) -> str:
    """The file as Protego is given it."""
    # A UTF-8 byte-order mark, which Protego would read as part of the first line's
    # name, is skipped, as Google's parser does; so is a partial one (its first one
    # or two bytes), which decoding has turned into one U+FFFD.
    if text.startswith(("\ufeff", "\ufffd")):
        text = text[1:]
    if any(c in text for c in _NOT_LINE_BREAK_CHARS):
        text = text.translate(_NOT_LINE_BREAKS)
    return text


def decided_rules(text: str, token: str) -> str:
    """What of the robots.txt ``text`` applies to ``token``, as a robots.txt of its own:
    the rules (``allow``, ``disallow``) and ``crawl-delay`` lines of the group Protego
    chooses for the token, in their order, and the ``content-signal`` lines read for it,
    under one ``User-agent: *``; empty when nothing applies. ``RobotsRules.parse`` of it
    answers as of ``text``. Sitemaps, ``Host``, ``Request-rate`` and ``Visit-time`` are
    not kept: the worker reads none of them."""
    text = _prepared(text)
    chosen = _parsed(text)._get_matching_rule_set(token)
    agent = None if chosen is None else chosen.user_agent
    lines = [] if agent is None else _group_lines(text, agent)
    lines += [f"content-signal: {value.strip()}" for value in content_signal_lines(text, token)]
    return "".join(f"{line}\n" for line in ["User-agent: *", *lines]) if lines else ""


# The directives kept, by the name they are written with.
_KEPT: Final = (
    (_ALLOW_DIRECTIVE, "allow"),
    (_DISALLOW_DIRECTIVE, "disallow"),
    (_CRAWL_DELAY_DIRECTIVE, "crawl-delay"),
)


def _group_lines(text: str, agent: str) -> list[str]:
    """The lines Protego adds to the rule set of ``agent`` (a user agent as Protego keys
    it) as it parses ``text``, in Protego's own steps (protego/_protego.py,
    ``_parse_robotstxt``): every group naming the agent, merged."""
    kept: list[str] = []
    agents: set[str] = set()  # of the current group, as Protego keys them
    previous: str | None = None
    for raw in text.splitlines():
        line = raw.partition("#")[0].strip()
        directive = _extract_directive(line) if line else None
        if directive is None:
            continue
        field, value = directive
        user_agent = field in _USER_AGENT_DIRECTIVE
        if user_agent and previous is not None and previous not in _USER_AGENT_DIRECTIVE:
            agents = set()
        if field not in _SITE_WIDE_DIRECTIVES:
            previous = field
        if not value:
            continue
        if user_agent:
            name = value.strip().lower()
            agents.add(name)
            if name != "*" and "*" in name and name.replace("*", ""):
                agents.add(name.replace("*", ""))
        elif agent in agents:
            kept.extend(f"{written}: {value}" for names, written in _KEPT if field in names)
    return kept
