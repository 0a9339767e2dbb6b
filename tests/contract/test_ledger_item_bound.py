"""A job's ledger item stays under DynamoDB's 400 KB by construction (issue 45, item 3: a 64-node job with
10 containers named at ECS's 255-character limit was 221 KB at attempt 1 and 452 KB at attempt 2, and
moto refused the write; one container, about 395 KB at 100 attempts, attempts uncapped across resubmits).

The worst case the door accepts is driven through the pure state machine (every node's events, a stop
reason and container names at their longest, the request at its biggest), and its largest version is
written through the job store's DynamoDB adapter on moto."""

from __future__ import annotations

from datetime import timedelta

import pytest

from spotguard.domain.jobs import gangs
from spotguard.domain.jobs.launches import begin_launch, launch_succeeded
from spotguard.domain.jobs.model import KEEP_ATTEMPTS, Job, JobState, client_token, revised, started_by
from spotguard.domain.jobs.spend import spend
from spotguard.domain.jobs.submission import MAX_NODES, RunTaskRequest
from spotguard.domain.jobs.transitions import on_task_event, request_resubmit
from spotguard.domain.tasks import TaskEvent
from tests.unit.test_gangs import CLUSTER, T0, _arn, _job

DYNAMODB_ITEM_LIMIT = 400 * 1024
BOUND = 300 * 1024  # the item's largest, with room for the other attributes and what a field may add
NAMES = [f"c{i}" + "x" * 253 for i in range(10)]  # ECS: 10 containers a task, names of 255 characters
CONTAINER_INSTANCE = "arn:aws:ecs:us-east-1:123456789012:container-instance/gpu-spot/" + "f" * 32


def _ev(attempt: int, node: int, version: int, status: str, at) -> TaskEvent:
    stopped = status == "STOPPED"
    return TaskEvent(
        task_arn=_arn(attempt, node),
        cluster_arn=CLUSTER,
        version=version,
        last_status=status,
        desired_status=status,
        started_by=started_by("g1", attempt, node),
        containers=tuple({"name": n, **({"exitCode": 75} if stopped else {})} for n in NAMES),
        private_ip="10.100.200.250",
        container_instance_arn=CONTAINER_INSTANCE,
        availability_zone="ap-southeast-1a",
        capacity_provider="c" * 255,
        launch_type="EC2",
        started_at=at,
        stopped_at=at + timedelta(minutes=30) if stopped else None,
        stop_code="SpotInterruption" if stopped else None,
        stopped_reason="r" * 255 if stopped else None,
    )


def _worst(nodes: int, attempts: int) -> tuple[Job, Job, int]:
    """The job after `attempts` attempts of `nodes` nodes (each one interrupted, every other one
    resubmitted by hand), its largest version, and that version's size in bytes."""
    job = revised(_job(nodes, max_attempts=2), containers=NAMES, request=_biggest_request())
    largest, size = job, 0
    for a in range(attempts):
        now = T0 + timedelta(hours=a)
        if job.state is not JobState.QUEUED:  # max_attempts 2: gave up, resubmitted by hand
            job = request_resubmit(job, now, None).job or job
        job = begin_launch(job, now).job or job
        n = job.next_attempt
        job = launch_succeeded(job, _arn(n, 0), "t" * 64, "s3://b/" + "k" * 900, now, resubmitted=a > 0).job
        job = on_task_event(job, _ev(n, 0, 2, "RUNNING", now), None, now).job or job
        for k in range(1, nodes):
            job = gangs.peer_launched(job, n, k, _arn(n, k), client_token("g1", n, 0, k), now).job or job
        for k in range(1, nodes):
            job = on_task_event(job, _ev(n, k, 2, "RUNNING", now), None, now).job or job
        for k in range(nodes):
            job = (
                on_task_event(job, _ev(n, k, 3, "STOPPED", now), "spot-interruption:" + "e" * 64, now).job
                or job
            )
            this = len(job.model_dump_json().encode())
            if this > size:
                largest, size = job, this
    return job, largest, size


def _biggest_request() -> RunTaskRequest:
    return RunTaskRequest(
        cluster="gpu-spot",
        taskDefinition="train-8gpu:1",
        launchType="EC2",
        tags=[{"key": "k" * 128, "value": "v" * 256} for _ in range(40)],
        group="g" * 255,
    )


def test_a_one_node_job_resubmitted_without_end_stays_small():
    job, _, size = _worst(1, 3 * KEEP_ATTEMPTS)
    assert size < 100 * 1024, size
    assert len(job.attempts) <= KEEP_ATTEMPTS + 1 and job.attempt_count == 3 * KEEP_ATTEMPTS
    assert job.folded.count == job.attempt_count - len(job.attempts)
    # at most 3 exit codes a task, the checkpoint container's (the first) first, names clipped
    assert list(job.attempts[-1].exit_codes) == [n[:64] for n in NAMES[:3]]
    # what `jobs status` says of them
    from spotguard.domain.jobs.answers import JobStatus

    status = JobStatus.of(job, [], T0 + timedelta(days=30))
    assert status.folded_attempts == job.folded.count and len(status.attempts) == len(job.attempts)
    # what the folded attempts spent is still counted: 30 minutes of 8 GPUs an attempt
    assert spend(job, {}, T0 + timedelta(days=30)).gpu_hours == pytest.approx(3 * KEEP_ATTEMPTS * 4.0)


@pytest.mark.slow  # 64 nodes x 25 attempts through the state machine: a few seconds
def test_the_worst_case_the_door_accepts_fits_dynamodb_and_is_written(dynamodb):
    from spotguard.adapters.job_store import DynamoJobStore
    from tests.contract.conftest import ledger_table

    job, largest, size = _worst(MAX_NODES, KEEP_ATTEMPTS + 5)
    assert size < BOUND < DYNAMODB_ITEM_LIMIT, f"{size // 1024} KB"
    assert job.next_attempt == KEEP_ATTEMPTS + 6  # attempt numbers go on past the folded ones
    table = ledger_table(dynamodb)
    store = DynamoJobStore(dynamodb, table)
    assert store.create(largest)  # moto refuses an item over 400 KB, as DynamoDB does
    assert store.get(largest.job_id) == largest
