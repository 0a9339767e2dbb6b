"""Issue 29, through the jobs function over moto: a submit whose deadline is not after now, or more than
a year from now, by the function's own clock, is refused in one line naming options.deadline and the
bound, and nothing is launched; the furthest deadline the door takes is submitted and launched."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from spotguard.domain.jobs.model import MAX_DEADLINE_HOURS
from spotguard_cli.emulator.world import JobsWorld

pytestmark = pytest.mark.slow  # deploys the stack into moto


def _submit(jobs: JobsWorld, deadline: datetime) -> dict:
    td = jobs.cluster.gpu_task_definition(gpus=1)
    request = {"cluster": "gpu-spot", "taskDefinition": td, "launchType": "EC2"}
    return jobs.invoke(
        {"action": "submit", "request": request, "options": {"deadline": deadline.isoformat()}}
    )


def test_submit_refuses_a_deadline_past_or_beyond_a_year_by_the_functions_clock(jobs: JobsWorld):
    for deadline in (datetime(2286, 11, 20, 17, 46, 40, tzinfo=UTC), datetime.now(UTC) - timedelta(hours=1)):
        answer = _submit(jobs, deadline)
        assert answer["ok"] is False and answer["error"]["type"] == "BadRequest", answer
        message = answer["error"]["message"]
        assert message.startswith("options.deadline: must be after now and at most 8,760 h (a year) from now")
        assert "\n" not in message
    # the function's clock decides, not the caller's: two hours on, a deadline in an hour is past
    jobs.shift_clock(2 * 3600)
    assert _submit(jobs, datetime.now(UTC) + timedelta(hours=1))["ok"] is False
    assert jobs.scheduler.requests == []
    furthest = datetime.now(UTC) + timedelta(hours=MAX_DEADLINE_HOURS)  # the clock is 2 h ahead: within
    answer = _submit(jobs, furthest)
    assert answer["ok"] is True and answer["job"]["state"] == "running", answer
    assert len(jobs.scheduler.requests) == 1
