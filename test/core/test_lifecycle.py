import asyncio

from image_crawler.lifecycle import cancel_and_wait


async def _swallows_cancellations(times: int, cancels: list[int]) -> None:
    """Loops like a task whose ``wait_for`` lost a cancellation, ``times`` times over."""
    while True:
        try:
            await asyncio.Event().wait()  # until cancelled
        except asyncio.CancelledError:
            cancels.append(1)
            if len(cancels) > times:
                raise


async def test_a_task_that_loses_cancellations_is_cancelled_until_it_stops():
    cancels: list[int] = []
    task = asyncio.create_task(_swallows_cancellations(2, cancels))
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait([task], recancel_after_s=0.01), 5)
    assert task.cancelled()
    assert len(cancels) == 3


async def test_a_task_cleaning_up_is_not_interrupted_before_the_recancel_delay():
    cleaned = asyncio.Event()

    async def cleans_up() -> None:
        try:
            await asyncio.Event().wait()  # until cancelled
        finally:
            await asyncio.sleep(0.05)
            cleaned.set()

    task = asyncio.create_task(cleans_up())
    await asyncio.sleep(0)
    await cancel_and_wait([task], recancel_after_s=1.0)
    assert cleaned.is_set()


async def test_exceptions_stay_on_their_tasks_and_finished_tasks_are_left_alone():
    async def fails() -> None:
        raise ValueError("boom")

    failed = asyncio.create_task(fails())
    finished = asyncio.create_task(asyncio.sleep(0, result=7))
    await asyncio.wait([failed, finished])
    await cancel_and_wait([failed, finished])
    assert isinstance(failed.exception(), ValueError)
    assert finished.result() == 7
