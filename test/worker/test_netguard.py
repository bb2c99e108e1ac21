import socket

import pytest

from worker.download.netguard import (
    AddressPolicy,
    BlockedAddressError,
    GuardedResolver,
    literal_address,
    parse_networks,
)

POLICY = AddressPolicy()


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.255.0.9",
        "10.0.0.1",
        "172.16.5.4",
        "172.31.255.255",
        "192.168.1.1",
        "169.254.169.254",
        "169.254.0.1",
        "100.64.0.1",
        "100.127.255.254",
        "0.0.0.0",
        "0.1.2.3",
        "224.0.0.1",
        "239.255.255.250",
        "255.255.255.255",
        "240.0.0.1",
        "192.0.2.1",
        "198.18.0.1",
        "::1",
        "::",
        "fe80::1",
        "fc00::1",
        "fd12:3456::1",
        "ff02::1",
        "::ffff:127.0.0.1",
        "::ffff:10.0.0.1",
        "::ffff:169.254.169.254",
        "2002:7f00:1::",
        "2002:a00:1::",
        "64:ff9b::7f00:1",
        "64:ff9b::a9fe:a9fe",
        "2001:db8::1",
        "2001::1",
    ],
)
def test_non_public_addresses_are_refused(address):
    assert not POLICY.allows(address)


@pytest.mark.parametrize(
    "address",
    [
        "8.8.8.8",
        "1.1.1.1",
        "93.184.216.34",
        "2001:4860:4860::8888",
        "::ffff:8.8.8.8",
        "2002:808:808::",
        "64:ff9b::808:808",
    ],
)
def test_public_addresses_are_allowed(address):
    assert POLICY.allows(address)


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("[::1]", "::1"),
        ("::ffff:7f00:1", "::ffff:7f00:1"),
        ("017700000001", "127.0.0.1"),
        ("example.com", None),
        ("cafe.be", None),
        ("1.2.3.4.5", None),
        ("08.1.1.1", None),
        ("localhost", None),
    ],
)
def test_literal_addresses_in_every_spelling(host, address):
    parsed = literal_address(host)
    assert (str(parsed) if parsed else None) == address


@pytest.mark.parametrize(
    "host", ["2130706433", "0177.0.0.1", "0x7f.1", "[::ffff:127.0.0.1]", "10.1.2.3"]
)
def test_odd_spellings_of_private_addresses_are_refused_before_any_lookup(host):
    assert POLICY.refusal(host) is not None


def test_names_are_left_to_the_resolver():
    assert POLICY.refusal("example.com") is None
    assert POLICY.refusal("8.8.8.8") is None


def test_allowed_private_networks_exempt_exactly_what_they_name():
    policy = AddressPolicy(parse_networks("127.0.0.0/8, 10.1.0.0/16"))
    assert policy.allows("127.0.0.1") and policy.allows("::ffff:127.0.0.1")
    assert policy.allows("10.1.200.3")
    assert not policy.allows("10.2.0.1")
    assert not policy.allows("169.254.169.254")


@pytest.mark.parametrize("spec", ["nonsense", "10.0.0.0/33", "1.2.3.4/8/9"])
def test_bad_network_specs_are_named(spec):
    with pytest.raises(ValueError, match="not a network"):
        parse_networks(spec)


class FakeResolver:
    def __init__(self, addresses):
        self.addresses = addresses

    async def resolve(self, host, port=0, family=socket.AF_INET):
        return [
            {
                "hostname": host,
                "host": a,
                "port": port,
                "family": socket.AF_INET,
                "proto": 0,
                "flags": 0,
            }
            for a in self.addresses
        ]

    async def close(self):
        pass


async def test_the_resolver_passes_on_only_allowed_addresses():
    resolver = GuardedResolver(POLICY, FakeResolver(["10.0.0.5", "93.184.216.34"]))
    results = await resolver.resolve("mixed.example", 80)
    assert [r["host"] for r in results] == ["93.184.216.34"]


async def test_a_name_that_resolves_only_to_private_addresses_is_blocked():
    resolver = GuardedResolver(POLICY, FakeResolver(["127.0.0.1", "169.254.169.254"]))
    with pytest.raises(BlockedAddressError) as raised:
        await resolver.resolve("metadata.internal", 80)
    assert raised.value.addresses == ["127.0.0.1", "169.254.169.254"]


def test_the_worker_reads_allowed_networks_from_its_environment():
    from image_crawler.config import ConfigError
    from worker.settings import WorkerSettings

    policy = WorkerSettings.from_env(
        {"ALLOWED_PRIVATE_NETWORKS": "127.0.0.0/8"}
    ).fetch.address_policy
    assert policy.allows("127.0.0.1") and not policy.allows("10.0.0.1")
    assert not WorkerSettings.from_env({}).fetch.address_policy.allows("127.0.0.1")
    with pytest.raises(ConfigError, match="ALLOWED_PRIVATE_NETWORKS"):
        WorkerSettings.from_env({"ALLOWED_PRIVATE_NETWORKS": "localhost"})
