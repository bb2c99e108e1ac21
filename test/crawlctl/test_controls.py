"""Operator actions against a real redis-server: the keys they change, and what they say;
on one host, what the workers' pacing script then does."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.asyncio import Redis

from crawlctl import cli
from crawlctl.commands import controls
from crawlctl.console import EXIT_OK, EXIT_USAGE
from image_crawler import contract as c
from test.crawlctl.test_status_hosts import ask


async def seed_a_tripped_source(redis: Redis, source: str) -> None:
    now = time.time()
    await redis.sadd(c.HALTED_SET, source)
    await redis.sadd(c.TEMP_HALTED_SET, source)
    await redis.rpush(c.last50_key(source), *["500"] * 50)
    await redis.zadd(
        f"{c.STATUS_60S_PREFIX}{source}",
        {c.window_member("500", now - i): now - i for i in range(5)},
    )
    await redis.zadd(f"{c.STATUS_1HR_PREFIX}{source}", {c.window_member("500", now): now})
    await redis.set(c.pace_rate_key(source), "0", px=1500)  # the monitor paces it at 0


async def test_halt_adds_to_halted_and_sets_the_pace_rate_to_0(redis: Redis) -> None:
    await redis.set(c.pace_rate_key("flickr"), "178.4", px=1500)
    await redis.set(c.tokens_key("flickr"), 180)
    done = await controls.halt(redis, "flickr")
    assert await redis.smembers(c.HALTED_SET) == {"flickr"}
    assert await redis.get(c.pace_rate_key("flickr")) == "0"
    # Until the monitor writes "0" with its own expiry; without a monitor "0" stays.
    assert await redis.ttl(c.pace_rate_key("flickr")) == -1
    assert await redis.get(c.tokens_key("flickr")) == "0"  # for workers older than pacing
    assert [str(d) for d in done] == [
        "SADD halted flickr  (the monitor paces it at 0 until it is resumed)",
        "SET pace_rate:flickr 0  (workers stop within their pacing horizon, ~0.05 s)",
        "SET currtokens:flickr 0  (the same for workers older than pacing)",
    ]
    again = await controls.halt(redis, "flickr")
    assert str(again[0]) == "SADD halted flickr  (it was already halted)"


async def test_resume_is_the_readme_procedure_done_right(redis: Redis) -> None:
    await seed_a_tripped_source(redis, "example")
    await seed_a_tripped_source(redis, "other")
    done = await controls.resume(redis, "example", rate=5.0)
    assert [d.command for d in done] == [
        "SET override_rate:example 5",
        "DEL statuslast50req:example",
        "DEL status60s:example",
        "SREM halted example",
        "SREM temp_halted example",
    ]
    assert all(not d.note for d in done[1:])
    assert await redis.get("override_rate:example") == "5"
    assert await redis.exists(c.last50_key("example"), f"{c.STATUS_60S_PREFIX}example") == 0
    assert not await redis.sismember(c.HALTED_SET, "example")
    assert not await redis.sismember(c.TEMP_HALTED_SET, "example")
    # Only what the procedure names: the longer windows stay for the record.
    assert await redis.zcard(f"{c.STATUS_1HR_PREFIX}example") == 1
    # Other sources are untouched.
    assert await redis.sismember(c.HALTED_SET, "other")
    assert await redis.llen(c.last50_key("other")) == 50


async def test_resume_without_rate_leaves_the_override_and_says_what_was_not_there(
    redis: Redis,
) -> None:
    await redis.set("override_rate:quiet", "3")
    done = await controls.resume(redis, "quiet")
    assert await redis.get("override_rate:quiet") == "3"
    assert [d.note for d in done] == [
        "it was empty",
        "it was empty",
        "it was not halted",
        "it was not temporarily halted",
    ]


async def test_override_and_clear(redis: Redis) -> None:
    done = await controls.override(redis, "met", 12.5)
    assert await redis.get("override_rate:met") == "12.5"
    assert [d.command for d in done] == ["SET override_rate:met 12.5"]
    await redis.set("override-rate:met", "9")  # the original system's spelling
    done = await controls.clear_override(redis, "met")
    assert await redis.exists("override_rate:met", "override-rate:met") == 0
    assert [str(d) for d in done] == ["DEL override_rate:met", "DEL override-rate:met"]
    done = await controls.clear_override(redis, "met")
    assert all(d.note == "there was none" for d in done)


@pytest.mark.parametrize(
    ("raw", "name"), [("flickr", "flickr"), (" Flickr ", "flickr"), ("a.b_c-d", "a.b_c-d")]
)
def test_source_names_are_lower_cased(raw: str, name: str) -> None:
    assert controls.source_name(raw) == name


@pytest.mark.parametrize("raw", ["", "a b", "a/b", "x" * 300])
def test_impossible_source_names_are_refused(raw: str) -> None:
    with pytest.raises(controls.InvalidArgument, match="not a source name"):
        controls.source_name(raw)


@pytest.mark.parametrize(("raw", "rate"), [("5", 5.0), ("0.2", 0.2), ("1e3", 1000.0)])
def test_rates(raw: str, rate: float) -> None:
    assert controls.parse_rate(raw) == rate


@pytest.mark.parametrize("raw", ["0", "-1", "nan", "inf", "fast", ""])
def test_bad_rates(raw: str) -> None:
    with pytest.raises(controls.InvalidArgument, match="RATE must be a number"):
        controls.parse_rate(raw)


# --- robots-exempt ----------------------------------------------------------------------


async def test_robots_exempt_adds_and_says_what_changed(redis: Redis) -> None:
    await redis.sadd(c.ROBOTS_EXEMPT_SET, "met")
    done = await controls.robots_exempt(redis, ["flickr", "met"])
    assert await redis.smembers(c.ROBOTS_EXEMPT_SET) == {"flickr", "met"}
    assert [str(d) for d in done] == [
        "SADD robots_exempt flickr  (robots.txt is no longer obeyed for flickr)",
        "SADD robots_exempt met  (it was already exempt: robots.txt was not obeyed for met)",
    ]


async def test_robots_obey_removes_and_says_what_changed(redis: Redis) -> None:
    await redis.sadd(c.ROBOTS_EXEMPT_SET, "flickr", "met")
    done = await controls.robots_obey(redis, ["flickr", "nasa"])
    assert await redis.smembers(c.ROBOTS_EXEMPT_SET) == {"met"}
    assert [str(d) for d in done] == [
        "SREM robots_exempt flickr  (robots.txt is obeyed again for flickr)",
        "SREM robots_exempt nasa  (it was not exempt: robots.txt was already obeyed for nasa)",
    ]


async def test_robots_exempted_lists_sorted(redis: Redis) -> None:
    assert await controls.robots_exempted(redis) == []
    await redis.sadd(c.ROBOTS_EXEMPT_SET, "nasa", "flickr", "met")
    assert await controls.robots_exempted(redis) == ["flickr", "met", "nasa"]


async def test_unknown_names_the_sources_nothing_knows(redis: Redis) -> None:
    await redis.hset(c.RATES_HASH, "rated", "2.0")
    await redis.sadd(c.INBOUND_SOURCES_SET, "seen")
    await redis.sadd(c.HALTED_SET, "halted")
    # Being exempt does not make a name known: exempting a typo is what the note is for.
    await redis.sadd(c.ROBOTS_EXEMPT_SET, "typo")
    names = ["rated", "typo", "seen", "halted", "other"]
    assert await controls.unknown(redis, names) == ["typo", "other"]
    assert await controls.unknown(redis, []) == []


# --- one host ---------------------------------------------------------------------------

HOST_KEY = c.pace_host_key("web", "images.example.org")


@pytest.mark.parametrize(
    ("raw", "host"),
    [
        ("images.example.org", "images.example.org"),
        (" Images.Example.ORG. ", "images.example.org"),
        ("https://Images.Example.ORG:8443/a.jpg?x=1", "images.example.org"),
        ("images.example.org:8080", "images.example.org"),
        ("[::1]", "::1"),
        ("http://[::1]:8080/a.jpg", "::1"),
        ("::1", "::1"),
        ("127.0.0.2", "127.0.0.2"),
    ],
)
def test_host_names_are_spelled_as_the_workers_pacing_keys(raw: str, host: str) -> None:
    assert controls.host_name(raw) == host


@pytest.mark.parametrize("raw", ["", " ", "a b", "images.example.org/a.jpg", "http:///x", "."])
def test_impossible_hosts_are_refused(raw: str) -> None:
    with pytest.raises(controls.InvalidArgument, match="not a host"):
        controls.host_name(raw)


async def test_halt_host_sets_halt_and_keeps_the_hash_for_good(redis: Redis) -> None:
    await redis.hset(HOST_KEY, mapping={"rate": "12", "exp": "1763764600.000000"})
    await redis.pexpire(HOST_KEY, 60_000)
    done = await controls.halt_host(redis, "web", "images.example.org", "asked by its webmaster")
    assert await redis.hgetall(HOST_KEY) == {
        "rate": "12",
        "halt": "asked by its webmaster",
        "exp": "",
    }
    assert await redis.pttl(HOST_KEY) == -1
    assert [str(d) for d in done] == [
        f'HSET {HOST_KEY} halt "asked by its webmaster" exp ""  '
        "(no request to the host until it is resumed)",
        f"PERSIST {HOST_KEY}  (kept for good while an operator's field is in it)",
    ]
    again = await controls.halt_host(redis, "web", "images.example.org", "still")
    assert again[0].note == "it was already halted: asked by its webmaster"
    assert await redis.hget(HOST_KEY, "halt") == "still"
    assert controls.default_reason().startswith("halted with image-crawler halt at 20")


async def test_resume_host_removes_the_halt_and_the_breaker_and_lets_it_expire(
    redis: Redis,
) -> None:
    breaker = {"fails": "4", "since": "1", "until": "2", "halts": "3", "gone": "4"}
    await redis.hset(HOST_KEY, mapping={"rate": "12", "halt": "x", "exp": "", **breaker})
    done = await controls.resume_host(redis, "web", "images.example.org")
    assert await redis.hgetall(HOST_KEY) == {"rate": "12", "exp": ""}
    assert c.HOST_IDLE_S * 1000 - 5000 < await redis.pttl(HOST_KEY) <= c.HOST_IDLE_S * 1000
    assert [d.command for d in done] == [
        f"HDEL {HOST_KEY} halt fails since until halts gone",
        f'HSET {HOST_KEY} exp ""',
        f"PEXPIRE {HOST_KEY} {int(c.HOST_IDLE_S * 1000)}",
    ]
    assert done[0].note == "it was halted by an operator: x"
    # Nothing to resume: said so, and the hash is left as it is.
    again = await controls.resume_host(redis, "web", "images.example.org")
    assert again[0].note == "it was not halted"


async def test_resume_host_keeps_a_crawl_delay_and_an_override(redis: Redis) -> None:
    seconds, _ = await redis.time()
    await redis.hset(HOST_KEY, mapping={"delay": "5", "delay_until": f"{seconds + 7200}"})
    await redis.hset(HOST_KEY, mapping={"until": f"{seconds + 30}", "fails": "4"})
    done = await controls.resume_host(redis, "web", "images.example.org")
    assert done[0].note == "its breaker's failures and halts are cleared"
    assert 7_100_000 < await redis.pttl(HOST_KEY) <= 7_200_000  # while its delay is in force
    # With a rate: its override is set first, and the hash is kept for good.
    await redis.hset(HOST_KEY, "halt", "x")
    done = await controls.resume_host(redis, "web", "images.example.org", rate=2.5)
    assert await redis.hget(HOST_KEY, "override") == "2.5"
    assert await redis.hget(HOST_KEY, "halt") is None
    assert await redis.pttl(HOST_KEY) == -1
    assert [d.command.split()[0] for d in done] == ["HSET", "PERSIST", "HDEL"]


async def test_override_host_and_clear(redis: Redis) -> None:
    await redis.hset(HOST_KEY, mapping={"rate": "12"})
    await redis.pexpire(HOST_KEY, 60_000)
    done = await controls.override_host(redis, "web", "images.example.org", 0.5)
    assert await redis.hgetall(HOST_KEY) == {"rate": "12", "override": "0.5", "exp": ""}
    assert await redis.pttl(HOST_KEY) == -1
    assert done[0].command == f'HSET {HOST_KEY} override 0.5 exp ""'
    done = await controls.clear_host_override(redis, "web", "images.example.org")
    assert await redis.hget(HOST_KEY, "override") is None
    assert done[0].note == "it was 0.5 requests/s"
    assert 0 < await redis.pttl(HOST_KEY) <= c.HOST_IDLE_S * 1000
    # A host an operator also halted stays kept for good.
    await redis.hset(HOST_KEY, mapping={"override": "1", "halt": "x"})
    await redis.persist(HOST_KEY)
    await controls.clear_host_override(redis, "web", "images.example.org")
    assert await redis.pttl(HOST_KEY) == -1
    # No hash: nothing created.
    done = await controls.clear_host_override(redis, "web", "other.example.org")
    assert done[0].note == "there was none"
    assert not await redis.exists(c.pace_host_key("web", "other.example.org"))


async def test_the_host_commands_act_on_one_host_and_the_pacing_script_obeys(
    redis: Redis, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    await redis.sadd(c.INBOUND_SOURCES_SET, "web")
    await redis.set(c.pace_rate_key("web"), "10")
    both = ["images.example.org", "other.example.org"]
    await ask(redis, "web", both)

    async def command(*argv: str) -> list[str]:
        code = await asyncio.to_thread(cli.run, [*argv, "--redis", redis_url])
        assert code == EXIT_OK
        captured = capsys.readouterr()
        assert captured.err == ""
        return captured.out.splitlines()

    url = "HTTPS://Images.Example.ORG/a.jpg"
    out = await command("halt", "web", "--host", url, "--reason", "asked by its webmaster")
    assert out[0] == (
        f'HSET {HOST_KEY} halt "asked by its webmaster" exp ""  '
        "(no request to the host until it is resumed)"
    )
    (answer,) = await ask(redis, "web", both)
    assert [a[3] for a in answer] == ["m", ""]  # halted by an operator; the other served
    index = c.host_index_key("web")
    state = c.HostIndexEntry.of(await redis.zscore(index, "images.example.org") or 0).state
    assert state == c.HOST_HALTED

    await command("override", "web", "0.5", "--host", "images.example.org")
    out = await command("resume", "web", "--host", "images.example.org")
    assert out[0].startswith(f"HDEL {HOST_KEY} halt fails since until halts gone")
    (answer,) = await ask(redis, "web", both)
    assert answer[0][3] == "" and answer[0][2] == 2.0  # served, one request per 2 s
    assert await redis.hget(HOST_KEY, "why") == c.WHY_CAP
    out = await command("override", "web", "--clear", "--host", "images.example.org")
    assert out[0] == f"HDEL {HOST_KEY} override  (it was 0.5 requests/s)"


async def test_a_host_no_worker_asked_about_is_named_and_bad_arguments_refused(
    redis: Redis, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    await redis.sadd(c.INBOUND_SOURCES_SET, "web")
    argv = ["halt", "web", "--host", "typo.example.org", "--redis", redis_url]
    assert await asyncio.to_thread(cli.run, argv) == EXIT_OK
    err = " ".join(capsys.readouterr().err.split())
    assert "'typo.example.org' is not a host of 'web' that a worker has asked about" in err
    assert await redis.hget(c.pace_host_key("web", "typo.example.org"), "halt")  # halted
    for argv, message in [
        (["halt", "web", "--reason", "x"], "--reason goes with --host"),
        (["halt", "web", "--host", "a b"], "not a host: 'a b'"),
        (["override", "web", "--host", "a.example"], "give a RATE (requests/s), or --clear"),
    ]:
        try:
            code = await asyncio.to_thread(cli.run, [*argv, "--redis", redis_url])
        except SystemExit as e:
            code = int(e.code or 0)
        assert code == EXIT_USAGE
        assert message in capsys.readouterr().err
