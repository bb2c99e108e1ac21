"""Where the fetcher may connect: the public internet, never the crawler's own network.

A URL comes from a queue the crawler does not control. Before connecting, its host is
checked: a literal address (including odd IPv4 spellings such as ``2130706433`` or
``0177.0.0.1``, and IPv4 addresses wrapped in IPv6) directly, a name through
``GuardedResolver``, which resolves it once and hands the connector only the addresses
that passed, so nothing is looked up a second time. ``ALLOWED_PRIVATE_NETWORKS`` exempts
networks an operator names (``127.0.0.0/8`` for a local test origin).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import socket
from collections.abc import Iterable

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# IPv6 prefixes that carry an IPv4 address in their last 32 bits (NAT64, RFC 6052/8215).
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
# What the C library's inet_aton accepts as IPv4: 1-4 parts, decimal, octal or hex.
_INET_ATON_SHAPE = re.compile(r"^(0[xX][0-9a-fA-F]*|[0-9]+)(\.(0[xX][0-9a-fA-F]*|[0-9]+)){0,3}$")


class BlockedAddressError(OSError):
    """A host resolved only to addresses the crawler must not connect to."""

    def __init__(self, host: str, addresses: Iterable[str]) -> None:
        self.host = host
        self.addresses = sorted(set(addresses))
        super().__init__(f"{host} resolves only to blocked addresses {self.addresses}")


def parse_networks(spec: str) -> tuple[IPNetwork, ...]:
    """``"127.0.0.0/8, 10.1.0.0/16"`` -> networks; raises ValueError naming a bad entry."""
    networks = []
    for part in spec.replace(";", ",").split(","):
        part = part.strip()
        if not part:
            continue
        try:
            networks.append(ipaddress.ip_network(part, strict=False))
        except ValueError:
            raise ValueError(f"not a network: {part!r}") from None
    return tuple(networks)


def literal_address(host: str) -> IPAddress | None:
    """The address ``host`` spells, in any spelling a C resolver would accept, else None."""
    host = host.strip("[]")
    if ":" not in host and not _INET_ATON_SHAPE.match(host):
        # A name: every IPv6 spelling has a ':', every IPv4 one is of that shape. Asked
        # of every request's host, most of them names: two exceptions spared each.
        return None
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        pass
    if _INET_ATON_SHAPE.match(host):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def _unwrap(address: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 form stands for (mapped, 6to4, NAT64), else ``address``."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address.sixtofour is not None:
            return address.sixtofour
        if any(address in net for net in _NAT64):
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


@dataclasses.dataclass(frozen=True, slots=True)
class AddressPolicy:
    """Public unicast addresses only, plus the networks an operator exempts."""

    allowed_networks: tuple[IPNetwork, ...] = ()

    def allows(self, address: IPAddress | str) -> bool:
        if isinstance(address, str):
            address = ipaddress.ip_address(address.split("%", 1)[0])
        inner = _unwrap(address)
        for candidate in {address, inner}:
            if any(candidate in net for net in self.allowed_networks):
                return True
        if isinstance(address, ipaddress.IPv6Address) and address.teredo is not None:
            return False  # the client address inside is obfuscated; refuse the whole range
        # is_global rules out private, loopback, link-local, CGNAT, unspecified, reserved
        # and documentation ranges; multicast is "global" for some scopes, so exclude it.
        return inner.is_global and not inner.is_multicast

    def refusal(self, host: str) -> str | None:
        """Why a literal-address ``host`` is refused, or None (names are checked on resolve)."""
        address = literal_address(host)
        if address is None or self.allows(address):
            return None
        return f"{host} is the non-public address {address}"


class GuardedResolver(AbstractResolver):
    """Resolves through ``inner`` and passes on only the addresses the policy allows."""

    def __init__(self, policy: AddressPolicy, inner: AbstractResolver | None = None) -> None:
        self._policy = policy
        self._inner = inner if inner is not None else ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        allowed = [r for r in results if self._policy.allows(r["host"])]
        if not allowed:
            raise BlockedAddressError(host, (r["host"] for r in results))
        return allowed

    async def close(self) -> None:
        await self._inner.close()
