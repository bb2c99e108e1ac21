"""The index sharded (dedup/shards.py, dedup/shard_server.py): any two hashes within the
radius meet on a shard, and three real shard processes place a stream of images exactly
as the single Placer does."""

from __future__ import annotations

import random
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from dedup.index import NearIndex
from dedup.placement import Image, Placement, Placer
from dedup.shard_server import Shard
from dedup.shards import ROW, Routing, ShardedPlacer, ShardError, block_widths, parse_address
from test.dedup.test_placement import flipped, image, random_phash
from test.harness.processes import CrawlerProcess
from test.harness.services import free_port

START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30

# --- routing ------------------------------------------------------------------------------


@pytest.mark.parametrize("radius", range(11))
def test_the_blocks_are_radius_plus_one_and_cover_the_64_bits(radius):
    widths = block_widths(radius)
    assert len(widths) == radius + 1 and sum(widths) == 64
    assert max(widths) - min(widths) <= 1
    assert block_widths(4) == (13, 13, 13, 13, 12)
    codes = np.random.default_rng(radius).integers(0, 2**64, 100, dtype=np.uint64)
    blocks = Routing(radius, 3).blocks(codes)
    rebuilt = np.zeros(len(codes), dtype=np.uint64)
    for t, width in enumerate(widths):
        rebuilt = (rebuilt << np.uint64(width)) | blocks[:, t]
    assert (rebuilt == codes).all()


def pairs_at(rng: np.random.Generator, count: int, distance: int) -> tuple[np.ndarray, ...]:
    """``count`` random hashes and, for each, one ``distance`` bits from it."""
    codes = rng.integers(0, 2**64, count, dtype=np.uint64)
    bits = np.argsort(rng.random((count, 64)), axis=1)[:, :distance].astype(np.uint64)
    masks = np.bitwise_or.reduce(np.uint64(1) << bits, axis=1) if distance else 0
    return codes, codes ^ np.asarray(masks, dtype=np.uint64)


@pytest.mark.parametrize(("radius", "shards"), [(4, 3), (4, 64), (2, 5), (6, 1000)])
def test_any_two_hashes_within_the_radius_share_an_owner_shard(radius, shards):
    routing = Routing(radius, shards)
    rng = np.random.default_rng(radius * 1000 + shards)
    for distance in range(radius + 1):
        a, b = pairs_at(rng, 5000, distance)
        assert (np.bitwise_count(a ^ b) == distance).all()
        # They agree on some block, and so on that key's owner...
        same_key = routing.blocks(a) == routing.blocks(b)
        assert same_key.any(axis=1).all()
        # ...so the shards each is kept on and looked up on meet.
        assert (routing.placed_on(a) & routing.placed_on(b)).any(axis=1).all()


def test_two_hashes_past_the_radius_may_share_no_shard():
    routing = Routing(4, 64)
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 2**64, 5000, dtype=np.uint64)
    # 5 bits apart, one in each block: no block in common.
    starts = np.cumsum((0, *block_widths(4)[:-1]))
    mask = sum(1 << (63 - int(s)) for s in starts)
    others = codes ^ np.uint64(mask)
    assert not (routing.blocks(codes) == routing.blocks(others)).any()
    apart = ~(routing.placed_on(codes) & routing.placed_on(others)).any(axis=1)
    assert apart.mean() > 0.5


def test_the_keys_spread_evenly_and_stay_where_they_are():
    routing = Routing(4, 3)
    codes = np.random.default_rng(2).integers(0, 2**64, 100_000, dtype=np.uint64)
    shares = np.bincount(routing.owners(codes).ravel(), minlength=3) / codes.size / 5
    assert np.allclose(shares, 1 / 3, atol=0.01)
    # At 3 shards an image is kept on 3 * (1 - (2/3)^5) = 2.6 of them, on average.
    assert routing.placed_on(codes).sum(axis=1).mean() == pytest.approx(2.605, abs=0.01)
    # The owners are a function of the key alone, the same in every process and release:
    # shards keep what the routing put on them, so a change here would lose it.
    pinned = np.array([0x0123456789ABCDEF, 0xFEDCBA9876543210], dtype=np.uint64)
    assert Routing(4, 16).owners(pinned).tolist() == [[12, 2, 7, 11, 4], [0, 12, 6, 5, 6]]


def test_an_address_is_host_and_port():
    assert parse_address(" 127.0.0.1:7001 ") == ("127.0.0.1", 7001)
    assert parse_address("[::1]:7001") == ("[::1]", 7001)
    for wrong in ("127.0.0.1", ":7001", "host:port"):
        with pytest.raises(ValueError, match="host:port"):
            parse_address(wrong)


# --- a shard, in process ------------------------------------------------------------------


def test_a_shard_keeps_its_first_claim_and_refuses_what_breaks_it():
    shard = Shard()
    assert "error" in shard.answer({"op": "search"}, b"")[0]  # before any hello
    hello = {"op": "hello", "shard": 1, "shards": 3, "radius": 4}
    assert shard.answer(hello, b"")[0] == {
        "rows": 0,
        "next_seq": 0,
        "shard": 1,
        "shards": 3,
        "radius": 4,
    }
    for other in ({"shard": 2}, {"shards": 4}, {"radius": 6}):
        assert "error" in shard.answer({**hello, **other}, b"")[0]
    rows = np.zeros(2, dtype=ROW)
    rows["seq"] = [7, 9]
    rows["source"] = [0, 1]  # of one name given: refused whole
    assert "error" in shard.answer({"op": "add", "sources": ["museum"]}, rows.tobytes())[0]
    assert "error" in shard.answer({"op": "add", "sources": ["a", "b"]}, b"\0" * 7)[0]
    assert len(shard) == 0
    assert shard.answer({"op": "add", "sources": ["a", "b"]}, rows.tobytes())[0] == {"rows": 2}
    assert shard.stats()["next_seq"] == 10


# --- three shard processes against the single Placer ----------------------------------------


@pytest.fixture
def shard_addresses(tmp_path: Path) -> Iterator[list[tuple[str, int]]]:
    """Three ``python -m dedup.shard_server`` on free loopback ports (each binds port 0
    and logs the one it got once it listens)."""
    processes = [
        CrawlerProcess("dedup.shard_server", {}, tmp_path / f"shard-{n}.log") for n in range(3)
    ]
    try:
        listening = [p.wait_for_event("shard_listening", START_TIMEOUT_S) for p in processes]
        assert all(event["host"] == "127.0.0.1" for event in listening)
        yield [(event["host"], event["port"]) for event in listening]
        for process in processes:
            process.signal(signal.SIGTERM)
        assert [p.wait(STOP_TIMEOUT_S) for p in processes] == [0, 0, 0]
    finally:
        for process in processes:
            process.stop()


def stream(rng: random.Random, n: int) -> list[Image]:
    """Images of several shapes, with near copies 0-4 bits off (of earlier images, of the
    image just before, of copies), exact copies, the same hash in another shape,
    degenerate hashes, and images without a hash or a size."""
    shapes = [(1200, 800), (1600, 900), (1000, 1000), (333, 187)]
    images: list[Image] = []
    bodies: dict[str, bytes] = {}
    for i in range(n):
        kind = i % 10
        body = f"body {i}".encode()
        if not images or kind < 4:
            images.append(image(i, random_phash(rng), size=rng.choice(shapes)))
            bodies[images[-1].identifier] = body
            continue
        earlier = images[-1] if kind == 4 else rng.choice(images)
        phash = earlier.phash or random_phash(rng)
        shape = (earlier.width, earlier.height)
        if kind < 7:  # a near copy, resized to half
            bits = rng.sample(range(64), rng.randint(0, 4)) if kind != 5 else spread(rng)
            half = (max(1, shape[0] // 2), max(1, shape[1] // 2))
            new = image(i, flipped(phash, bits), source="mirror", size=half)
        elif kind == 7:  # the very bytes
            body = bodies[earlier.identifier]
            new = image(i, phash, source="commons", size=shape, body=body)
        elif kind == 8:  # the same hash, another photograph's shape
            new = image(i, flipped(phash, [1]), size=(shape[1] + 500, shape[0]))
        else:
            flat = f"{sum(1 << b for b in rng.sample(range(64), rng.randint(0, 8))):016x}"
            new = rng.choice([image(i, flat), image(i, None), image(i, phash, size=(0, 0))])
        bodies[new.identifier] = body
        images.append(new)
    return images


def spread(rng: random.Random) -> list[int]:
    """4 bits, each in another routing block: the two hashes share one block of five, so
    meet on its owner alone."""
    widths = block_widths(4)
    tops = [64 - sum(widths[:t]) - 1 for t in range(5)]
    return [tops[t] - rng.randrange(widths[t]) for t in rng.sample(range(5), 4)]


def batches(rng: random.Random, images: list[Image]) -> Iterator[list[Image]]:
    start = 0
    while start < len(images):
        size = rng.choice([1, 2, 7, 60, 250, 500])
        yield images[start : start + size]
        start += size


def placed_both_ways(
    sharded: ShardedPlacer, single: Placer, images: list[Image], rng: random.Random
) -> tuple[list[Placement], list[Placement]]:
    ours: list[Placement] = []
    theirs: list[Placement] = []
    for batch in batches(rng, images):
        ours += sharded.place(batch)
        theirs += single.place(batch)
    return ours, theirs


def test_three_shard_processes_place_as_one_index(shard_addresses):
    rng = random.Random(54)
    images = stream(rng, 4000)
    single = Placer(NearIndex(radius=4))
    with ShardedPlacer(shard_addresses, radius=4, timeout_s=30) as sharded:
        ours, theirs = placed_both_ways(sharded, single, images, rng)
        assert ours == theirs
        # Placed again (a replay after a crash), in another order and other batches.
        again, again_single = placed_both_ways(sharded, single, images[::-1], rng)
        assert again == again_single
        assert {p.identifier: p for p in again} == {p.identifier: p for p in ours}
        stats = sharded.stats()
    # The stream has every case in it.
    kinds = Counter(p.kind for p in ours)
    assert kinds["exact"] > 100 and kinds["near"] > 400 and kinds["unique"] > 1000
    assert {p.distance for p in ours if p.kind == "near"} == {0, 1, 2, 3, 4}
    # Whole numbers, as the contract has them, also for a copy found within its batch.
    assert {type(p.distance) for p in ours + theirs} == {int, type(None)}
    # Each canonical is on 1-3 of the shards, 2.6 on average; the sequence is one.
    canonicals = len(single.index)
    assert all(s["next_seq"] <= canonicals for s in stats)
    assert max(s["next_seq"] for s in stats) == canonicals
    assert 2.4 < sum(s["rows"] for s in stats) / canonicals < 2.8


def test_a_router_started_again_numbers_on_and_shards_in_another_order_are_refused(
    shard_addresses,
):
    rng = random.Random(55)
    images = stream(rng, 1500)
    single = Placer(NearIndex(radius=4))
    with ShardedPlacer(shard_addresses) as sharded:
        first, first_single = placed_both_ways(sharded, single, images[:800], rng)
    assert first == first_single
    with pytest.raises(ShardError, match="this shard is"):
        ShardedPlacer(shard_addresses[::-1])
    with ShardedPlacer(shard_addresses) as sharded:
        assert sharded.next_key == len(single.index)
        rest, rest_single = placed_both_ways(sharded, single, images[800:], rng)
    assert rest == rest_single
    assert any(
        p.kind != "unique" and p.duplicate_of in {i.identifier for i in images[:800]} for p in rest
    )


def test_a_shard_away_or_gone_is_an_error_and_closes_the_placer(tmp_path):
    with pytest.raises(ShardError):  # nothing listens there: refused at once
        ShardedPlacer([("127.0.0.1", free_port())])
    process = CrawlerProcess("dedup.shard_server", {}, tmp_path / "shard.log")
    try:
        port = process.wait_for_event("shard_listening", START_TIMEOUT_S)["port"]
        sharded = ShardedPlacer([("127.0.0.1", port)])
        sharded.place([image(0, random_phash(random.Random(3)))])
        process.process.kill()
        process.wait(STOP_TIMEOUT_S)
        with pytest.raises(ShardError):
            sharded.place([image(1, random_phash(random.Random(4)))])
        with pytest.raises(ShardError, match="closed"):
            sharded.place([])
    finally:
        process.stop()
