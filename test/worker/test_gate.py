import asyncio
import contextlib

from structlog.testing import capture_logs

from test.harness.services import wait_for
from worker.sinks.base import DependencyError
from worker.sinks.gate import FinishGate


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_calls_that_answer_hold_nothing_and_one_failing_holds_until_it_ends():
    gate = FinishGate()
    with gate.call("publish"):
        assert gate.holding() is None
    with gate.call("s3_put") as failed, gate.call("publish"):
        failed()
        assert gate.holding() == "s3_put"
    assert gate.holding() is None


def test_a_call_without_an_answer_holds_once_it_has_waited_stall_after_s():
    clock = Clock()
    gate = FinishGate(stall_after_s=5.0, clock=clock)
    with gate.call("s3_put"):
        clock.now += 4.9
        assert gate.holding() is None
        clock.now += 0.1
        assert gate.holding() == "s3_put"
        with gate.call("publish"):  # a new call does not hide the old one
            assert gate.holding() == "s3_put"
    assert gate.holding() is None


async def test_a_waiter_goes_on_when_the_last_failing_call_ends_not_before():
    gate = FinishGate()
    with capture_logs() as logs:
        with gate.call("s3_put") as first, gate.call("publish") as second:
            first()
            second()
            waiter = asyncio.ensure_future(gate.wait_open())
            await wait_for(lambda: any(e["event"] == "requests_held" for e in logs), 5)
            with gate.call("publish"):
                pass  # a call that ends without failing leaves the gate closed
            await asyncio.sleep(0)
            assert not waiter.done()
        await asyncio.wait_for(waiter, 5)
    assert [e["event"] for e in logs] == ["requests_held", "requests_resumed"]
    assert logs[0]["op"] == "s3_put"


async def test_a_failing_call_cancelled_leaves_it_away_one_probe_at_a_time_until_a_success():
    # A revoked partition's URL given up while its put was failing: the store is still
    # away, and requests stay held but for a probe, until a call succeeds.
    clock = Clock()
    gate = FinishGate(probe_s=2.0, clock=clock)

    async def failing_forever() -> None:
        with gate.call("s3_put") as failed:
            failed()
            await asyncio.Event().wait()

    call = asyncio.ensure_future(failing_forever())
    await wait_for(lambda: gate.holding() == "s3_put", 5)
    call.cancel()
    await wait_for(call.done, 5)
    assert gate.holding() is None  # no call in hand: one request may go, the probe
    await asyncio.wait_for(gate.wait_open(), 5)
    assert gate.holding() == "s3_put"  # the next waits for the probe's outcome
    clock.now += 2.0
    assert gate.holding() is None  # no call from the probe in PROBE_S: another probe
    await asyncio.wait_for(gate.wait_open(), 5)
    with gate.call("s3_put"):
        assert gate.holding() == "s3_put"  # the probe's put, not answered yet
    assert gate.holding() is None
    with gate.call("s3_put"):
        assert gate.holding() is None  # back: requests go on while calls are in hand


def test_a_refusal_is_an_answer_and_a_call_that_was_never_in_trouble_leaves_nothing():
    gate = FinishGate()
    with contextlib.suppress(DependencyError), gate.call("s3_put") as failed:
        failed()
        raise DependencyError("s3", PermissionError("403"), retriable=False)
    assert gate.holding() is None
    with contextlib.suppress(ConnectionError), gate.call("publish"):
        raise ConnectionError("cancelled at once, or an unexpected error")
    assert gate.holding() is None
