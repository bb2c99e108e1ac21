import asyncio

from structlog.testing import capture_logs

from test.harness.services import wait_for
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


async def test_a_cancelled_call_opens_the_gate_too():
    gate = FinishGate()

    async def failing_forever() -> None:
        with gate.call("s3_put") as failed:
            failed()
            await asyncio.Event().wait()

    call = asyncio.ensure_future(failing_forever())
    await wait_for(lambda: gate.holding() == "s3_put", 5)
    call.cancel()
    await asyncio.wait_for(gate.wait_open(), 5)
    assert gate.holding() is None
