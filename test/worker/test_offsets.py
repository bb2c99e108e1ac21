import pytest

from worker.offsets import OffsetTracker, lost_before


def test_nothing_to_commit_until_the_first_message_finishes():
    tracker = OffsetTracker()
    tracker.start(10)
    tracker.start(11)
    assert tracker.committable() is None
    tracker.finish(10)
    assert tracker.committable() == 11


def test_commit_never_passes_an_unfinished_message_even_when_later_ones_finish_first():
    tracker = OffsetTracker()
    for offset in range(5):
        tracker.start(offset)
    for offset in (4, 3, 1):
        tracker.finish(offset)
    assert tracker.committable() is None
    assert len(tracker) == 2
    tracker.finish(0)
    assert tracker.committable() == 2
    tracker.finish(2)
    assert tracker.committable() == 5
    assert len(tracker) == 0


def test_gaps_in_offsets_are_fine():
    tracker = OffsetTracker()
    tracker.start(3)
    tracker.start(7)
    tracker.finish(7)
    tracker.finish(3)
    assert tracker.committable() == 8


def test_repeated_start_and_finish_are_harmless():
    tracker = OffsetTracker()
    tracker.start(1)
    tracker.start(1)
    tracker.finish(1)
    tracker.finish(1)
    tracker.finish(99)
    assert tracker.committable() == 2
    assert 1 not in tracker


def test_offsets_must_be_taken_in_order():
    tracker = OffsetTracker()
    tracker.start(5)
    with pytest.raises(ValueError):
        tracker.start(4)


@pytest.mark.parametrize(
    ("next_offset", "log_start", "lost"),
    [
        (2, 6, 4),  # offsets 2..5 were deleted before the group read them
        (6, 6, 0),
        (9, 6, 0),  # read past the log start: nothing lost
        (None, 6, 0),  # no committed offset: the group had not begun, nothing to say
        (-1, 6, 0),  # Kafka's "no offset"
        (0, 0, 0),
    ],
)
def test_lost_before(next_offset, log_start, lost):
    assert lost_before(next_offset, log_start) == lost
