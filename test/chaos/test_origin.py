"""The campaign's origin (chaos.origin) serves each host as the plan says and logs every
request with its arrival time, status and Retry-After."""

from __future__ import annotations

import io
import json

import aiohttp
import pytest
from aiohttp import web
from PIL import Image

from chaos import origin, plan
from crawlctl.localstack.services import free_port


def host(behaviour: str) -> str:
    return next(h.address for h in plan.HOSTS.values() if h.behaviour == behaviour)


@pytest.mark.timing("needs 5 sequential requests inside one second to hit the 2 req/s host's 503")
async def test_hosts_answer_as_planned_and_every_request_is_logged(tmp_path):
    log_path = tmp_path / "requests.jsonl"
    port = free_port()
    with log_path.open("a", buffering=1) as log:
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", origin.Origin(log).handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        for behaviour in (plan.PLAIN, plan.RETRY_AFTER, plan.CAPACITY, plan.CRAWL_DELAY):
            await web.TCPSite(runner, host(behaviour), port).start()
        try:
            answers = await _ask_all(port)
        finally:
            await runner.cleanup()
    plain, retry_after, capacity, robots = answers
    assert Image.open(io.BytesIO(plain["ok"])).format == "JPEG"
    assert (plain["missing"], plain["broken_status"]) == (404, 200)
    refused = [i for i, (status, _) in enumerate(retry_after) if status == 429]
    assert refused == [plan.RETRY_AFTER_EVERY - 1]
    assert retry_after[refused[0]][1] == str(plan.RETRY_AFTER_S)
    assert capacity[: int(plan.CAPACITY_RPS)] == [200] * int(plan.CAPACITY_RPS)
    assert 503 in capacity
    assert f"Crawl-delay: {plan.CRAWL_DELAY_S:g}" in robots
    logged = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert len(logged) == 3 + plan.RETRY_AFTER_EVERY + 5 + 1
    assert [row[3:] for row in logged if row[3] == 429] == [[429, plan.RETRY_AFTER_S]]


async def _ask_all(port: int) -> list:
    async with aiohttp.ClientSession() as session:

        async def get(address: str, path: str) -> tuple[int, bytes, str | None]:
            async with session.get(f"http://{address}:{port}{path}") as response:
                return response.status, await response.read(), response.headers.get("Retry-After")

        plain = host(plan.PLAIN)
        _, ok, _ = await get(plain, "/ok/u1.jpg")
        missing, _, _ = await get(plain, "/missing/u2.jpg")
        broken_status, _, _ = await get(plain, "/broken/u3.jpg")
        retry_after = []
        for i in range(plan.RETRY_AFTER_EVERY):
            status, _, header = await get(host(plan.RETRY_AFTER), f"/ok/r{i}.jpg")
            retry_after.append((status, header))
        capacity = [(await get(host(plan.CAPACITY), f"/ok/c{i}.jpg"))[0] for i in range(5)]
        _, robots, _ = await get(host(plan.CRAWL_DELAY), "/robots.txt")
    return [
        {"ok": ok, "missing": missing, "broken_status": broken_status},
        retry_after,
        capacity,
        robots.decode(),
    ]
