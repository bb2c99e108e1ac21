import pytest

from worker.fair_share import fair_share, resume_threshold


@pytest.mark.parametrize(
    ("max_tasks", "sources", "share"),
    [
        (3000, 0, 0),
        (3000, 1, 750),  # never more than a quarter of the worker
        (3000, 4, 750),
        (3000, 5, 600),
        (5000, 30, 166),  # the article's example
        (3000, 7, 428),  # rounded down
        (3000, 3000, 1),
        (3000, 10_000, 1),  # more sources than slots: still one each (the original gave 0)
        (10, 1, 2),
        (3, 1, 1),
    ],
)
def test_fair_share(max_tasks, sources, share):
    assert fair_share(max_tasks, sources) == share


@pytest.mark.parametrize(
    ("share", "resume_at"), [(1, 0), (2, 1), (3, 1), (4, 2), (5, 2), (750, 375), (751, 375)]
)
def test_a_full_source_resumes_with_half_its_share_free_and_at_least_one_slot(share, resume_at):
    assert resume_threshold(share) == resume_at
