"""Re-checks against a real web server: ``python -m worker`` crawls a folder Debian's nginx
serves on loopback (nginx's own ETag, Last-Modified and 304s, not the test origin's),
then the folder changes and the same URLs are re-checked with what the first crawl
published.

- the first crawl's ``etag`` and ``last_modified`` are what nginx sends, ``sha256`` the
  file's;
- an unchanged file is answered 304, with no body (nginx's access log), and is reported
  ``unchanged`` with nothing re-published;
- a replaced file is ``changed``, crawled again with its new metadata;
- a deleted file is ``gone``, and on ``link_rot``;
- where nginx ignores the conditions (``etag off; if_modified_since off``) and sends the
  same body again, the body's hash makes it ``unchanged`` too.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import urllib.request
from pathlib import Path

import pytest

from image_crawler import contract as c
from test.harness.crawl import Outputs, start_sources, worker_env
from test.harness.nginx import Nginx
from test.harness.processes import CrawlerProcess
from test.harness.services import produce, wait_for

SAMPLES = Path(__file__).resolve().parents[2] / "crawlctl" / "samples"
SOURCE = "site"
# path on the server -> the sample it starts as
FILES = {
    "/same.jpg": "astronaut.jpg",
    "/replaced.jpg": "coffee.jpg",
    "/deleted.jpg": "rocket.jpg",
    "/ignored/same.jpg": "chelsea.jpg",
}
IGNORES_CONDITIONS = "location /ignored/ { etag off; if_modified_since off; }"


def sent_headers(url: str) -> tuple[str | None, str | None]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.headers.get("ETag"), response.headers.get("Last-Modified")


def checks(outputs: Outputs) -> dict[str, dict]:
    return {o.uuid: o.message for o in outputs.records if o.topic == c.LINK_CHECKS_TOPIC}


def resolutions(outputs: Outputs, uuid: str) -> list[c.ResolutionMessage]:
    return [
        c.ResolutionMessage.from_json(json.dumps(o.message))
        for o in outputs.of(uuid)
        if o.topic == c.METADATA_TOPIC
    ]


async def counted(redis) -> dict[str, int]:
    fields = [c.rechecks_field(SOURCE, check) for check in c.RECHECK_STATUSES]
    values = await redis.hmget(c.RECHECKS_HASH, fields)
    return {check: int(v or 0) for check, v in zip(c.RECHECK_STATUSES, values, strict=True)}


@pytest.mark.timeout(240)
async def test_a_re_check_against_nginx_finds_what_changed(
    kafka, redis, redis_url, s3_server, s3_bucket, tmp_path
):
    site = tmp_path / "site"
    (site / "ignored").mkdir(parents=True)
    for path, sample in FILES.items():
        shutil.copyfile(SAMPLES / sample, site / path.lstrip("/"))
    uuids = {path: f"u{i}" for i, path in enumerate(FILES)}
    await start_sources(redis, kafka, [SOURCE])
    env = worker_env(kafka, redis_url, s3_server, s3_bucket)

    with Nginx(site, work_dir=tmp_path / "nginx", server_config=IGNORES_CONDITIONS) as nginx:
        first_sent = {path: sent_headers(nginx.url(path)) for path in FILES}
        worker = CrawlerProcess("worker", env, tmp_path / "worker.log")
        try:
            async with Outputs(kafka.bootstrap) as outputs:
                tasks = [c.SourceTask(nginx.url(p), uuids[p]).to_json() for p in FILES]
                await produce(kafka.bootstrap, c.source_topic(SOURCE), tasks)
                await wait_for(
                    lambda: outputs.resolved >= set(uuids.values()), 120, what="the first crawl"
                )
                first = {p: resolutions(outputs, u)[0] for p, u in uuids.items()}
                for path, resolution in first.items():
                    body = (site / path.lstrip("/")).read_bytes()
                    assert resolution.sha256 == hashlib.sha256(body).hexdigest(), path
                    assert (resolution.etag, resolution.last_modified) == first_sent[path], path
                    assert resolution.phash is not None and len(resolution.phash) == 16
                assert first["/same.jpg"].etag is not None
                assert first["/ignored/same.jpg"].etag is None  # etag off
                assert first["/ignored/same.jpg"].last_modified is not None

                # The folder changes: one file replaced (a new mtime, as an upload gives
                # it), one deleted.
                replaced = site / "replaced.jpg"
                shutil.copyfile(SAMPLES / "hubble.jpg", replaced)
                later = replaced.stat().st_mtime + 10
                os.utime(replaced, (later, later))
                (site / "deleted.jpg").unlink()
                requests_before = {p: len(nginx.requests(p)) for p in FILES}

                rechecks = [
                    c.SourceTask(
                        nginx.url(p),
                        uuids[p],
                        earlier=c.Earlier(r.etag, r.last_modified, r.sha256),
                    ).to_json()
                    for p, r in first.items()
                ]
                await produce(kafka.bootstrap, c.source_topic(SOURCE), rechecks)
                await wait_for(
                    lambda: set(checks(outputs)) >= set(uuids.values()), 120, what="re-checks"
                )
                await outputs.sync()
                found = checks(outputs)
                verdicts = {
                    p: (found[u]["status"], found[u]["http_status"]) for p, u in uuids.items()
                }
                assert verdicts == {
                    "/same.jpg": ("unchanged", 304),
                    "/replaced.jpg": ("changed", 200),
                    "/deleted.jpg": ("gone", 404),
                    "/ignored/same.jpg": ("unchanged", 200),
                }

                # Each answer's log line may come a moment after the answer itself.
                for p in ("/same.jpg", "/ignored/same.jpg"):
                    await wait_for(
                        lambda p=p: len(nginx.requests(p)) > requests_before[p],
                        5,
                        what=f"nginx's log line for {p}",
                    )
                # nginx answered the unchanged file 304 to our If-None-Match, no body.
                (asked,) = nginx.requests("/same.jpg")[requests_before["/same.jpg"] :]
                assert (asked.status, asked.body_bytes) == (304, 0)
                assert asked.if_none_match == first["/same.jpg"].etag
                assert asked.if_modified_since == first["/same.jpg"].last_modified
                # Where nginx ignored the condition, it sent the body again.
                (ignored,) = nginx.requests("/ignored/same.jpg")[
                    requests_before["/ignored/same.jpg"] :
                ]
                assert ignored.status == 200 and ignored.body_bytes > 0

                # Nothing re-published for the unchanged ones; the changed one anew.
                for path in ("/same.jpg", "/ignored/same.jpg", "/deleted.jpg"):
                    assert len(resolutions(outputs, uuids[path])) == 1, path
                old, new = resolutions(outputs, uuids["/replaced.jpg"])
                assert (new.etag, new.last_modified) == sent_headers(nginx.url("/replaced.jpg"))
                assert new.etag != old.etag
                assert new.sha256 == hashlib.sha256(replaced.read_bytes()).hexdigest()
                assert new.phash != old.phash
                assert outputs.count(c.LINK_ROT_TOPIC) == {uuids["/deleted.jpg"]: 1}
                assert outputs.count(c.CRAWL_ERRORS_TOPIC) == {}

            # Counted once the stats flush has run (after each check was published).
            expected = {"unchanged": 2, "changed": 1, "gone": 1, "failed": 0}
            last: dict[str, int] = {}

            async def all_counted() -> bool:
                last.update(await counted(redis))
                return last == expected

            await wait_for(all_counted, 10, what="the re-checks counted")
        finally:
            worker.stop()
