"""Stopped tasks of every kind, classified as SpotGuard's job state machine needs them."""

from __future__ import annotations

import copy

import pytest

from spotguard.domain.jobs.stops import OwnRecord, classify_stop

from ..conftest import load_event

BASE = load_event("ecs-task-state-change.json")["detail"]


def stopped(exit_code=None, stop_code=None, reason="", containers=None, **more):
    d = copy.deepcopy(BASE)
    d["stoppedReason"] = reason
    if stop_code is None:
        d.pop("stopCode", None)  # older events carry none
    else:
        d["stopCode"] = stop_code
    if containers is not None:
        d["containers"] = containers
    else:
        c = d["containers"][0]
        if exit_code is None:
            c.pop("exitCode", None)
        else:
            c["exitCode"] = exit_code
    d.update(more)
    return d


@pytest.mark.parametrize(
    ("event", "own", "outcome", "reason_part"),
    [
        (
            stopped(0, "EssentialContainerExited", "Essential container in task exited"),
            None,
            "succeeded",
            "exited 0",
        ),
        (
            stopped(75, "EssentialContainerExited", "Essential container in task exited"),
            None,
            "resubmit",
            "exit 75",
        ),
        (
            stopped(75, "UserInitiated", "SpotGuard: spot-interruption 1e5527d7 on i-0b662ef9931388ba0"),
            None,
            "resubmit",
            "exit 75",
        ),
        (
            stopped(137, "UserInitiated", "SpotGuard: spot-interruption 1e5527d7 on i-0b662ef9931388ba0"),
            None,
            "resubmit",
            "spot-interruption 1e5527d7",
        ),
        (
            stopped(137, "UserInitiated", "Task stopped by user"),
            OwnRecord(stopped_for_notice="health#e#i"),
            "resubmit",
            "health#e#i",
        ),
        (
            stopped(None, "SpotInterruption", "Your Spot Task was interrupted."),
            None,
            "resubmit",
            "SpotInterruption",
        ),
        (
            stopped(143, "TerminationNotice", "Your task was stopped by a termination notice"),
            None,
            "resubmit",
            "TerminationNotice",
        ),
        (
            stopped(None, None, "Host EC2 (instance i-0b662ef9931388ba0) terminated."),
            None,
            "resubmit",
            "host went away",
        ),
        (
            stopped(None, "TaskFailedToStart", "Host EC2 (instance i-0b662ef9931388ba0) stopped."),
            None,
            "resubmit",
            "host went away",
        ),
        (
            stopped(
                containers=[
                    {
                        "name": "train",
                        "lastStatus": "STOPPED",
                        "reason": "EC2 instance i-0abc12345678 was terminated",
                    }
                ]
            ),
            None,
            "resubmit",
            "host went away",
        ),
        (stopped(75, "UserInitiated", "SpotGuard: cancelled by the user"), None, "cancelled", "cancelled"),
        (
            stopped(143, "UserInitiated", "Task stopped by user"),
            OwnRecord(cancelled=True),
            "cancelled",
            "cancelled",
        ),
        (
            stopped(1, "EssentialContainerExited", "Essential container in task exited"),
            None,
            "failed",
            "exit 1",
        ),
        (
            stopped(137, None, "OutOfMemoryError: Container killed due to memory usage"),
            None,
            "failed",
            "exit 137",
        ),
        (
            stopped(
                None, "TaskFailedToStart", "CannotPullContainerError: pull image manifest has been retried"
            ),
            None,
            "failed",
            "no exit code",
        ),
        (stopped(None, None, ""), None, "failed", "no reason given"),
    ],
)
def test_classification(event, own, outcome, reason_part):
    v = classify_stop(event, own)
    assert v.outcome == outcome, v
    assert reason_part in v.reason


def test_the_checkpoint_container_decides_not_a_sidecar():
    containers = [
        {"name": "log-router", "exitCode": 143, "lastStatus": "STOPPED"},
        {"name": "train", "exitCode": 0, "lastStatus": "STOPPED"},
    ]
    assert classify_stop(stopped(containers=containers), checkpoint_container="train").outcome == "succeeded"
    assert classify_stop(stopped(containers=containers), checkpoint_container=None).outcome == "failed"


def test_exit_69_means_the_checkpoint_could_not_be_read_now_so_try_again():
    """The agent exits 69 (EX_UNAVAILABLE) when a committed checkpoint exists but cannot be read now
    (S3 throttling or down, access denied): the job's work is intact, so it is resubmitted, not failed."""
    verdict = classify_stop(stopped(69, "EssentialContainerExited", "Essential container in task exited"))
    assert verdict.outcome == "resubmit" and "69" in verdict.reason and "could not be read" in verdict.reason
