"""Issue 29: `options.deadline` had no bound. A submit with a deadline in 2286 took 20.5 s and every
reconcile sweep 17.2 s with it queued. The planner's work no longer grows with the deadline, and the door
refuses, in one line naming the field and the bound, a deadline that is not after now or more than a year
(`MAX_DEADLINE_HOURS`) from now, by the jobs function's clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from spotguard.domain.jobs.model import MAX_DEADLINE_HOURS, Job
from spotguard.domain.jobs.request import deadline_refused
from spotguard.domain.jobs.submission import JobOptions

NOW = datetime(2026, 11, 26, 12, tzinfo=UTC)
DOOR = NOW + timedelta(hours=MAX_DEADLINE_HOURS)
BOUND = (
    "options.deadline: must be after now and at most 8,760 h (a year) from now, "
    "between 2026-11-26T12:00:00Z and 2027-11-26T12:00:00Z; got "
)


def test_the_bound_is_a_year():
    assert MAX_DEADLINE_HOURS == 365 * 24


@pytest.mark.parametrize(
    "deadline",
    [None, NOW + timedelta(seconds=1), NOW + timedelta(hours=60), DOOR],
    ids=["none", "a second", "60 h", "a year"],
)
def test_the_door_takes_a_deadline_within_a_year(deadline):
    assert deadline_refused(deadline, NOW) is None


@pytest.mark.parametrize(
    ("deadline", "got"),
    [
        (NOW, "2026-11-26T12:00:00Z"),
        (NOW - timedelta(hours=1), "2026-11-26T11:00:00Z"),
        (DOOR + timedelta(seconds=1), "2027-11-26T12:00:01Z"),
        (datetime(2286, 11, 20, 17, 46, 40, tzinfo=UTC), "2286-11-20T17:46:40Z"),
        (datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC), "9999-12-31T23:59:59Z"),
        (datetime(1970, 1, 1, tzinfo=UTC), "1970-01-01T00:00:00Z"),
        (datetime(2027, 1, 1, 9, tzinfo=UTC) - timedelta(days=400), "2025-11-27T09:00:00Z"),
    ],
    ids=["now", "an hour ago", "a year and a second", "2286", "9999", "1970", "400 days ago"],
)
def test_the_door_refuses_a_past_or_far_deadline_in_one_line(deadline, got):
    assert deadline_refused(deadline, NOW) == BOUND + got


def test_another_zone_is_named_as_given():
    tokyo = datetime(2300, 1, 1, 9, tzinfo=UTC).astimezone(ZoneInfo("Asia/Tokyo"))
    said = deadline_refused(tokyo, NOW)
    assert said is not None and said.endswith("got 2300-01-01T18:00:00+09:00")


def test_a_stored_job_whose_deadline_is_past_or_far_is_still_read():
    """Only submit checks the bound: a job submitted before it, or whose deadline has passed, loads."""
    for deadline in (datetime(2286, 1, 1, tzinfo=UTC), datetime(2020, 1, 1, tzinfo=UTC)):
        options = JobOptions(deadline=deadline)
        job = Job.model_validate(
            {
                "job_id": "job-1",
                "state": "queued",
                "request": {"cluster": "gpu-spot", "taskDefinition": "t"},
                "options": options.model_dump(mode="json"),
                "checkpoint_uri": "s3://b/checkpoints/job-1/",
                "created_at": NOW.isoformat(),
                "updated_at": NOW.isoformat(),
            }
        )
        assert job.options.deadline == deadline
