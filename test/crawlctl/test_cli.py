"""``image-crawler`` as operators run it: the installed console script, in a subprocess,
against real services (a fresh broker per test, the session's redis-server, a local HTTP
origin, and the crawler's own processes)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid as uuidlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import psutil
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from PIL import Image
from redis.asyncio import Redis

from crawlctl import cli
from crawlctl.commands.demo import DEMO_SOURCES
from crawlctl.commands.demo_plan import BROKEN_SAMPLE, load_samples
from image_crawler import contract as c
from image_crawler.lifecycle import cancel_and_wait
from test.harness.corpus import good_images
from test.harness.processes import CrawlerProcess
from test.harness.services import (
    LOOPBACK,
    KafkaBroker,
    RedisServer,
    create_topics,
    free_port,
    produce,
    read_records,
    wait_for,
    wait_until,
)

SCRIPT = Path(sys.executable).with_name("image-crawler")


def command() -> list[str]:
    return [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "crawlctl"]


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    # No connection settings from the developer's shell: each test names its services.
    for name in ("KAFKA_HOSTS", "REDIS_URL", "REDIS_HOST", "REDIS_PORT", "SOURCES_FILE"):
        env.pop(name, None)
    env["COLUMNS"] = "200"  # rich's tables: wide enough for every column, as in a terminal
    # `up`'s dashboard on a port of its own: the default, 9100, is one a machine, and the
    # suite's tests run side by side.
    env["METRICS_PORT"] = str(free_port())
    env.update(extra)
    return env


def run(*args: str, timeout_s: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*command(), *args],
        env=cli_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


async def arun(*args: str, timeout_s: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(run, *args, timeout_s=timeout_s, **env)


END = b"<end of test input>"


async def everything_in(bootstrap: str, topic: str) -> list[ConsumerRecord]:
    """Every record of ``topic``: the test appends a marker to each partition and reads up
    to all of them. (Not by end offsets: tansu's in-memory storage reports them wrong.)"""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        partitions = await producer.partitions_for(topic)
        await asyncio.gather(*[await producer.send(topic, END, partition=p) for p in partitions])
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest"
    )
    await consumer.start()
    records: list[ConsumerRecord] = []
    try:
        consumer.assign([TopicPartition(topic, p) for p in partitions])
        ended: set[int] = set()
        deadline = time.monotonic() + 30
        while len(ended) < len(partitions):
            assert time.monotonic() < deadline, f"read {len(records)} records, no end marker"
            for tp, batch in (await consumer.getmany(timeout_ms=200)).items():
                for record in batch:
                    if record.value == END:
                        ended.add(tp.partition)
                    elif tp.partition not in ended:
                        records.append(record)
    finally:
        await consumer.stop()
    return records


async def inbound(kafka: KafkaBroker) -> list[c.InboundImage]:
    """Every message in inbound_images."""
    return [
        c.InboundImage.from_json(r.value)
        for r in await everything_in(kafka.bootstrap, c.INBOUND_TOPIC)
    ]


# --- help and usage -----------------------------------------------------------------------

SUBCOMMANDS = (
    "up", "demo", "download", "produce", "recheck", "status", "halt", "resume", "override",
    "robots-exempt",
)  # fmt: skip


def test_the_console_script_is_installed_and_lists_every_subcommand() -> None:
    assert SCRIPT.exists(), "pip install -e . installs the image-crawler script"
    result = run("--help")
    assert result.returncode == 0, result.stderr
    for name in SUBCOMMANDS:
        assert re.search(rf"^\s+{name}\s", result.stdout, re.MULTILINE), name
    assert result.stderr == ""


def test_a_subcommand_imports_its_own_module_alone() -> None:
    """``image-crawler status`` is meant to answer within a second: it does not import the
    broker's, S3's or the local stack's code (nor structlog), which the other subcommands
    bring. In a new interpreter, so that nothing imported by the tests counts."""
    assert cli.modules_for(["status", "--once"]) == ["status"]
    assert cli.modules_for(["halt", "flickr"]) == ["controls"]
    assert cli.modules_for(["--help"]) == cli.modules_for(["fly"]) == cli.modules_for(None)
    assert set(cli.modules_for(None)) == set(cli.COMMANDS.values())
    script = (
        "import sys\n"
        "from crawlctl import cli\n"
        "cli.build_parser(['status', '--once'])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('aiokafka', 'aiohttp', 'aiobotocore', 'structlog', 'pyarrow') "
        "or m.startswith(('crawlctl.commands.', 'crawlctl.localstack'))))\n"
    )
    found = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    assert found.strip() == "['crawlctl.commands.controls', 'crawlctl.commands.status']"


@pytest.mark.parametrize("subcommand", SUBCOMMANDS)
def test_every_subcommand_has_help(subcommand: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.run([subcommand, "--help"])
    assert caught.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: image-crawler {subcommand}")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "required: COMMAND"),
        (["fly"], "invalid choice: 'fly'"),
        (["override", "flickr"], "give a RATE"),
        (["override", "flickr", "5", "--clear"], "either RATE or --clear"),
        (["override", "flickr", "0"], "RATE must be a number > 0"),
        (["override", "flickr", "fast"], "RATE must be a number"),
        (["resume", "flickr", "--rate", "-1"], "RATE must be a number > 0"),
        (["halt", "two words"], "not a source name"),
        (["robots-exempt", "ok", "a/b"], "not a source name"),
        (["robots-exempt", "--remove"], "--remove needs the SOURCEs"),
        (["robots-exempt", "--list", "flickr"], "--list takes no SOURCE"),
        (["robots-exempt", "--list", "--remove"], "--list takes no SOURCE"),
        (["status", "--interval", "0"], "--interval must be > 0"),
        (["status", "--redis", "http://example.com"], "REDIS_URL must start with redis://"),
        (["up", "--workers", "0"], "--workers must be at least 1"),
        (["up", "--sources-file", "/nonexistent/sources.json"], "not a readable file"),
        (["download", "/nonexistent/urls.txt", "--output-folder", "o"], "no such file"),
        (["download", __file__, "--output-folder", "o", "--workers", "0"], "--workers must be"),
        (
            ["download", __file__, "--output-folder", "o", "--save-additional-columns", "key"],
            "may not keep key",
        ),
        (
            ["download", __file__, "--output-folder", "o", "--encode-quality", "101"],
            "encode_quality of jpg must be an integer 1-100",
        ),
        (["download", __file__, "--output-folder", "o", "--max-host-rate", "0"], "above 0"),
        (["produce", "/nonexistent/urls.jsonl"], "no such file"),
        (["produce", __file__, "--format", "csv", "--caption-col", "URL"], "other columns"),
        (["produce", __file__], "use --format jsonl|csv|tsv"),
        (["produce", __file__, "--format", "xml"], "invalid choice: 'xml'"),
        (["recheck", "/nonexistent/earlier.jsonl"], "no such file: /nonexistent/earlier.jsonl"),
        (["recheck", __file__], "use --format jsonl|csv|tsv"),
        (
            ["recheck", __file__, "--format", "jsonl", "--urls", "/nonexistent/urls.jsonl"],
            "no such file: /nonexistent/urls.jsonl",
        ),
        (
            ["recheck", __file__, "--format", "jsonl", "--urls", __file__],
            "cannot tell the format of 'test_cli.py'",
        ),
        (
            ["recheck", __file__, "--format", "jsonl", "--older-than", "last week"],
            "--older-than is not an ISO 8601 date or date and time: 'last week'",
        ),
        (
            ["recheck", __file__, "--format", "jsonl", "--checks", __file__],
            "--checks says when rows were checked: it goes with --older-than",
        ),
        (
            ["recheck", __file__, "--format", "jsonl", "--source", "a b"],
            "--source is not a valid source name: 'a b'",
        ),
    ],
)
def test_usage_errors_go_to_stderr_with_status_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = cli.run(argv)
    except SystemExit as e:  # argparse's own errors
        code = int(e.code or 0)
    captured = capsys.readouterr()
    assert code == cli.EXIT_USAGE
    assert message in captured.err
    assert captured.out == ""


# --- produce ------------------------------------------------------------------------------


async def test_produce_sends_good_jsonl_rows_and_reports_bad_ones_by_line(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    feed = tmp_path / "urls.jsonl"
    feed.write_text(
        "\n".join(
            [
                '{"url": "https://a.example/1.jpg", "uuid": "u1", "source": "flickr"}',
                '{"url": "https://a.example/2.jpg", "source": "flickr"}',
                '{"uuid": "u3", "source": "flickr"}',
                "not json at all",
                '{"url": "https://a.example/5.jpg", "uuid": "u5", "source": "no such/source"}',
                "",
                '{"url": "https://a.example/7.jpg", "uuid": "u7"}',
                '{"url": "https://a.example/8.jpg", "uuid": "u8", "source": "s", "tags": []}',
            ]
        )
        + "\n"
    )
    result = await arun("produce", str(feed), "--kafka", kafka.bootstrap, "--source", "met")
    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines() == [
        "line 3: missing url",
        "line 4: not JSON: Expecting value (column 1)",
        "line 5: invalid source name 'no such/source' (at most 244 of the letters a-z, A-Z, "
        "digits, '.', '_' and '-')",
        # A field the crawler does not use is no reason to lose the row: named once.
        "line 8: ignored field(s) 'tags' (used: url, uuid (or identifier), source)",
    ]
    assert result.stdout.splitlines() == ["sent 4, bad 3 (1 without uuid got a new uuid4)"]

    sent = await inbound(kafka)
    assert len(sent) == 4  # the good rows, and nothing else
    messages = {m.url: m for m in sent}
    assert messages["https://a.example/1.jpg"] == c.InboundImage(
        "https://a.example/1.jpg", "u1", "flickr"
    )
    generated = messages["https://a.example/2.jpg"]
    assert generated.source == "flickr"
    assert uuidlib.UUID(generated.uuid).version == 4
    assert messages["https://a.example/7.jpg"].source == "met"  # from --source
    assert messages["https://a.example/8.jpg"] == c.InboundImage(
        "https://a.example/8.jpg", "u8", "s"
    )


@pytest.mark.parametrize(("suffix", "sep"), [(".csv", ","), (".tsv", "\t")])
async def test_produce_reads_csv_and_tsv_with_a_header(
    kafka: KafkaBroker, tmp_path: Path, suffix: str, sep: str
) -> None:
    rows = [("source", "url", "uuid")] + [
        ("nasa", f"https://images.example/{i}.jpg", f"id-{i}") for i in range(25)
    ]
    feed = tmp_path / f"urls{suffix}"
    feed.write_text("\n".join(sep.join(row) for row in rows) + "\n")
    result = await arun("produce", str(feed), "--kafka", kafka.bootstrap)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "sent 25, bad 0"
    assert result.stderr == ""
    got = sorted((m.uuid, m.url, m.source) for m in await inbound(kafka))  # and nothing else
    assert got == sorted((row[2], row[1], row[0]) for row in rows[1:])


async def test_produce_takes_the_format_from_the_flag_and_keys_messages_by_uuid(
    kafka: KafkaBroker, tmp_path: Path
) -> None:
    feed = tmp_path / "export.txt"
    feed.write_text("url\tuuid\nhttps://x.example/a.jpg\tkeyed\n")
    result = await arun(
        "produce", str(feed), "--format", "tsv", "--source", "src", KAFKA_HOSTS=kafka.bootstrap
    )  # the connection from the environment this time
    assert result.returncode == 0, result.stderr
    (record,) = await everything_in(kafka.bootstrap, c.INBOUND_TOPIC)
    assert record.key == b"keyed"
    assert c.InboundImage.from_json(record.value).source == "src"


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty.jsonl", "", "empty: no rows to send"),
        ("blank.jsonl", "\n\n", "empty: no rows to send"),
        ("header-only.csv", "url,uuid,source\n", "empty: no rows to send"),
        ("columns.csv", "link,id,provider\nhttp://x/a.jpg,1,s\n", "line 1: unknown column(s)"),
    ],
)
def test_produce_refuses_a_file_with_nothing_to_send_before_connecting(
    tmp_path: Path, name: str, content: str, message: str
) -> None:
    feed = tmp_path / name
    feed.write_text(content)
    # Nothing listens there: the file is judged before any connection is tried.
    result = run("produce", str(feed), "--kafka", f"{LOOPBACK}:{free_port()}")
    assert result.returncode == 1
    assert message in result.stderr
    assert result.stdout.strip() == "sent 0, bad 0"


def test_produce_without_kafka_says_so_with_status_3(tmp_path: Path) -> None:
    feed = tmp_path / "urls.jsonl"
    feed.write_text('{"url": "http://x.example/a.jpg", "uuid": "u", "source": "s"}\n')
    result = run("produce", str(feed), "--kafka", f"{LOOPBACK}:{free_port()}")
    assert result.returncode == 3
    assert "Kafka at" in result.stderr
    assert "Unclosed" not in result.stderr  # the producer that could not start is closed


# --- status, halt, resume, override -------------------------------------------------------


@pytest.mark.timing(
    "reads rate keys that live 1.5 s, and Retry-After's seconds left (119-120), after a CLI start"
)
async def test_status_once_prints_the_seeded_state(redis: Redis, redis_url: str) -> None:
    await redis.sadd(c.INBOUND_SOURCES_SET, "flickr", "phylopic", "busy")
    configured = c.PacingInfo(178.375, 178.375, "computed", c.PACE_CONFIGURED, "as configured")
    cut = c.PacingInfo(14.0, 50.0, "computed", c.PACE_BACKOFF, "cut: 3 backoff signals")
    await redis.hset(c.RATES_HASH, mapping={"flickr": configured.to_json(), "busy": cut.to_json()})
    await redis.hset(c.RATES_HASH, "phylopic", "0.5")  # an older monitor's plain rate
    await redis.set(c.pace_rate_key("flickr"), "178.375", px=1500)
    await redis.set(c.pace_rate_key("busy"), "14", px=1500)
    await redis.set(c.pace_rate_key("phylopic"), "0", px=1500)  # halted: paced at 0
    seconds, microseconds = await redis.time()  # a 503 with Retry-After: 120
    await redis.set(c.pace_next_key("busy"), f"{seconds + microseconds / 1e6 + 120:.6f}")
    await redis.set(c.num_resized_key("flickr"), 13188)
    await redis.set(c.resize_errors_key("flickr"), 4)
    await redis.rpush(c.last50_key("flickr"), *(["200"] * 49 + ["404"]))
    await redis.sadd(c.HALTED_SET, "phylopic")
    await redis.set("override_rate:phylopic", "0.5")
    await redis.set(c.NUM_RESIZED, 13224)
    await redis.set(c.NUM_SPLIT, 14000)

    result = await arun("status", "--once", "--redis", redis_url)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    flickr = next(line for line in lines if "flickr" in line)
    assert re.search(
        r"flickr\s+178 of 178\s+178\s+configured\s+13188\s+4\s+200=49 404=1\s+running", flickr
    ), flickr
    busy = lines.index(next(line for line in lines if line.startswith("busy ")))
    assert re.search(r"busy\s+14 of 50\s+14\s+backoff\s+0\s+0\s+-\s+running", lines[busy])
    assert re.search(r"^\s+Retry-After: next request in 1(19|20) s\s*$", lines[busy + 1])
    assert re.search(r"^\s+cut: 3 backoff signals\s*$", lines[busy + 2])
    phylopic = next(line for line in lines if "phylopic" in line)
    assert re.search(
        r"phylopic\s+0.5\s+0\s+unknown\s+0\s+0\s+-\s+halted, override 0.5/s", phylopic
    ), phylopic
    assert "total: 13224 resized, 0 errors, 14000 split, 0 malformed" in result.stdout


async def test_status_reads_redis_from_the_environment_and_says_when_it_is_away(
    redis: Redis, redis_server: RedisServer
) -> None:
    await redis.sadd(c.INBOUND_SOURCES_SET, "fromenv")
    result = await arun("status", "--once", REDIS_HOST=LOOPBACK, REDIS_PORT=str(redis_server.port))
    assert result.returncode == 0, result.stderr
    assert "fromenv" in result.stdout
    away = await arun("status", "--once", "--redis", f"redis://{LOOPBACK}:{free_port()}/0")
    assert away.returncode == 3
    assert "Redis at" in away.stderr


async def test_halt_resume_and_override_change_the_documented_keys(
    redis: Redis, redis_url: str
) -> None:
    pacing = c.PacingInfo(2.0, 2.0, "computed", c.PACE_CONFIGURED, "as configured")
    await redis.hset(c.RATES_HASH, "example", pacing.to_json())
    await redis.set(c.pace_rate_key("example"), "2.0", px=1500)

    halted = await arun("halt", "Example", "--redis", redis_url)
    assert halted.returncode == 0, halted.stderr
    assert halted.stdout.splitlines() == [
        "SADD halted example  (the monitor paces it at 0 until it is resumed)",
        "SET pace_rate:example 0  (workers stop within their pacing horizon, ~0.05 s)",
        "SET currtokens:example 0  (the same for workers older than pacing)",
    ]
    assert halted.stderr == ""  # a known source: no warning
    assert await redis.smembers(c.HALTED_SET) == {"example"}
    assert await redis.get(c.pace_rate_key("example")) == "0"
    assert await redis.get(c.tokens_key("example")) == "0"

    # What tripping the breakers leaves behind.
    now = time.time()
    await redis.rpush(c.last50_key("example"), *["500"] * 50)
    await redis.zadd("status60s:example", {c.window_member("500", now): now})
    await redis.sadd(c.TEMP_HALTED_SET, "example")
    resumed = await arun("resume", "example", "--rate", "5", "--redis", redis_url)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.splitlines() == [
        "SET override_rate:example 5  (requests/s)",
        "DEL statuslast50req:example",
        "DEL status60s:example",
        "SREM halted example",
        "SREM temp_halted example",
    ]
    assert await redis.get("override_rate:example") == "5"
    assert await redis.exists("statuslast50req:example", "status60s:example") == 0
    assert await redis.smembers(c.HALTED_SET) == set()
    assert await redis.smembers(c.TEMP_HALTED_SET) == set()

    overridden = await arun("override", "example", "7.5", "--redis", redis_url)
    assert overridden.returncode == 0, overridden.stderr
    assert await redis.get("override_rate:example") == "7.5"
    await redis.set("override-rate:example", "3")
    cleared = await arun("override", "example", "--clear", "--redis", redis_url)
    assert cleared.returncode == 0, cleared.stderr
    assert cleared.stdout.splitlines() == ["DEL override_rate:example", "DEL override-rate:example"]
    assert await redis.exists("override_rate:example", "override-rate:example") == 0

    unknown = await arun("halt", "typo", "--redis", redis_url)
    assert unknown.returncode == 0
    assert "'typo' is not a source the monitor rates" in unknown.stderr


def test_robots_exempt_help_says_whose_responsibility_permission_is(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        cli.run(["robots-exempt", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "SADD robots_exempt SOURCE" in out and "SREM robots_exempt SOURCE" in out
    assert "permission" in out and "the operator's responsibility" in out


async def test_robots_exempt_adds_removes_and_lists(redis: Redis, redis_url: str) -> None:
    await redis.sadd(c.INBOUND_SOURCES_SET, "flickr", "met")

    empty = await arun("robots-exempt", "--redis", redis_url)
    assert (empty.returncode, empty.stdout) == (0, "")
    assert "no source is robots-exempt: robots.txt is obeyed for every source" in empty.stderr

    added = await arun("robots-exempt", "Flickr", "met", "flickr", "--redis", redis_url)
    assert added.returncode == 0, added.stderr
    assert added.stdout.splitlines() == [
        "SADD robots_exempt flickr  (robots.txt is no longer obeyed for flickr)",
        "SADD robots_exempt met  (robots.txt is no longer obeyed for met)",
    ]
    assert added.stderr == ""  # known sources: no warning
    assert await redis.smembers(c.ROBOTS_EXEMPT_SET) == {"flickr", "met"}

    again = await arun("robots-exempt", "met", "--redis", redis_url)
    assert "it was already exempt" in again.stdout

    listed = await arun("robots-exempt", "--list", "--redis", redis_url)
    assert (listed.returncode, listed.stdout, listed.stderr) == (0, "flickr\nmet\n", "")

    removed = await arun("robots-exempt", "--remove", "met", "--redis", redis_url)
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout.splitlines() == [
        "SREM robots_exempt met  (robots.txt is obeyed again for met)"
    ]
    assert await redis.smembers(c.ROBOTS_EXEMPT_SET) == {"flickr"}
    assert (await arun("robots-exempt", "--redis", redis_url)).stdout == "flickr\n"


async def test_robots_exempt_warns_about_an_unknown_source_but_does_it(
    redis: Redis, redis_url: str
) -> None:
    await redis.sadd(c.INBOUND_SOURCES_SET, "flickr")
    result = await arun("robots-exempt", "flickr", "flikr", "--redis", redis_url)
    assert result.returncode == 0
    assert "'flikr' is not a source the monitor rates" in result.stderr
    assert "'flickr'" not in result.stderr
    assert await redis.smembers(c.ROBOTS_EXEMPT_SET) == {"flickr", "flikr"}


def test_robots_exempt_without_redis_says_so_with_status_3() -> None:
    away = run("robots-exempt", "flickr", "--redis", f"redis://{LOOPBACK}:{free_port()}/0")
    assert away.returncode == 3
    assert "Redis at" in away.stderr


async def test_status_once_shows_robots(redis: Redis, redis_url: str) -> None:
    await redis.sadd(c.INBOUND_SOURCES_SET, "flickr", "met")
    await redis.set(c.resize_errors_key("flickr", c.Status.ROBOTS_DISALLOWED), 12)
    await redis.set(c.crawl_delay_key("flickr"), "10", ex=60)
    await redis.sadd(c.ROBOTS_EXEMPT_SET, "met")
    result = await arun("status", "--once", "--redis", redis_url)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    flickr = lines.index(next(line for line in lines if line.startswith("flickr ")))
    assert re.search(r"running\s+12 disallowed$", lines[flickr].rstrip()), lines[flickr]
    assert lines[flickr + 1].rstrip().endswith("delay 10 s")
    met = next(line for line in lines if line.startswith("met "))
    assert re.search(r"running\s+exempt$", met.rstrip()), met


# --- operator actions on a running crawl --------------------------------------------------

# The monitor's one rule that matters here, played by the test: it SETs the pace rate of
# a source that is not halted, with an expiry. Atomic, so that a write cannot land between
# halt's SADD and its SET 0; and it leaves a halted source's "0" to halt itself (the real
# monitor writes "0" too), so that the test holds halt's own SET to its promise.
REFILL = """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0 then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
end
"""


async def test_halt_stops_a_running_crawl_at_once_and_resume_restarts_it(
    kafka: KafkaBroker, redis: Redis, redis_url: str, origin, tmp_path: Path
) -> None:
    source = "busy"
    image = next(i for i in good_images() if i.content_type == "image/jpeg")
    tasks = [
        c.SourceTask(url=origin.add(f"/busy/{i}.jpg", image.body, "image/jpeg"), uuid=f"b{i}")
        for i in range(120)
    ]
    await create_topics(kafka.bootstrap, [c.source_topic(source)], partitions=1)
    await produce(kafka.bootstrap, c.source_topic(source), [t.to_json() for t in tasks])
    await redis.sadd(c.INBOUND_SOURCES_SET, source)
    thumbnails = tmp_path / "thumbnails"
    env = {
        **kafka.env,
        "REDIS_URL": redis_url,
        "THUMBNAIL_STORE": "local",
        "THUMBNAIL_DIR": str(thumbnails),
        "ALLOWED_PRIVATE_NETWORKS": "127.0.0.0/8",
        "MAX_TASKS": "1",  # one URL at a time: after a halt, at most one more request
        "IMAGE_PROCESSES": "1",
        "SOURCES_POLL_S": "0.2",
        "COMMIT_INTERVAL_S": "0.2",
        "TOKEN_RETRY_S": "0.05",
        "RATE_LIMIT_TIMEOUT_S": "0.5",
        "SHUTDOWN_GRACE_S": "2",
    }

    async def refill() -> None:  # 20 requests/s, renewed more often than the monitor does
        while True:
            await redis.eval(REFILL, 2, c.HALTED_SET, c.pace_rate_key(source), source, "20", 1500)
            await asyncio.sleep(0.1)

    refiller = asyncio.create_task(refill())
    worker = CrawlerProcess("worker", env, tmp_path / "worker.log")
    try:
        await wait_for(lambda: origin.total_requests >= 10, 60, what="the crawl to run")
        timeouts_before = len(worker.events("rate_limit_timeout"))

        halted = await arun("halt", source, "--redis", redis_url)
        at_halt = origin.total_requests
        assert halted.returncode == 0, halted.stderr
        assert await redis.sismember(c.HALTED_SET, source)
        assert await redis.get(c.pace_rate_key(source)) == "0"

        def waited(seconds: float) -> bool:
            events = worker.events("rate_limit_timeout")[timeouts_before:]
            return any(e["source"] == source and e["waited_s"] >= seconds for e in events)

        # The URL in hand has waited half a second without a slot...
        await wait_for(lambda: waited(0.5), 10, what="a URL waiting for a slot")
        after_halt = origin.total_requests
        # At most the request whose slot was granted before the halt (within the pacing
        # horizon); MAX_TASKS=1 holds one at a time.
        assert after_halt - at_halt <= 1
        # ...and another second later still nothing reached the origin.
        await wait_for(lambda: waited(1.5), 10, what="a URL waiting 1.5 s")
        assert origin.total_requests == after_halt
        assert await redis.get(c.pace_rate_key(source)) == "0"

        resumed = await arun("resume", source, "--redis", redis_url)
        assert resumed.returncode == 0, resumed.stderr
        assert not await redis.sismember(c.HALTED_SET, source)
        await wait_for(
            lambda: origin.total_requests >= after_halt + 5, 20, what="the crawl to resume"
        )
        worker.signal(signal.SIGTERM)
        assert await asyncio.to_thread(worker.wait, 30) == 0, worker.tail()
    finally:
        worker.stop()
        await cancel_and_wait([refiller])
    # The worker wrote its thumbnails to the local folder (THUMBNAIL_STORE=local).
    written = sorted(thumbnails.iterdir())
    assert len(written) >= after_halt - 1
    assert all(p.suffix == ".jpg" and p.stem.startswith("b") for p in written)  # no temp files
    with Image.open(written[0]) as thumbnail:
        assert thumbnail.format == "JPEG" and max(thumbnail.size) <= 640


# --- up -------------------------------------------------------------------------------------


class Running:
    """A long-running command whose output is collected by threads as it comes."""

    def __init__(self, *args: str, cwd: Path, **env: str) -> None:
        self.process = subprocess.Popen(
            [*command(), *args],
            env=cli_env(**env),
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        # Its process tree, once taken: what a killed command left behind is the test's.
        self.descendants: list[psutil.Process] = []
        assert self.process.stdout is not None and self.process.stderr is not None
        self._threads = [
            threading.Thread(target=self._collect, args=(self.process.stdout, self.out)),
            threading.Thread(target=self._collect, args=(self.process.stderr, self.err)),
        ]
        for thread in self._threads:
            thread.start()

    @staticmethod
    def _collect(stream: io.TextIOBase, lines: list[str]) -> None:
        for line in stream:
            lines.append(line.rstrip("\n"))

    @property
    def stdout(self) -> str:
        return "\n".join(self.out)

    @property
    def stderr(self) -> str:
        return "\n".join(self.err)

    def wait_for_line(self, pattern: str, timeout_s: float) -> re.Match[str]:
        def found() -> re.Match[str] | None:
            if self.process.poll() is not None:
                raise AssertionError(
                    f"exited {self.process.returncode}:\n{self.stdout}\n{self.stderr}"
                )
            return next(filter(None, (re.search(pattern, line) for line in self.out)), None)

        return wait_until(found, timeout_s, interval_s=0.05, what=repr(pattern))

    def wait(self, timeout_s: float) -> int:
        code = self.process.wait(timeout_s)
        for thread in self._threads:
            thread.join(5)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.wait(10)


@pytest.fixture
def running() -> Iterator[list[Running]]:
    started: list[Running] = []
    yield started
    for command_ in started:
        command_.kill()
        for child in command_.descendants:
            if child.is_running():
                child.kill()


def descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    return [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


async def test_up_runs_a_crawl_end_to_end_and_ctrl_c_stops_everything(
    origin, tmp_path: Path, running: list[Running]
) -> None:
    images = [i for i in good_images() if i.content_type == "image/jpeg"][:5]
    sources = tmp_path / "sources.json"
    sources.write_text(json.dumps([{"source_name": "upsrc", "image_count": 100_000_000}]))
    data = tmp_path / "data"
    up = Running(
        "up", "--workers", "1", "--sources-file", str(sources), "--data-dir", str(data),
        cwd=tmp_path,
    )  # fmt: skip
    running.append(up)
    broker = (await asyncio.to_thread(up.wait_for_line, r"^\s+broker\s+(\S+)", 60)).group(1)
    redis_url = up.wait_for_line(r"^\s+redis\s+(redis://\S+)", 1).group(1)
    assert up.wait_for_line(r"^\s+thumbnails\s+(\S+)", 1).group(1) == str(data / "thumbnails")
    assert up.wait_for_line(r"^\s+logs\s+(\S+)", 1).group(1) == str(data / "logs")
    assert up.wait_for_line(r"image-crawler produce urls.jsonl --kafka (\S+)", 1).group(1) == broker
    assert up.wait_for_line(r"kcat -P -b (\S+) -t inbound_images", 1).group(1) == broker
    dashboard = up.wait_for_line(r"^\s+dashboard\s+(http://127\.0\.0\.1:\d+/)", 1).group(1)
    worker_port = up.wait_for_line(r"workers' /metrics on 127\.0\.0\.1 ports (\d+)", 1).group(1)
    children = up.descendants = descendants(up.process.pid)
    names = " ".join(" ".join(p.cmdline()) for p in children)
    assert "crawl_monitor" in names and "-m worker" in names and "redis-server" in names

    feed = tmp_path / "urls.jsonl"
    with feed.open("w") as f:
        for n, image in enumerate(images):
            url = origin.add(f"/up/{image.name}", image.body, image.content_type)
            f.write(json.dumps({"url": url, "uuid": f"up-{n}", "source": "upsrc"}) + "\n")
    produced = await arun("produce", str(feed), KAFKA_HOSTS=broker)
    assert produced.returncode == 0, produced.stderr

    with_exif = sum(bool(i.exif) for i in images)
    raw = await read_records(
        broker, c.METADATA_TOPIC, min_messages=len(images) + with_exif, timeout_s=120
    )
    resolutions = {
        m["identifier"]: m for m in (json.loads(r.value) for r in raw) if "exif" not in m
    }
    assert set(resolutions) == {f"up-{n}" for n in range(len(images))}
    for n, image in enumerate(images):
        assert (resolutions[f"up-{n}"]["width"], resolutions[f"up-{n}"]["height"]) == (
            image.width,
            image.height,
        )
        assert (data / "thumbnails" / f"up-{n}.jpg").is_file()
    # Each image once, and the host's robots.txt and tdmrep.json once before them (404s:
    # allow all, reserve nothing).
    assert origin.requests("/robots.txt") == origin.requests("/.well-known/tdmrep.json") == 1
    assert origin.total_requests == len(images) + 2

    client = Redis.from_url(redis_url, decode_responses=True)
    try:
        await wait_for(
            lambda: _equals(client.get(c.num_resized_key("upsrc")), str(len(images))),
            10,
            what="the successes counted",
        )
    finally:
        await client.aclose()
    status = await arun("status", "--once", REDIS_URL=redis_url)
    assert status.returncode == 0, status.stderr
    # The duplicates column shows once the deduplication stage has placed images (these
    # five are one photograph at five JPEG qualities), which may be after the crawl ends.
    dupes = r"(?:\d+ \([\d.]+%\)\s+)?"
    row = re.compile(rf"^upsrc\s.*\s{len(images)}\s+0\s+{dupes}200={len(images)}\s", re.MULTILINE)
    assert row.search(status.stdout), status.stdout
    # up serves the dashboard and every process's metrics, on loopback.
    async with aiohttp.ClientSession() as http:
        async with http.get(dashboard) as page:
            assert page.status == 200 and "text/html" in page.headers["Content-Type"]
        async with http.get(f"{dashboard}metrics") as metrics:
            assert "crawler_successes_total" in await metrics.text()
        worker_metrics = f"http://127.0.0.1:{worker_port}/metrics"
        async with http.get(worker_metrics) as metrics:
            sent = f'crawler_outcomes_total{{source="upsrc",status="200"}} {len(images)}.0'
            assert sent in await metrics.text()

    up.process.send_signal(signal.SIGINT)  # Ctrl-C
    assert await asyncio.to_thread(up.wait, 120) == 0, up.stderr
    assert "stopped" in up.stderr
    assert alive(children) == [], [p.cmdline() for p in alive(children)]
    for log in ("kafka.log", "redis.log", "monitor.log", "worker-1.log"):
        assert (data / "logs" / log).stat().st_size > 0
    worker_log = (data / "logs" / "worker-1.log").read_text()
    assert '"event": "worker_stopped"' in worker_log


async def _equals(awaitable, value) -> bool:
    return (await awaitable) == value


async def test_up_stops_everything_and_fails_when_a_process_dies(
    tmp_path: Path, running: list[Running]
) -> None:
    up = Running("up", "--data-dir", str(tmp_path / "data"), cwd=tmp_path)
    running.append(up)
    match = await asyncio.to_thread(up.wait_for_line, r"worker-1 \(pid (\d+)\)", 60)
    children = up.descendants = descendants(up.process.pid)
    assert "no source is known" in up.stderr
    os.kill(int(match.group(1)), signal.SIGKILL)
    assert await asyncio.to_thread(up.wait, 60) == 1
    assert "worker-1 exited unexpectedly with status -9" in up.stderr
    assert alive(children) == []


async def test_up_stops_cleanly_on_sigterm(tmp_path: Path, running: list[Running]) -> None:
    up = Running("up", "--workers", "2", "--data-dir", str(tmp_path / "data"), cwd=tmp_path)
    running.append(up)
    await asyncio.to_thread(up.wait_for_line, r"worker-2 \(pid \d+\)", 60)
    children = up.descendants = descendants(up.process.pid)
    up.process.terminate()
    assert await asyncio.to_thread(up.wait, 60) == 0, up.stderr
    assert up.stderr.splitlines()[-1] == "image-crawler: stopped"
    assert alive(children) == []


# --- demo -----------------------------------------------------------------------------------


def test_demo_crawls_every_sample_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "metadata.jsonl"
    data = tmp_path / "data"
    began = time.monotonic()
    result = run("demo", "--out", str(out), "--data-dir", str(data), timeout_s=300)
    elapsed = time.monotonic() - began
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    print(f"image-crawler demo took {elapsed:.1f} s")  # shown with pytest -s

    samples = [s for s in load_samples() if s.name != BROKEN_SAMPLE]
    messages = [json.loads(line) for line in out.read_text().splitlines()]
    resolutions = [m for m in messages if "width" in m]
    assert len(resolutions) == len(samples) * len(DEMO_SOURCES)
    assert len({m["identifier"] for m in resolutions}) == len(resolutions)
    # Each sample, known by its byte size, crawled once per source with its true size.
    expected = Counter()
    for sample in samples:
        with Image.open(io.BytesIO(sample.body)) as im:
            expected[(len(sample.body), im.width, im.height)] += len(DEMO_SOURCES)
    assert Counter((m["filesize"], m["width"], m["height"]) for m in resolutions) == expected
    assert any("exif" in m for m in messages)

    thumbnails = list((data / "thumbnails").glob("*.jpg"))
    assert {p.stem for p in thumbnails} == {m["identifier"] for m in resolutions}

    summary = result.stdout
    assert "summary" in summary
    total = len(samples) * len(DEMO_SOURCES) + 2
    assert re.search(rf"total\W+{total}\W+{total}\W+{total - 2}\W+2\b", summary), summary
    for name, rate in DEMO_SOURCES:
        assert re.search(rf"{name}\W+{len(samples)}", summary) or name == DEMO_SOURCES[-1][0]
        assert re.search(rf"{name}\W.*\W{rate:g}\W", summary), name
    assert "stopped" in result.stderr
