"""``image-crawler status``, the command: ``--json``, ``--once`` and its options' errors.
The state and its views are tested in test_status_model, test_status_terminal and
test_status_json."""

from __future__ import annotations

import asyncio
import json

import pytest
from redis.asyncio import Redis

from crawlctl import cli
from crawlctl.console import EXIT_OK, EXIT_USAGE
from test.crawlctl.test_status_model import seed_backlog
from test.crawlctl.test_status_terminal import row_names


async def test_the_command_prints_json_sorted_and_cut(
    redis: Redis, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    await seed_backlog(redis)
    argv = ["status", "--json", "--sort", "errors", "--top", "1", "--redis", redis_url]
    assert await asyncio.to_thread(cli.run, argv) == EXIT_OK
    document = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in document["sources"]] == ["flickr"]
    assert document["general"]["sources"] == 6


async def test_the_command_prints_the_table_once(
    redis: Redis,
    redis_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await seed_backlog(redis)
    monkeypatch.setenv("COLUMNS", "100")
    argv = ["status", "--once", "--top", "3", "--redis", redis_url]
    assert await asyncio.to_thread(cli.run, argv) == EXIT_OK
    text = capsys.readouterr().out
    assert row_names(text) == ["flickr", "busy", "broken"]
    assert "showing 3 of 6 sources by backlog (3 more hidden: --top, --sort)" in text
    assert max(len(line) for line in text.splitlines()) <= 100


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["status", "--top", "0"], "--top must be at least 1"),
        (["status", "--sort", "speed"], "invalid choice: 'speed'"),
    ],
)
def test_bad_options(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = cli.run(argv)
    except SystemExit as e:
        code = int(e.code or 0)
    assert code == EXIT_USAGE
    assert message in capsys.readouterr().err
