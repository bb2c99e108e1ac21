"""What a server says of how its images may be used, beside whether they may be fetched.

Three signals, read wherever the server puts them:

- **X-Robots-Tag** on an image's answer (every instance of the header; directives
  separated by commas, case-insensitive; a group prefixed ``name:`` applies only when
  ``name`` is our robots token). ``noindex``, ``noimageindex``, ``none`` and an
  ``unavailable_after`` date already past keep the image out of the index; ``noai`` and
  ``noimageai`` are opt-outs, carried with the image. Anything else (``nofollow``,
  ``noarchive``, a future ``unavailable_after``, another agent's group) changes nothing.
- **TDMRep** (the W3C community group's TDM Reservation Protocol): a ``tdm-reservation:
  1`` header, or a host's ``/.well-known/tdmrep.json`` rule covering the URL's path,
  reserves text and data mining rights (opt-out ``tdm-reservation``); ``tdm-policy`` names
  where the terms are. A file that cannot be read means no reservation known: it is an
  opt-out signal, not a permission.
- **Content Signals** (the ``Content-Signal:`` line of robots.txt, in the group that
  applies to our token): ``search=no`` keeps the host's images out of the index;
  ``ai-train=no`` and ``ai-input=no`` are opt-outs. Protego does not read the line, so
  the groups are walked here, from the same text.

Everything here is pure and bounded: a hostile header or file costs a capped amount of
work and says nothing it does not say.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import email.utils
import itertools
import json
import re
from collections.abc import Iterable
from typing import Final

from image_crawler.contract import OPT_OUTS

# X-Robots-Tag directives that keep an image out of the index, and those that are
# opt-outs carried with it (named as the header names them).
NOINDEX_DIRECTIVES: Final = frozenset({"noindex", "noimageindex", "none"})
# The opt-outs published in a resolution message's ``opt_outs``, as the contract names
# them: X-Robots-Tag's two, TDMRep's reservation, Content Signals' two.
NOAI, NOIMAGEAI, TDM_RESERVATION, AI_TRAIN, AI_INPUT = OPT_OUTS
AI_DIRECTIVES: Final = (NOAI, NOIMAGEAI)
# Directives whose value follows a colon: a name before a colon that is not one of these
# is a user agent's.
_VALUED_DIRECTIVES: Final = frozenset(
    {"unavailable_after", "max-snippet", "max-image-preview", "max-video-preview"}
)
UNAVAILABLE_AFTER: Final = "unavailable_after"

# Content-Signal names and the opt-out each "no" means (search=no is not an opt-out: the
# image is not indexed at all).
_CONTENT_SIGNAL_OPT_OUTS: Final = {"ai-train": AI_TRAIN, "ai-input": AI_INPUT}
SEARCH: Final = "search"

# Bounds on what a hostile server can make this module do.
MAX_HEADER_INSTANCES: Final = 32
MAX_DIRECTIVES: Final = 64
MAX_POLICY_CHARS: Final = 2048
MAX_TDMREP_RULES: Final = 1000
MAX_LOCATION_CHARS: Final = 2048
MAX_CONTENT_SIGNAL_LINES: Final = 64


@dataclasses.dataclass(frozen=True, slots=True)
class Signals:
    """What one answer, file or host says: ``noindex`` the directives that keep the image
    out of the index (empty: it may be indexed), ``opt_outs`` the opt-outs to publish with
    it, ``tdm_policy`` the TDMRep policy URL given with a reservation."""

    noindex: tuple[str, ...] = ()
    opt_outs: tuple[str, ...] = ()
    tdm_policy: str | None = None

    def __bool__(self) -> bool:
        return bool(self.noindex or self.opt_outs or self.tdm_policy)

    def __or__(self, other: Signals) -> Signals:
        if not other:
            return self
        if not self:
            return other
        return Signals(
            noindex=_union(self.noindex, other.noindex),
            opt_outs=_union(self.opt_outs, other.opt_outs),
            tdm_policy=self.tdm_policy or other.tdm_policy,
        )


NO_SIGNALS: Final = Signals()


def _union(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
    return a + tuple(x for x in b if x not in a)


# --- X-Robots-Tag ---------------------------------------------------------------------------
def x_robots_tag(values: Iterable[str], token: str, now: dt.datetime) -> Signals:
    """The signals of an answer's X-Robots-Tag header instances, for our ``token``.

    ``now`` must be timezone-aware: an ``unavailable_after`` date before it keeps the
    image out of the index.
    """
    token = token.lower()
    noindex: list[str] = []
    opt_outs: list[str] = []
    for value in itertools.islice(values, MAX_HEADER_INSTANCES):
        agent: str | None = None
        pieces = value.split(",", MAX_DIRECTIVES)[:MAX_DIRECTIVES]
        i = 0
        while i < len(pieces):
            piece = pieces[i].strip()
            i += 1
            name, colon, rest = piece.partition(":")
            name = name.strip().lower()
            if colon and name not in _VALUED_DIRECTIVES:
                # "otherbot: noindex, nofollow": the group's agent, until the next one.
                agent = name
                piece = rest.strip()
                name, colon, rest = piece.partition(":")
                name = name.strip().lower()
            if agent is not None and agent != token:
                continue
            said = piece if agent is None else f"{agent}: {piece}"
            if name in NOINDEX_DIRECTIVES and not colon:
                noindex.append(said.lower())
            elif name in AI_DIRECTIVES and not colon:
                opt_outs.append(name)
            elif name == UNAVAILABLE_AFTER and colon:
                when = _date(rest)
                if when is None and i < len(pieces):
                    # An RFC 850 date has a comma of its own: "Friday, 25-Jun-10 ...".
                    when = _date(f"{rest},{pieces[i]}")
                    if when is not None:
                        said = f"{said},{pieces[i]}".strip()
                        i += 1
                if when is not None and when <= now:
                    noindex.append(" ".join(said.split()))
    return Signals(noindex=tuple(dict.fromkeys(noindex)), opt_outs=tuple(dict.fromkeys(opt_outs)))


def _date(text: str) -> dt.datetime | None:
    """An ``unavailable_after`` date: RFC 822/850/1123 or ISO 8601; without a zone, UTC.
    None when it is none of those (an unreadable date changes nothing)."""
    text = text.strip()
    if not text or len(text) > 100:
        return None
    when: dt.datetime | None
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        when = None
    if when is None:
        try:
            when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            return None
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)


# --- TDMRep -------------------------------------------------------------------------------
def tdm_headers(reservation: str | None, policy: str | None) -> Signals:
    """The signals of an answer's ``tdm-reservation`` and ``tdm-policy`` headers."""
    if reservation is None or reservation.strip() != "1":
        return NO_SIGNALS
    return Signals(opt_outs=(TDM_RESERVATION,), tdm_policy=_policy(policy))


def _policy(policy: object) -> str | None:
    if not isinstance(policy, str):
        return None
    policy = policy.strip()
    if not policy or len(policy) > MAX_POLICY_CHARS or not policy.isprintable():
        return None
    return policy


@dataclasses.dataclass(frozen=True, slots=True)
class _Location:
    """A robots.txt path pattern: ``parts`` are the text between its ``*``s; the first
    must start the path, the last end it when ``anchored`` (a final ``$``).

    Matched by finding each part at its leftmost place in turn, not by a regular
    expression: a pattern of many ``*`` makes a backtracking matcher take exponential
    time on a path it does not match; this takes at most a pass per part."""

    parts: tuple[str, ...]
    anchored: bool

    @classmethod
    def parse(cls, location: str) -> _Location:
        location = location.strip() or "/"
        if not location.startswith(("/", "*")):
            location = "/" + location
        anchored = location.endswith("$")
        return cls(tuple(re.split(r"\*+", location[:-1] if anchored else location)), anchored)

    def matches(self, path: str) -> bool:
        first, *rest = self.parts
        if not path.startswith(first):
            return False
        if not rest:
            return not self.anchored or path == first
        at = len(first)
        last = rest.pop()
        for part in rest:
            found = path.find(part, at)
            if found < 0:
                return False
            at = found + len(part)
        if self.anchored:
            return len(path) - len(last) >= at and path.endswith(last)
        return path.find(last, at) >= 0


@dataclasses.dataclass(frozen=True, slots=True)
class _TdmRule:
    location: _Location
    reserved: bool
    policy: str | None


class TdmRep:
    """A host's ``/.well-known/tdmrep.json``: rules, the first whose ``location`` covers a
    URL's path (robots.txt's pattern syntax: ``*`` and a final ``$``) applies."""

    __slots__ = ("_rules",)

    def __init__(self, rules: tuple[_TdmRule, ...] = ()) -> None:
        self._rules = rules

    def __len__(self) -> int:
        return len(self._rules)

    @classmethod
    def parse(cls, text: str | None) -> TdmRep:
        """The file's rules; none (no reservation known) when it is not a JSON array of
        rules. A rule that cannot be read is skipped, not the file."""
        return cls(
            tuple(
                _TdmRule(_Location.parse(location), reservation == 1, policy)
                for location, reservation, policy in _tdmrep_rules(text)
            )
        )

    def signals(self, path: str) -> Signals:
        """What the file says of a URL whose path (and query) is ``path``."""
        for rule in self._rules:
            if rule.location.matches(path):
                if not rule.reserved:
                    return NO_SIGNALS
                return Signals(opt_outs=(TDM_RESERVATION,), tdm_policy=rule.policy)
        return NO_SIGNALS


def _tdmrep_rules(text: str | None) -> list[tuple[str, int, str | None]]:
    """A tdmrep.json's readable rules: (location, tdm-reservation, tdm-policy) each."""
    if not text:
        return []
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return []
    if not isinstance(obj, list):
        return []
    rules = []
    for item in obj[:MAX_TDMREP_RULES]:
        if not isinstance(item, dict):
            continue
        location, reservation = item.get("location"), item.get("tdm-reservation")
        if not isinstance(location, str) or len(location) > MAX_LOCATION_CHARS:
            continue
        if reservation not in (0, 1) or isinstance(reservation, bool):
            continue
        rules.append((location, int(reservation), _policy(item.get("tdm-policy"))))
    return rules


def compact_tdmrep(text: str | None) -> str | None:
    """What the robots.txt cache keeps of a tdmrep.json: its readable rules, and only
    the fields read, as compact JSON (``TdmRep.parse`` of it reads the same rules); None
    when it has none (no reservation known)."""
    rules = [
        {"location": location, "tdm-reservation": reservation}
        | ({"tdm-policy": policy} if policy is not None else {})
        for location, reservation, policy in _tdmrep_rules(text)
    ]
    return json.dumps(rules, separators=(",", ":"), ensure_ascii=False) if rules else None


# --- Content Signals ------------------------------------------------------------------------
def content_signals(text: str, token: str) -> Signals:
    """The ``Content-Signal`` lines of a robots.txt's group for ``token`` (else its ``*``
    group), as signals. Groups are RFC 9309's: one or more ``user-agent`` lines and the
    lines after them; a signal said "no" anywhere in the groups that apply stays "no"."""
    said: dict[str, str] = {}
    for value in content_signal_lines(text, token):
        for pair in value.split(",", MAX_DIRECTIVES)[:MAX_DIRECTIVES]:
            key, equals, answer = pair.partition("=")
            key, answer = key.strip().lower(), answer.strip().lower()
            if equals and answer in ("yes", "no") and said.get(key) != "no":
                said[key] = answer
    noindex = ("content-signal: search=no",) if said.get(SEARCH) == "no" else ()
    opt_outs = tuple(
        opt_out for key, opt_out in _CONTENT_SIGNAL_OPT_OUTS.items() if said.get(key) == "no"
    )
    return Signals(noindex=noindex, opt_outs=opt_outs)


def content_signal_lines(text: str, token: str) -> list[str]:
    """The values of the ``Content-Signal`` lines that apply to ``token`` (the groups
    naming it, else the ``*`` groups), at most ``MAX_CONTENT_SIGNAL_LINES``."""
    token = token.lower()
    mine: list[str] = []
    anyone: list[str] = []
    agents: list[str] = []
    in_rules = False  # a line other than user-agent has been seen since the last agents
    for line in text.splitlines():
        name, colon, value = line.partition("#")[0].partition(":")
        if not colon:
            continue
        name = name.strip().lower()
        if name == "user-agent":
            if in_rules:
                agents, in_rules = [], False
            agents.append(value.strip().lower())
            continue
        in_rules = True
        if name != "content-signal" or not agents:
            continue
        if token in agents:
            mine.append(value)
        if "*" in agents:
            anyone.append(value)
    return (mine or anyone)[:MAX_CONTENT_SIGNAL_LINES]
