"""The fault campaign's checker (chaos.checks) and feed (chaos.plan), on made-up records:
each invariant it checks is seen to fail when broken, so a campaign's PASS means
something."""

from __future__ import annotations

from chaos import checks, plan
from deploy.compose_check.outcomes import HoleCheck
from image_crawler import contract as c

A1, A2 = plan.SOURCES[0].hosts[0].address, plan.SOURCES[0].hosts[1].address
RATE = plan.SOURCES[0].rate_rps  # chaos-a: 10/s, for each host and for both together


def url(uuid: str, kind: str = plan.OK) -> plan.Url:
    return plan.Url(uuid, f"http://{A1}:1/{kind}/{uuid}.jpg", "chaos-a", kind)


def test_a_uuid_with_no_end_is_lost_and_one_in_the_wrong_topic_is_named():
    produced = {u.uuid: u for u in [url("a"), url("b", plan.MISSING), url("c"), url("d")]}
    ends = {
        "a": [(c.METADATA_TOPIC, 0.0, 0), (c.METADATA_TOPIC, 1.0, 0)],
        "b": [(c.CRAWL_ERRORS_TOPIC, 0.0, 0)],
        "d": [(c.METADATA_TOPIC, 0.0, 0)],
    }
    ends_found = checks.check_ends(produced, ends)
    assert ends_found.lost == ["c"]
    assert ends_found.wrong == [("b", c.LINK_ROT_TOPIC, c.CRAWL_ERRORS_TOPIC)]
    assert (ends_found.duplicates, ends_found.deliveries) == (1, 4)


def paced(start: float, count: int, interval: float, host: str = A1) -> list[checks.Request]:
    return [(start + i * interval, host, f"/ok/{i}.jpg", 200, 0) for i in range(count)]


def test_requests_at_the_rate_are_within_every_bound_and_a_burst_is_not():
    at_rate = paced(100.0, 50, 1 / RATE)
    assert all(w.seen <= w.bound for w in checks.pacing_windows(at_rate))
    # Even pacing leaves the bound's "+ 1" unused: two more at once break it.
    extra = [(100.0 + 2 / RATE + d, A1, "/ok/x.jpg", 200, 0) for d in (0.001, 0.002)]
    squeezed = sorted([*at_rate, *extra])
    over = [w for w in checks.pacing_windows(squeezed) if w.seen > w.bound]
    assert {w.who for w in over} == {f"host {A1}", "source chaos-a"}
    assert all(w.gaps_ms for w in over)


def test_two_hosts_each_at_the_source_rate_break_the_source_bound_only():
    both = sorted(paced(100.0, 50, 1 / RATE) + paced(100.05, 50, 1 / RATE, host=A2))
    over = {w.who for w in checks.pacing_windows(both) if w.seen > w.bound}
    assert over == {"source chaos-a"}


def test_a_crawl_delay_host_is_held_to_its_delay_not_its_source_rate():
    delayed = plan.SOURCES[2].hosts[0]
    assert delayed.behaviour == plan.CRAWL_DELAY
    requests = paced(100.0, 5, 1.0, host=delayed.address)  # 1/s: twice its 1 per 2 s
    over = {w.who for w in checks.pacing_windows(requests) if w.seen > w.bound}
    assert f"host {delayed.address}" in over


def test_a_request_inside_a_retry_after_is_reported_one_already_under_way_is_not():
    refused = (100.0, A1, "/ok/1.jpg", 429, 3)
    under_way = (100.0 + checks.REACTION_S / 2, A1, "/ok/2.jpg", 200, 0)
    inside = (102.0, A1, "/ok/3.jpg", 200, 0)
    after = (103.1, A1, "/ok/4.jpg", 200, 0)
    other_host = (101.0, A2, "/ok/5.jpg", 200, 0)
    assert checks.retry_after_broken([refused, under_way, after, other_host]) == []
    [broken] = checks.retry_after_broken([refused, under_way, inside, after])
    assert "2.000 s later" in broken


def test_requests_to_a_halted_source_are_found_between_its_halt_and_resume():
    halted_host = plan.SOURCES[3].hosts[0].address
    requests = [(t, halted_host, "/ok/x.jpg", 200, 0) for t in (99.0, 100.2, 150.0, 201.0)]
    found = checks.requests_while_halted(requests, plan.HALTED_SOURCE, [(100.0, 200.0)])
    assert len(found) == 1 and "+50.000 s" in found[0]


def test_a_seed_replays_the_same_feed():
    first, again, other = plan.Feed(7, 1), plan.Feed(7, 1), plan.Feed(8, 1)
    seconds = [first.second() for _ in range(30)]
    assert seconds == [again.second() for _ in range(30)]
    assert seconds != [other.second() for _ in range(30)]
    urls = [u for s in seconds for u in s]
    assert {u.kind for u in urls} == set(plan.EXPECTED_TOPIC)
    assert len({u.uuid for u in urls}) == len(urls)


def test_each_source_is_given_the_size_that_makes_its_rate():
    for source in plan.SOURCES:
        assert source.wanted_rps <= source.rate_rps < source.wanted_rps + 1e-6


def test_two_requests_closer_than_the_window_by_less_than_the_pacer_s_lateness_pass():
    # At 5/s, a window of 0.1 s allows one request: two 95 ms apart break it as measured
    # ("strict"), and are within the pacer's admitted lateness of 10 ms.
    delayed_source = plan.SOURCES[2]
    host = delayed_source.hosts[1].address
    requests = [(100.0, host, "/ok/1.jpg", 200, 0), (100.095, host, "/ok/2.jpg", 200, 0)]
    [window] = [
        w for w in checks.pacing_windows(requests) if w.who == f"host {host}" and w.width_s == 0.1
    ]
    assert (window.seen, window.strict, window.bound) == (1, 2, 1)
    closer = [(100.0, host, "/ok/1.jpg", 200, 0), (100.085, host, "/ok/2.jpg", 200, 0)]
    assert any(w.seen > w.bound for w in checks.pacing_windows(closer))


class Seeking:
    def __init__(self) -> None:
        self.seeks: list[tuple[str, int]] = []

    def seek(self, partition: str, offset: int) -> None:
        self.seeks.append((partition, offset))


class Record:
    def __init__(self, offset: int) -> None:
        self.offset = offset


def test_a_reader_reads_again_once_what_a_fetch_skipped():
    # The outputs' reader (chaos' ledger and the compose check's): the stand-in broker
    # once answered a fetch past a record, which then looked lost.
    consumer = Seeking()
    reader = HoleCheck(consumer)
    offsets = [r.offset for r in reader.contiguous("p", [Record(0), Record(1), Record(3)])]
    assert offsets == [0, 1] and consumer.seeks == [("p", 2)] and reader.holes == 1
    assert [r.offset for r in reader.contiguous("p", [Record(2), Record(3)])] == [2, 3]
    # A hole read again is taken as it is the second time (records really gone).
    assert [r.offset for r in reader.contiguous("p", [Record(6)])] == []
    assert [r.offset for r in reader.contiguous("p", [Record(6)])] == [6]
    assert consumer.seeks == [("p", 2), ("p", 4)]


def test_images_fetched_again_are_counted_by_how_often():
    requests = [
        (0.0, "127.0.3.1", "/robots.txt", 200, 0),
        (0.1, "127.0.3.1", "/ok/a.jpg", 200, 0),
        (0.2, "127.0.3.1", "/ok/b.jpg", 429, 3),
        (3.5, "127.0.3.1", "/ok/b.jpg", 200, 0),
        (4.0, "127.0.3.2", "/missing/c.jpg", 404, 0),
    ]
    assert checks.fetches_per_image(requests) == {1: 2, 2: 1}
    assert checks.requests_per_image(checks.fetches_per_image(requests)) == 1.3333
    assert checks.requests_per_image(checks.fetches_per_image(requests[:1])) is None
    # b.jpg asked again after its 429 is no work done again; a.jpg after its 200 is.
    assert checks.fetched_again_after_success(requests) == 0
    assert (
        checks.fetched_again_after_success([*requests, (9.0, "127.0.3.1", "/ok/a.jpg", 200, 0)])
        == 1
    )


def test_what_a_uuid_queued_twice_by_the_feeder_costs_is_not_counted_as_the_crawler_s():
    requests = [
        (0.1, "127.0.3.1", "/ok/a.jpg", 200, 0),
        (0.2, "127.0.3.1", "/ok/b.jpg", 200, 0),
        (1.1, "127.0.3.1", "/ok/a.jpg", 200, 0),  # a's second copy in inbound_images
        (1.2, "127.0.3.1", "/ok/b.jpg", 200, 0),  # b done again: the crawler's
    ]
    copies = {"a": 2, "b": 1}
    ends = {
        "a": [(c.METADATA_TOPIC, 0.2, 0), (c.METADATA_TOPIC, 1.2, 0)],
        "b": [(c.METADATA_TOPIC, 0.3, 0), (c.METADATA_TOPIC, 1.3, 0)],
    }
    assert checks.uuid_of("/ok/a.jpg") == "a"
    assert checks.check_ends({u: url(u) for u in copies}, ends).duplicates == 2
    assert checks.duplicates_beyond_copies(ends, copies) == 1
    assert checks.requests_per_image(checks.fetches_per_image(requests)) == 2.0
    assert checks.requests_per_copy(requests, copies) == 1.3333
    assert checks.requests_per_copy([], copies) is None
    assert checks.fetched_again_after_success(requests) == 2
    assert checks.fetched_again_after_success(requests, copies) == 1
