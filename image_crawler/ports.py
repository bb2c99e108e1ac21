"""A port setting's value: one port (``9101``; 0 is any free port) or an inclusive range
``FIRST-LAST`` (``9101-9103``, 1 <= FIRST <= LAST <= 65535) that several processes
sharing one network namespace take ports from, each the first free one.

Standard library only: ``python -m image_crawler.healthcheck`` reads METRICS_PORT with
it, and must start in milliseconds.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Final

MAX_PORT: Final = 65535

_PORTS = re.compile(r"([0-9]+)(?:-([0-9]+))?")


@dataclasses.dataclass(frozen=True, slots=True)
class PortRange:
    """Ports ``first`` to ``last``, both included; a single port when they are equal."""

    first: int
    last: int

    @property
    def is_range(self) -> bool:
        return self.last != self.first

    def __contains__(self, port: object) -> bool:
        return isinstance(port, int) and self.first <= port <= self.last

    def __str__(self) -> str:
        return f"{self.first}-{self.last}" if self.is_range else str(self.first)


def parse_ports(name: str, raw: str) -> PortRange:
    """``raw`` (the value of variable ``name``) as ports; ValueError names both when it is
    not a port, a range runs backwards or includes 0, or a port is above 65535."""
    match = _PORTS.fullmatch(raw.strip())
    if match is None:
        raise ValueError(
            f"{name} must be a port (9101) or a range of ports FIRST-LAST (9101-9103), got {raw!r}"
        )
    first = int(match[1])
    last = first if match[2] is None else int(match[2])
    if max(first, last) > MAX_PORT:
        raise ValueError(f"{name} must be at most {MAX_PORT}, got {raw!r}")
    if match[2] is not None and first == 0:
        raise ValueError(f"{name}: a range starts at port 1 or above (0 is any port), got {raw!r}")
    if last < first:
        raise ValueError(f"{name}: a range runs from its lower port to its higher, got {raw!r}")
    return PortRange(first, last)
