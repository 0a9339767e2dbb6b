"""The sample events for the jobs and task-events functions are real, valid input."""

from __future__ import annotations

import json

import pytest

from spotguard.domain.jobs.commands import parse_command
from spotguard.domain.jobs.task_events import classify_task_message
from spotguard.domain.own_events import launch_due_message
from spotguard.domain.settings import Settings
from tests.conftest import EVENTS, REPO

JOB_SAMPLES = sorted((REPO / "events" / "jobs").glob("*.json"))


@pytest.mark.parametrize("path", JOB_SAMPLES, ids=[p.stem for p in JOB_SAMPLES])
def test_every_jobs_sample_is_a_valid_command(path):
    payload = json.loads(path.read_text())
    assert parse_command(payload).action == path.stem.split("-")[0]


def test_the_task_event_sample_is_acted_on():
    msg = classify_task_message(
        (EVENTS / "ecs-task-state-change.json").read_text(), Settings(clusters=("gpu-spot",))
    )
    assert msg.outcome == "act" and msg.task.version == 5 and msg.task.last_status == "STOPPED"
    assert msg.task.containers[0]["exitCode"] == 75
    elsewhere = classify_task_message(
        (EVENTS / "ecs-task-state-change.json").read_text(), Settings(clusters=("x",))
    )
    assert elsewhere.outcome == "ignore"


@pytest.mark.parametrize(
    ("body", "outcome", "reason"),
    [
        ("{", "reject", "not valid JSON"),
        (json.dumps({"id": "1"}), "reject", "missing"),
        (
            json.dumps(json.loads((EVENTS / "instance-state-shutting-down.json").read_text())),
            "ignore",
            "does not act",
        ),
    ],
)
def test_task_messages_that_are_not_task_events(body, outcome, reason):
    msg = classify_task_message(body, Settings())
    assert msg.outcome == outcome and reason in msg.reason


def test_a_spot_warning_is_read_for_the_early_replacement_as_the_interruption_function_reads_it():
    body = (EVENTS / "spot-interruption-warning.json").read_text()
    msg = classify_task_message(body, Settings())
    assert msg.outcome == "warning" and msg.notice is not None
    assert msg.notice.instance_id == json.loads(body)["detail"]["instance-id"]
    bad = json.loads(body)
    bad["detail"]["instance-id"] = "not-an-instance"
    refused = classify_task_message(json.dumps(bad), Settings())
    assert refused.outcome == "reject" and "instance-id" in refused.reason


def test_a_terminate_action_of_another_hook_is_not_a_warning():
    event = json.loads((EVENTS / "asg-terminate-lifecycle-action.json").read_text())
    assert classify_task_message(json.dumps(event), Settings()).outcome == "warning"
    event["detail"]["LifecycleHookName"] = "someone-elses-hook"
    assert classify_task_message(json.dumps(event), Settings()).outcome == "ignore"


def test_a_task_event_without_a_version_is_rejected():
    event = json.loads((EVENTS / "ecs-task-state-change.json").read_text())
    del event["detail"]["version"]
    msg = classify_task_message(json.dumps(event), Settings())
    assert msg.outcome == "reject" and msg.reason.startswith("detail.version")


@pytest.mark.parametrize("field", ["createdAt", "startedAt", "stoppingAt", "stoppedAt"])
def test_a_task_time_that_is_a_number_is_rejected_not_read_as_1970(field):
    event = json.loads((EVENTS / "ecs-task-state-change.json").read_text())
    event["detail"][field] = 0
    msg = classify_task_message(json.dumps(event), Settings(clusters=("gpu-spot",)))
    assert msg.outcome == "reject" and msg.reason.startswith(f"detail.{field}")


def test_launch_due_round_trips():
    from datetime import UTC, datetime

    msg = classify_task_message(launch_due_message("job-1", 3, datetime.now(UTC)), Settings())
    assert (msg.outcome, msg.job_id, msg.launch_try) == ("launch", "job-1", 3)
