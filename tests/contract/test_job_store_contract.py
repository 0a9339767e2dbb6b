"""The job store's contract (DynamoJobStore, adapters/job_store.py), the same cases against its fake
(tests/fakes.py FakeJobStore) and against the adapter on moto: create once, compare-and-set on `rev`, lists by
state and time through the ByState index, a job that cannot be read, the tasks found not managed, and the
checkpoints the ledger recorded."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from spotguard.domain.checkpoints import CheckpointRef
from spotguard.domain.jobs.model import Attempt, Job, JobState, UnreadableJob, bump
from spotguard.domain.jobs.submission import RunTaskRequest
from tests.contract.conftest import Side

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
CLUSTER = "arn:aws:ecs:us-east-1:123456789012:cluster/gpu-spot"
TASK = "arn:aws:ecs:us-east-1:123456789012:task/gpu-spot/" + "a" * 32


def job(job_id: str = "j1", state: JobState = JobState.QUEUED, at: datetime = T0, **kw) -> Job:
    base = {
        "job_id": job_id,
        "state": state,
        "request": RunTaskRequest(cluster=CLUSTER, taskDefinition="train-1gpu:1", launchType="EC2"),
        "checkpoint_uri": f"s3://bucket/jobs/{job_id}/",
        "gpus": 1,
        "containers": ["train"],
        "created_at": T0,
        "updated_at": at,
    }
    return Job(**{**base, **kw})


def running(job_id: str = "j1") -> Job:
    attempt = Attempt(
        number=1,
        task_arn=TASK,
        client_token=f"{job_id}/1/1",
        launched_at=T0,
        last_status="RUNNING",
        instance_type="g5.xlarge",
        availability_zone="us-east-1a",
        price_per_hour=0.4123,
        started_at=T0 + timedelta(seconds=95, microseconds=1),
    )
    return job(job_id, JobState.RUNNING, T0 + timedelta(minutes=2), attempts=[attempt], rev=2)


# ------------------------------------------------------------------------------------- create and get
def test_a_job_not_stored_is_none(side: Side):
    assert side.jobs.get("j1") is None


def test_a_job_is_read_back_as_it_was_written(side: Side):
    stored = running()
    assert side.jobs.create(stored)
    assert side.jobs.get("j1") == stored


def test_create_stores_a_job_once(side: Side):
    first = job(gpus=1)
    assert side.jobs.create(first)
    assert not side.jobs.create(job(gpus=8))  # the same id again: a concurrent submit or adoption
    assert side.jobs.get("j1") == first


def test_a_job_read_is_the_callers_own(side: Side):
    side.jobs.create(running())
    read = side.jobs.get("j1")
    read.attempts[0].last_status = "STOPPED"  # changed in hand, never written
    read.containers.append("sidecar")
    assert side.jobs.get("j1") == running()


# ---------------------------------------------------------------------------------- compare-and-set
def test_replace_writes_only_over_the_rev_it_read(side: Side):
    side.jobs.create(job())
    launched = bump(job(), T0 + timedelta(seconds=1), state=JobState.LAUNCHING)
    assert side.jobs.replace(launched, expected_rev=0)
    assert side.jobs.get("j1") == launched and launched.rev == 1
    stale = bump(job(), T0 + timedelta(seconds=2), state=JobState.CANCELLED)
    assert not side.jobs.replace(stale, expected_rev=0)  # rev 1 is stored now
    assert side.jobs.get("j1") == launched


def test_of_two_writers_that_read_the_same_rev_one_wins(side: Side):
    side.jobs.create(job())
    a, b = side.jobs.get("j1"), side.jobs.get("j1")
    assert side.jobs.replace(bump(a, T0, state=JobState.LAUNCHING), a.rev)
    assert not side.jobs.replace(bump(b, T0, cancel_requested=True), b.rev)
    again = side.jobs.get("j1")  # the loser reads again and computes its change on what it finds
    assert side.jobs.replace(bump(again, T0, cancel_requested=True), again.rev)
    assert side.jobs.get("j1").state is JobState.LAUNCHING and side.jobs.get("j1").cancel_requested


def test_replace_of_a_job_not_stored_writes_nothing(side: Side):
    assert not side.jobs.replace(job(), expected_rev=0)
    assert side.jobs.get("j1") is None


# ---------------------------------------------------------------------------------------------- lists
def _stored(side: Side) -> dict[str, Job]:
    jobs = {
        "q1": job("q1", JobState.QUEUED, T0 + timedelta(minutes=1)),
        "q2": job("q2", JobState.QUEUED, T0 + timedelta(minutes=3)),
        "q3": job("q3", JobState.QUEUED, T0 + timedelta(minutes=5, microseconds=500)),
        "r1": job("r1", JobState.RUNNING, T0 + timedelta(minutes=2)),
        "s1": job("s1", JobState.SUCCEEDED, T0 + timedelta(minutes=4)),
    }
    for j in jobs.values():
        side.jobs.create(j)
    return jobs


def ids(jobs: list[Job]) -> list[str]:
    return [j.job_id for j in jobs]


def test_a_state_lists_newest_first_or_oldest_first_up_to_the_limit(side: Side):
    _stored(side)
    assert ids(side.jobs.list(JobState.QUEUED, 10)) == ["q3", "q2", "q1"]
    assert ids(side.jobs.list(JobState.QUEUED, 2)) == ["q3", "q2"]
    assert ids(side.jobs.list(JobState.QUEUED, 2, oldest_first=True)) == ["q1", "q2"]
    assert side.jobs.list(JobState.CANCELLED, 10) == []


def test_every_state_lists_the_newest_of_them_all(side: Side):
    jobs = _stored(side)
    assert ids(side.jobs.list(None, 10)) == ["q3", "s1", "q2", "r1", "q1"]
    assert ids(side.jobs.list(None, 3)) == ["q3", "s1", "q2"]
    assert ids(side.jobs.list(None, 2, oldest_first=True)) == ["q1", "r1"]
    assert side.jobs.list(None, 10)[0] == jobs["q3"]


def test_a_job_lists_under_the_state_it_was_last_written_in(side: Side):
    _stored(side)
    q1 = side.jobs.get("q1")
    side.jobs.replace(bump(q1, T0 + timedelta(minutes=9), state=JobState.RUNNING), q1.rev)
    assert ids(side.jobs.list(JobState.QUEUED, 10)) == ["q3", "q2"]
    assert ids(side.jobs.list(JobState.RUNNING, 10)) == ["q1", "r1"]


def test_the_jobs_in_a_state_are_counted(side: Side):
    _stored(side)
    assert [side.jobs.count(s) for s in (JobState.QUEUED, JobState.RUNNING, JobState.FAILED)] == [3, 1, 0]


# -------------------------------------------------------------------------------- a job that cannot be read
def test_a_job_that_cannot_be_read_is_named_and_hides_no_other(side: Side):
    _stored(side)
    side.unreadable_job("bad", JobState.QUEUED, T0 + timedelta(minutes=2))
    with pytest.raises(UnreadableJob) as raised:
        side.jobs.get("bad")
    assert raised.value.job_id == "bad" and str(raised.value).startswith("job bad cannot be read: ")
    seen: list[UnreadableJob] = []
    assert ids(side.jobs.list(JobState.QUEUED, 10, on_unreadable=seen.append)) == ["q3", "q2", "q1"]
    assert [e.job_id for e in seen] == ["bad"]
    assert ids(side.jobs.list(None, 10)) == ["q3", "s1", "q2", "r1", "q1"]  # without a callback: left out
    assert not side.jobs.create(job("bad"))  # its id is taken
    assert side.jobs.count(JobState.QUEUED) == 4


def test_an_unreadable_job_takes_its_place_within_the_limit(side: Side):
    """The limit counts what the index holds: a state's `limit` newest items are read, and an unreadable
    one among them is reported and left out, so the list may be shorter than the jobs that exist."""
    _stored(side)
    side.unreadable_job("bad", JobState.QUEUED, T0 + timedelta(minutes=6))
    seen: list[UnreadableJob] = []
    assert ids(side.jobs.list(JobState.QUEUED, 2, on_unreadable=seen.append)) == ["q3"]
    assert [e.job_id for e in seen] == ["bad"]
    assert ids(side.jobs.list(JobState.QUEUED, 2, oldest_first=True)) == ["q1", "q2"]


# ------------------------------------------------------------------------------ tasks not managed
def test_a_task_found_not_managed_is_remembered(side: Side):
    assert not side.jobs.known_unmanaged(TASK)
    side.jobs.remember_unmanaged(TASK, T0)
    side.jobs.remember_unmanaged(TASK, T0 + timedelta(minutes=1))  # a repeat is harmless
    assert side.jobs.known_unmanaged(TASK)
    assert not side.jobs.known_unmanaged(TASK.replace("a" * 32, "b" * 32))
    assert side.jobs.get(TASK) is None and side.jobs.list(None, 10) == []  # no job


# ------------------------------------------------------------------------------------- checkpoints
def test_a_jobs_checkpoints_are_every_one_the_ledger_recorded_oldest_first(side: Side):
    prefix = "s3://bucket/jobs/j1/"

    def ref(seq: int, prefix: str = prefix) -> CheckpointRef:
        return CheckpointRef(prefix_uri=prefix, sequence=seq, manifest_uri=f"{prefix}{seq}/MANIFEST.json")

    assert side.jobs.checkpoints(prefix) == []
    for seq in (10, 2, 2, 1):  # out of order, one twice
        side.ledger.record_checkpoint(ref(seq))
    side.ledger.record_checkpoint(ref(3, "s3://bucket/jobs/j10/"))
    assert side.jobs.checkpoints(prefix) == [ref(1), ref(2), ref(10)]


def test_a_spare_groups_lease_has_one_holder_until_it_runs_out_or_is_let_go(side):
    """The spares' read-then-set on a group, one Lambda at a time (issue 45, item 4)."""
    now = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
    until = now + timedelta(seconds=30)
    jobs = side.jobs
    assert jobs.hold_group("g", "a", now, until)
    assert jobs.hold_group("g", "a", now, until)  # its holder again
    assert not jobs.hold_group("g", "b", now + timedelta(seconds=29), until)
    assert jobs.hold_group("other-group", "b", now, until)  # another group: its own lease
    jobs.let_go_group("g", "b")  # not b's: changes nothing
    assert not jobs.hold_group("g", "b", now + timedelta(seconds=1), until)
    jobs.let_go_group("g", "a")
    assert jobs.hold_group("g", "b", now + timedelta(seconds=1), until + timedelta(seconds=1))
    later = until + timedelta(seconds=2)  # b's ran out (its Lambda died): the group is free again
    assert jobs.hold_group("g", "c", later, later + timedelta(seconds=30))
