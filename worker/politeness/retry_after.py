"""How long to wait before trying a URL again: the server's Retry-After, and our backoff.

A 429 or 503 may say when to come back (RFC 9110, section 10.2.3): ``Retry-After`` is
either a number of seconds (``120``) or an HTTP date (``Fri, 31 Dec 1999 23:59:59 GMT``).
``parse_retry_after`` turns either into seconds from now, capped by ``max_s``; a value
that is neither is malformed and treated as absent. Without one, a retry waits
``image_crawler.retry.backoff_delay``. The parsing is pure: the clock is an argument.

``obey_retry_after`` is what the worker does with a response's header, wherever the
response comes from (an image, a robots.txt file): it holds back every worker's requests
to the sources concerned (``Pacer.pause``) and logs what it read.
"""

from __future__ import annotations

import dataclasses
import datetime
import email.utils
import math
import re
from collections.abc import Iterable

from redis.exceptions import RedisError

from image_crawler.contract import RETRY_AFTER_STATUSES
from image_crawler.logs import get_logger
from worker.politeness.hosts import HostKey
from worker.politeness.pacing import Pacer

log = get_logger(__name__)

# delta-seconds = 1*DIGIT. Matched as text, never converted blindly: a header of 10,000
# digits must not become a huge int (Python refuses str-to-int past 4,300 digits).
_DELTA_SECONDS = re.compile(r"[0-9]+")
# Any delay of this many digits is over every sensible cap (10**12 s is 31,000 years).
_MAX_DIGITS = 12


@dataclasses.dataclass(frozen=True, slots=True)
class RetryAfter:
    """What a ``Retry-After`` header asks: ``delay_s`` seconds from now (None when there
    is no usable header), whether it was ``malformed``, and whether ``capped`` cut it
    down to the maximum."""

    delay_s: float | None
    malformed: bool = False
    capped: bool = False


NO_RETRY_AFTER = RetryAfter(None)
MALFORMED = RetryAfter(None, malformed=True)


def parse_retry_after(value: str | None, now_unix_s: float, max_s: float = math.inf) -> RetryAfter:
    """Seconds to wait from ``now_unix_s`` (a Unix time), at most ``max_s``.

    Accepts delta-seconds (digits only: no sign, fraction or unit) and HTTP dates in the
    IMF-fixdate form and the obsolete RFC 850 and asctime forms; a date in the past means
    0. Surrounding whitespace is ignored. ``None`` or a blank value is no header at all.
    """
    if value is None or not value.strip():
        return NO_RETRY_AFTER
    text = value.strip()
    if _DELTA_SECONDS.fullmatch(text):
        digits = text.lstrip("0") or "0"
        seconds = math.inf if len(digits) > _MAX_DIGITS else float(int(digits))
    else:
        date_s = _http_date(text)
        if date_s is None:
            return MALFORMED
        seconds = max(0.0, date_s - now_unix_s)
    return cap_retry_after(seconds, max_s)


def cap_retry_after(seconds: float, max_s: float) -> RetryAfter:
    """``seconds`` as a ``RetryAfter``, cut to ``max_s`` (and flagged ``capped``) if over."""
    if seconds > max_s:
        return RetryAfter(max_s, capped=True)
    return RetryAfter(seconds)


def _http_date(text: str) -> float | None:
    """The Unix time of an HTTP date, or None if ``text`` is not one."""
    # parsedate_to_datetime is lenient (it takes numeric zones and dates without a
    # weekday, as HTTP recipients may); what it cannot read at all it raises on.
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        # RFC 850 and asctime dates carry no zone (or "-0000"): HTTP dates are all GMT.
        when = when.replace(tzinfo=datetime.UTC)
    try:
        return when.timestamp()
    except (OverflowError, ValueError, OSError):
        return None


async def obey_retry_after(
    pacer: Pacer,
    key: HostKey,
    status: str,
    value: str | None,
    *,
    now_unix_s: float,
    max_s: float,
    also: Iterable[HostKey] = (),
) -> float | None:
    """Act on the ``Retry-After`` of a response of ``key``'s host with ``status``: only a
    429's or a 503's speaks for the host. Pauses the host (and the keys in ``also``: the
    same host as other sources reach it) for every worker, for at most ``max_s``; returns
    the pause in seconds, None when there is none (no header, malformed, or a date already
    past).

    A malformed or capped value is logged. A Redis that is away is logged and otherwise
    ignored: this worker holds the host back anyway, and the others learn of the
    server's wish from their own requests' answers.
    """
    if status not in RETRY_AFTER_STATUSES or value is None:
        return None
    source, host = key.source, key.host
    wait = parse_retry_after(value, now_unix_s, max_s)
    if wait.malformed:
        log.warning(
            "retry_after_malformed", source=source, host=host, status=status, value=value[:100]
        )
    if wait.capped:
        log.warning(
            "retry_after_capped", source=source, host=host, status=status, value=value[:100]
        )
    if not wait.delay_s:
        return None
    log.info(
        "retry_after", source=source, host=host, status=status, wait_s=wait.delay_s, cap_s=max_s
    )
    for paused in dict.fromkeys((key, *also)):
        try:
            await pacer.pause(paused, wait.delay_s)
        except RedisError as e:
            log.warning(
                "redis_unavailable",
                op="pause_host",
                source=paused.source,
                host=paused.host,
                error=repr(e),
            )
    return wait.delay_s
