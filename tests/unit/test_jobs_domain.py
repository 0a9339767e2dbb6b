"""The job state machine and the RunTask request it builds, without AWS."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from spotguard.domain.jobs.adoption import checkpoint_uri_of, rebuild_request
from spotguard.domain.jobs.effects import Launch, Notify, Stop
from spotguard.domain.jobs.launches import begin_launch, launch_failed, launch_succeeded, retry_delay
from spotguard.domain.jobs.model import (
    Attempt,
    AvoidedPool,
    Job,
    JobError,
    JobState,
    client_token,
    started_by,
)
from spotguard.domain.jobs.request import avoid_constraints, run_task_params
from spotguard.domain.jobs.spend import spend
from spotguard.domain.jobs.submission import JobOptions, RunTaskRequest
from spotguard.domain.jobs.task_events import described_task
from spotguard.domain.jobs.transitions import on_task_event, request_cancel, request_resubmit
from spotguard.domain.tasks import TaskEvent

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
CLUSTER = "arn:aws:ecs:us-east-1:123456789012:cluster/gpu-spot"
TASK = "arn:aws:ecs:us-east-1:123456789012:task/gpu-spot/"


def _job(**kw) -> Job:
    base = {
        "job_id": "j1",
        "state": JobState.QUEUED,
        "request": RunTaskRequest(cluster="gpu-spot", taskDefinition="train-4gpu:1", launchType="EC2"),
        "checkpoint_uri": "s3://bucket/jobs/j1/",
        "gpus": 4,
        "containers": ["train", "sidecar"],
        "created_at": T0,
        "updated_at": T0,
    }
    return Job(**{**base, **kw})


def _running(n: int = 1, **kw) -> Job:
    job = _job()
    for i in range(1, n + 1):
        if i > 1:  # the previous attempt was interrupted
            ev = _ev(job.attempts[-1].task_arn, 3, "STOPPED", 75)
            job = on_task_event(job, ev, None, T0).job
        job = begin_launch(job, T0).job
        job = launch_succeeded(job, f"{TASK}{i:032x}", "tok", "", T0, resubmitted=i > 1).job
    return job.model_copy(update=kw)


def _ev(arn: str, version: int, status: str, exit_code: int | None = None, **kw) -> TaskEvent:
    containers = ({"name": "train", "exitCode": exit_code},) if status == "STOPPED" else ({"name": "train"},)
    return TaskEvent(
        task_arn=arn,
        cluster_arn=CLUSTER,
        version=version,
        last_status=status,
        desired_status="STOPPED" if status == "STOPPED" else "RUNNING",
        containers=containers,
        **kw,
    )


def test_launch_then_start():
    step = begin_launch(_job(), T0)
    assert step.job.state is JobState.LAUNCHING and step.job.launch_tries == 1
    (launch,) = step.effects
    assert launch == Launch(attempt=1, client_token="j1/1/1")
    started = launch_succeeded(step.job, TASK + "a" * 32, launch.client_token, "", T0, resubmitted=False)
    assert started.job.state is JobState.RUNNING and started.job.live_attempt.number == 1


def test_a_launch_in_flight_is_repeated_with_the_same_token():
    launching = begin_launch(_job(), T0).job
    again = begin_launch(launching, T0 + timedelta(minutes=1))
    assert again.job is None  # nothing to write
    assert again.effects == [Launch(attempt=1, client_token="j1/1/1")]


def test_the_event_of_a_launch_whose_answer_was_lost_binds_the_task():
    launching = begin_launch(_job(), T0).job
    arn = TASK + "b" * 32
    step = on_task_event(launching, _ev(arn, 2, "RUNNING", started_by=started_by("j1", 1)), None, T0)
    assert step.job.state is JobState.RUNNING and step.job.attempts[0].task_arn == arn


def test_a_second_task_for_a_job_is_stopped():
    job = _running()
    stray = TASK + "c" * 32
    step = on_task_event(job, _ev(stray, 2, "RUNNING", started_by=started_by("j1", 1)), None, T0)
    assert step.job is None
    assert step.effects == [Stop(cluster=CLUSTER, task_arn=stray, reason=step.effects[0].reason)]
    assert step.effects[0].reason.startswith("SpotGuard: job j1")


def test_stale_events_change_nothing():
    job = _running()
    arn = job.attempts[0].task_arn
    stopped = on_task_event(job, _ev(arn, 5, "STOPPED", 75), None, T0).job
    assert stopped.state is JobState.QUEUED
    late = on_task_event(stopped, _ev(arn, 3, "RUNNING"), None, T0)
    assert late.job is None and "stale" in late.note
    again = on_task_event(stopped, _ev(arn, 5, "STOPPED", 75), None, T0)
    assert again.job is None


@pytest.mark.parametrize(
    ("exit_code", "reason", "stop_code", "state"),
    [
        (0, "Essential container in task exited", "EssentialContainerExited", JobState.SUCCEEDED),
        (75, "Essential container in task exited", "EssentialContainerExited", JobState.QUEUED),
        (137, "SpotGuard: spot-interruption e1 on i-1", "UserInitiated", JobState.QUEUED),
        (None, "Host EC2 (instance i-0123456789abcdef0) terminated.", None, JobState.QUEUED),
        (None, "Your Spot Task was interrupted.", "SpotInterruption", JobState.QUEUED),
        (143, "SpotGuard: cancelled job j1", "UserInitiated", JobState.CANCELLED),
        (1, "Essential container in task exited", "EssentialContainerExited", JobState.FAILED),
        (None, "CannotPullContainerError: pull access denied", "TaskFailedToStart", JobState.FAILED),
    ],
)
def test_a_stopped_task_moves_its_job(exit_code, reason, stop_code, state):
    job = _running()
    ev = _ev(job.attempts[0].task_arn, 3, "STOPPED", exit_code, stopped_reason=reason, stop_code=stop_code)
    step = on_task_event(job, ev, None, T0)
    assert step.job.state is state, step.job.last_reason


def test_a_notice_recorded_by_the_interruption_path_counts_as_an_interruption():
    job = _running()
    ev = _ev(job.attempts[0].task_arn, 3, "STOPPED", 137, stopped_reason="Task stopped by user")
    step = on_task_event(job, ev, "spot-interruption#e1#i-1", T0)
    assert step.job.state is JobState.QUEUED
    assert step.job.attempts[0].interrupted_by == "spot-interruption#e1#i-1"


def test_interruption_avoids_the_instance_for_good_and_its_pool_for_a_while():
    job = _running()
    a = job.attempts[0].model_copy(
        update={"instance_id": "i-0aaa", "instance_type": "g5.12xlarge", "availability_zone": "us-east-1a"}
    )
    job = job.model_copy(update={"attempts": [a]})
    step = on_task_event(job, _ev(a.task_arn, 3, "STOPPED", 75), None, T0)
    requeued = step.job
    assert requeued.avoid_instances == ["i-0aaa"]
    (pool,) = requeued.avoid_pools
    assert pool.until == T0 + timedelta(seconds=1800)
    params = run_task_params(requeued, Launch(attempt=2, client_token="t"), "s3://b/m", T0)
    exprs = [c["expression"] for c in params["placementConstraints"]]
    assert exprs == [
        "ec2InstanceId !in [i-0aaa]",
        "attribute:ecs.instance-type != g5.12xlarge or attribute:ecs.availability-zone != us-east-1a",
    ]
    later = run_task_params(requeued, Launch(attempt=2, client_token="t"), "", T0 + timedelta(hours=1))
    assert [c["expression"] for c in later["placementConstraints"]] == ["ec2InstanceId !in [i-0aaa]"]


def test_run_task_params_carry_the_spotguard_environment_in_every_container():
    job = _job(
        request=RunTaskRequest(
            cluster="gpu-spot",
            taskDefinition="train-4gpu:1",
            capacityProviderStrategy=[{"capacityProvider": "gpu-spot-cp", "weight": 1}],
            overrides={
                "containerOverrides": [
                    {
                        "name": "train",
                        "command": ["python", "train.py"],
                        "environment": [
                            {"name": "LR", "value": "0.1"},
                            {"name": "SPOTGUARD_ATTEMPT", "value": "99"},
                        ],
                    }
                ]
            },
            tags=[{"key": "team", "value": "ml"}],
            enableExecuteCommand=True,
            propagateTags="TASK_DEFINITION",
        )
    )
    params = run_task_params(job, Launch(attempt=3, client_token="j1/3/1"), "s3://bucket/m.json", T0)
    by_name = {c["name"]: c for c in params["overrides"]["containerOverrides"]}
    assert set(by_name) == {"train", "sidecar"}
    env = {e["name"]: e["value"] for e in by_name["train"]["environment"]}
    assert env == {
        "LR": "0.1",
        "SPOTGUARD_JOB_ID": "j1",
        "SPOTGUARD_ATTEMPT": "3",
        "SPOTGUARD_CHECKPOINT_URI": "s3://bucket/jobs/j1/",
        "SPOTGUARD_RESUME_FROM": "s3://bucket/m.json",
    }
    assert by_name["train"]["command"] == ["python", "train.py"]
    assert params["startedBy"] == "spotguard/j1/3" and params["clientToken"] == "j1/3/1"
    assert {"key": "spotguard:job-id", "value": "j1"} in params["tags"]
    assert params["capacityProviderStrategy"] == [{"capacityProvider": "gpu-spot-cp", "weight": 1}]
    assert params["enableExecuteCommand"] is True and params["propagateTags"] == "TASK_DEFINITION"
    assert "launchType" not in params and "placementConstraints" not in params


def test_fargate_gets_no_placement_constraints():
    job = _job(
        request=RunTaskRequest(cluster="gpu-spot", taskDefinition="t:1", launchType="FARGATE"),
        avoid_instances=["i-1"],
    )
    assert "placementConstraints" not in run_task_params(job, Launch(attempt=2, client_token="t"), "", T0)


def test_user_constraints_come_first_and_the_total_stays_within_ecs_limits():
    mine = [{"type": "memberOf", "expression": f"attribute:x{i} == y"} for i in range(9)]
    job = _job(
        request=RunTaskRequest(cluster="gpu-spot", taskDefinition="t:1", placementConstraints=mine),
        avoid_instances=["i-1"],
        avoid_pools=[
            AvoidedPool(
                instance_type="g5.xlarge", availability_zone="us-east-1a", until=T0 + timedelta(hours=1)
            )
        ],
    )
    params = run_task_params(job, Launch(attempt=2, client_token="t"), "", T0)
    assert params["placementConstraints"][:9] == mine and len(params["placementConstraints"]) == 10


def test_no_capacity_waits_longer_each_try_and_asks_for_capacity():
    assert [retry_delay(n) for n in (1, 2, 3, 4, 5, 6, 7)] == [30, 60, 120, 240, 480, 900, 900]
    launching = begin_launch(_job(), T0).job
    step = launch_failed(launching, "RESOURCE:GPU", T0)
    assert step.job.state is JobState.QUEUED and step.job.retry_at == T0 + timedelta(seconds=30)
    assert begin_launch(step.job, T0 + timedelta(seconds=10)).job is None  # not due yet
    again = begin_launch(step.job, T0 + timedelta(seconds=30))
    assert again.effects == [Launch(attempt=1, client_token=client_token("j1", 1, 2))]


def test_max_attempts_gives_up():
    job = _running(3, options=JobOptions(max_attempts=3))
    step = on_task_event(job, _ev(job.attempts[-1].task_arn, 3, "STOPPED", 75), None, T0)
    assert step.job.state is JobState.GAVE_UP
    assert [e.kind for e in step.effects if isinstance(e, Notify)] == ["interrupted", "gave-up"]


def test_cancel_and_resubmit_rules():
    queued = _job()
    assert request_cancel(queued, T0, "no").job.state is JobState.CANCELLED
    running = _running()
    step = request_cancel(running, T0, "no")
    assert step.job.cancel_requested and isinstance(step.effects[0], Stop)
    with pytest.raises(JobError, match="cancel it first"):
        request_resubmit(running, T0, None)
    done = step.job.model_copy(update={"state": JobState.CANCELLED})
    with pytest.raises(JobError, match="already cancelled"):
        request_cancel(done, T0, "again")
    again = request_resubmit(done, T0, "s3://bucket/jobs/j1/checkpoints/00000001/MANIFEST.json").job
    assert again.state is JobState.QUEUED and again.budget_base == 1 and not again.cancel_requested
    launch = begin_launch(again, T0).effects[0]
    assert launch.resume_from_hint.endswith("00000001/MANIFEST.json")


def test_a_task_started_for_a_job_cancelled_meanwhile_is_stopped():
    launching = begin_launch(_job(), T0).job
    cancelled = request_cancel(launching, T0, "no").job
    step = launch_succeeded(cancelled, TASK + "d" * 32, "t", "", T0, resubmitted=False)
    assert step.job is None and isinstance(step.effects[0], Stop)


def test_spend_counts_gpu_hours_and_the_work_lost_after_the_last_checkpoint():
    job = _running(2)
    a1, a2 = job.attempts
    a1 = a1.model_copy(
        update={
            "started_at": T0,
            "stopped_at": T0 + timedelta(hours=2),
            "outcome": "resubmit",
            "price_per_hour": 1.5,
        }
    )
    a2 = a2.model_copy(update={"started_at": T0 + timedelta(hours=2), "price_per_hour": 1.0})
    job = job.model_copy(update={"attempts": [a1, a2]})
    commits = {1: [T0 + timedelta(hours=1, minutes=30)]}
    s = spend(job, commits, now=T0 + timedelta(hours=3))
    assert s.gpu_hours == pytest.approx(4 * 3)
    assert s.gpu_hours_lost == pytest.approx(4 * 0.5)  # 30 minutes after the last commit, 4 GPUs
    assert s.dollars == pytest.approx(2 * 1.5 + 1 * 1.0)
    assert s.dollars_lost == pytest.approx(0.5 * 1.5)
    unpriced = job.model_copy(update={"attempts": [a1, a2.model_copy(update={"price_per_hour": None})]})
    assert spend(unpriced, commits, T0 + timedelta(hours=3)).dollars is None


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("count", 2, "count"),
        ("startedBy", "me", "Extra inputs"),
        ("clientToken", "x", "Extra inputs"),
        ("tags", [{"key": "spotguard:job-id", "value": "x"}], "set by SpotGuard"),
        ("tags", [{"key": "aws:foo", "value": "x"}], "reserved"),
        ("capacityProviderStrategy", [{"capacityProvider": "cp"}], "not both"),
    ],
)
def test_the_request_refuses_what_spotguard_sets(field, value, message):
    with pytest.raises(ValidationError, match=message):
        RunTaskRequest(cluster="c", taskDefinition="t", launchType="EC2", **{field: value})


def test_adoption_rebuilds_the_request_from_a_description():
    description = {
        "taskArn": TASK + "e" * 32,
        "lastStatus": "RUNNING",
        "clusterArn": CLUSTER,
        "taskDefinitionArn": "arn:aws:ecs:us-east-1:123456789012:task-definition/train-8gpu:4",
        "capacityProviderName": "gpu-spot-cp",
        "launchType": "EC2",
        "group": "family:train-8gpu",
        "enableExecuteCommand": False,
        "overrides": {
            "containerOverrides": [
                {"name": "train", "command": ["python", "train.py", "--lr", "3e-4"]},
                {"name": "sidecar"},
            ],
            "taskRoleArn": "arn:aws:iam::123456789012:role/train",
            "inferenceAcceleratorOverrides": [],
        },
        "tags": [
            {"key": "spotguard:managed", "value": "true"},
            {"key": "aws:ecs:clusterName", "value": "gpu-spot"},
        ],
        "attachments": [
            {"type": "ElasticNetworkInterface", "details": [{"name": "subnetId", "value": "subnet-0abc"}]}
        ],
    }
    task = described_task(description)
    req = rebuild_request(task, security_groups=["sg-1"])
    assert req.capacityProviderStrategy[0].capacityProvider == "gpu-spot-cp" and req.launchType is None
    assert req.overrides == {
        "taskRoleArn": "arn:aws:iam::123456789012:role/train",
        "containerOverrides": [{"name": "train", "command": ["python", "train.py", "--lr", "3e-4"]}],
    }
    assert [t.key for t in req.tags] == ["spotguard:managed"]
    assert req.networkConfiguration == {
        "awsvpcConfiguration": {
            "subnets": ["subnet-0abc"],
            "assignPublicIp": "DISABLED",
            "securityGroups": ["sg-1"],
        }
    }
    assert checkpoint_uri_of(task, {"train": {"SPOTGUARD_CHECKPOINT_URI": "s3://b/own/"}}) == "s3://b/own/"
    assert checkpoint_uri_of(task, {"train": {"SPOTGUARD_CHECKPOINT_URI": "not-a-uri"}}) is None


def test_attempt_liveness():
    a = Attempt(number=1, task_arn=TASK + "f" * 32, launched_at=T0)
    assert a.live
    assert not a.model_copy(update={"last_status": "STOPPED"}).live
    assert avoid_constraints([], [], T0) == []


def test_a_request_may_not_borrow_the_stacks_ebs_role_nor_an_unlisted_one_for_its_volumes():
    """The stack may pass its EBS role to ECS (for EBS mode): a request that configured its own volume
    with that role could have any snapshot restored into its task. Its own volumes take its own roles."""
    from spotguard.domain.jobs.replies import TaskDefinitionInfo
    from spotguard.domain.jobs.request import not_permitted

    stack_role = "arn:aws:iam::123456789012:role/spotguard-EbsVolumesRole-ABC"
    td = TaskDefinitionInfo(arn="arn:td", containers=["train"], gpus=1, environment={}, family="train")

    def volume(role: str) -> RunTaskRequest:
        config = {
            "name": "data",
            "managedEBSVolume": {"roleArn": role, "snapshotId": "snap-0123456789abcdef0"},
        }
        return RunTaskRequest(cluster="gpu-spot", taskDefinition="train:1", volumeConfigurations=[config])

    borrowed = not_permitted(volume(stack_role), JobOptions(), td, ["arn:aws:iam::*:role/*"], [], stack_role)
    assert borrowed and "the stack's own EBS role" in borrowed
    ml = ["arn:aws:iam::*:role/ml/*"]
    unlisted = not_permitted(volume("arn:aws:iam::1:role/x"), JobOptions(), td, ml, [])
    assert unlisted and "volumeConfigurations.0.managedEBSVolume.roleArn" in unlisted
    own = volume("arn:aws:iam::123456789012:role/ml/volumes")
    assert not_permitted(own, JobOptions(), td, ml, [], stack_role) is None
