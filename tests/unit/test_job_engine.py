"""The jobs engine with fakes for its ports (the job store's in tests/fakes.py): one loop (transition,
compare-and-set, effects that hand back transitions, drive), no AWS."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from spotguard.domain.checkpoints import CheckpointRef
from spotguard.domain.jobs.effects import Step
from spotguard.domain.jobs.model import Job, JobState, revised
from spotguard.domain.jobs.replies import RunResult
from spotguard.domain.jobs.submission import RunTaskRequest
from spotguard.domain.jobs.transitions import on_task_event, request_cancel
from spotguard.domain.tasks import TaskEvent
from spotguard.usecases.jobs.ebs import EbsVolumes
from spotguard.usecases.jobs.engine import Conflict, JobEngine, JobsConfig
from tests.fakes import FakeJobEcs, FakeJobStore, FakeNotifier, FakeRetries, FakeVolumes

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
CLUSTER = "arn:aws:ecs:us-east-1:123456789012:cluster/gpu-spot"
TASK = "arn:aws:ecs:us-east-1:123456789012:task/gpu-spot/"


class FakeCheckpoints:
    def newest(self, prefix_uri):
        return CheckpointRef(prefix_uri=prefix_uri, sequence=7, manifest_uri=f"{prefix_uri}checkpoints/7/M")


def _job(**kw) -> Job:
    base = {
        "job_id": "j1",
        "state": JobState.QUEUED,
        "request": RunTaskRequest(cluster=CLUSTER, taskDefinition="train-1gpu:1", launchType="EC2"),
        "checkpoint_uri": "s3://bucket/jobs/j1/",
        "gpus": 1,
        "containers": ["train"],
        "created_at": T0,
        "updated_at": T0,
    }
    return Job(**{**base, **kw})


def _engine(store: FakeJobStore, ecs: FakeJobEcs, volumes: FakeVolumes | None = None):
    notifier, retries = FakeNotifier(), FakeRetries()
    engine = JobEngine(
        config=JobsConfig(checkpoint_bucket="bucket", ebs_role_arn="arn:aws:iam::123456789012:role/ebs"),
        store=store,
        ecs=ecs,
        checkpoints=FakeCheckpoints(),
        notifier=notifier,
        retries=retries,
        clock=lambda: T0,
        volumes=EbsVolumes(volumes, lambda: T0) if volumes else None,
    )
    return engine, notifier, retries


def test_a_queued_job_is_launched_once_and_runs():
    store = FakeJobStore()
    store.jobs["j1"] = _job()
    engine, notifier, retries = _engine(store, FakeJobEcs(RunResult(task_arn=TASK + "a" * 32)))
    job = engine.drive("j1")
    assert job.state is JobState.RUNNING and job.attempts[0].task_arn == TASK + "a" * 32
    (params,) = engine.ecs.runs
    assert params["clientToken"] == "j1/1/1" and params["startedBy"] == "spotguard/j1/1"
    assert retries.scheduled == [] and notifier.sent == []  # a first attempt is no news
    assert store.writes == 2  # launching, then running


def test_no_capacity_schedules_one_retry_and_says_so_once():
    store = FakeJobStore()
    store.jobs["j1"] = _job()
    engine, notifier, retries = _engine(
        store, FakeJobEcs(RunResult(failure="capacity", reason="RESOURCE:GPU"))
    )
    job = engine.drive("j1")
    assert job.state is JobState.QUEUED and (job.retry_at - T0).total_seconds() == 30
    assert retries.scheduled == [("j1", 1, 30)]
    assert sorted(n.kind for n in notifier.sent) == ["capacity-wanted", "waiting"]
    assert job.outbox == [] and store.jobs["j1"].outbox == []  # sent, then cleared
    assert len(engine.ecs.runs) == 1  # not due again within this run


def test_a_refused_request_fails_the_job_without_a_retry():
    store = FakeJobStore()
    store.jobs["j1"] = _job()
    engine, notifier, retries = _engine(
        store, FakeJobEcs(RunResult(failure="request", reason="ClientException: bad family"))
    )
    job = engine.drive("j1")
    assert job.state is JobState.FAILED and "bad family" in job.last_reason
    assert retries.scheduled == [] and [n.kind for n in notifier.sent] == ["failed"]


def test_a_throttled_run_task_waits_and_retries_without_asking_for_capacity():
    store = FakeJobStore()
    store.jobs["j1"] = _job()
    throttled = RunResult(failure="transient", reason="ThrottlingException: Rate exceeded")
    engine, notifier, retries = _engine(store, FakeJobEcs(throttled))
    job = engine.drive("j1")
    assert job.state is JobState.QUEUED and retries.scheduled == [("j1", 1, 30)]
    assert [n.kind for n in notifier.sent] == ["waiting"] and "Rate exceeded" in job.last_reason


def test_access_denied_fails_the_job_and_says_why():
    store = FakeJobStore()
    store.jobs["j1"] = _job()
    denied = RunResult(
        failure="access", reason="AccessDeniedException: not authorized to perform iam:PassRole"
    )
    engine, _, retries = _engine(store, FakeJobEcs(denied))
    job = engine.drive("j1")
    assert job.state is JobState.FAILED and "iam:PassRole" in job.last_reason and retries.scheduled == []


def test_a_write_that_loses_the_race_is_computed_again_on_the_job_as_it_now_stands():
    store = FakeJobStore(conflicts=2)
    store.jobs["j1"] = _job()
    engine, _, _ = _engine(store, FakeJobEcs(RunResult(task_arn=TASK + "b" * 32)))
    job = engine.drive("j1")
    assert job.state is JobState.RUNNING and len(engine.ecs.runs) == 1


def test_a_job_that_never_stops_changing_is_a_conflict_not_a_loop():
    store = FakeJobStore(conflicts=100)
    store.jobs["j1"] = _job()
    engine, _, _ = _engine(store, FakeJobEcs())
    with pytest.raises(Conflict):
        engine.drive("j1")
    assert engine.ecs.runs == []


def test_effects_hand_back_transitions_in_the_same_run_ebs_stop_to_the_next_launch():
    """A STOPPED event of an EBS-mode attempt: the stop is written, the volume snapshotted (an effect),
    the snapshot's completion applied (the transition the effect handed back), and the next attempt
    launched from it: one call of run, no call back into it."""
    store = FakeJobStore()
    arn1, arn2 = TASK + "1" * 32, TASK + "2" * 32
    ecs = FakeJobEcs(RunResult(task_arn=arn1), RunResult(task_arn=arn2))
    volumes = FakeVolumes()
    volumes.add_volume("j1", 1)  # the volume ECS makes at the first launch: vol-0001
    store.jobs["j1"] = _job(ebs_volume="checkpoints", checkpoint_uri="file:///ckpt/")
    engine, notifier, _ = _engine(store, ecs, volumes)
    engine.drive("j1")
    stopped = TaskEvent(
        task_arn=arn1,
        cluster_arn=CLUSTER,
        version=3,
        last_status="STOPPED",
        desired_status="STOPPED",
        containers=({"name": "train", "exitCode": 75},),
    )
    job, _ = engine.run("j1", lambda j: on_task_event(j, stopped, None, T0))
    assert volumes.snapshots == ["vol-0001"]
    assert job.state is JobState.RUNNING and [a.task_arn for a in job.attempts] == [arn1, arn2]
    assert job.snapshots == ["snap-00000001"]
    (volume,) = ecs.runs[1]["volumeConfigurations"]
    assert volume["managedEBSVolume"]["snapshotId"] == "snap-00000001"
    assert ecs.runs[1]["overrides"]["containerOverrides"][0]["environment"][-1] == {
        "name": "SPOTGUARD_RESUME_FROM",
        "value": "",  # EBS mode: the agent finds the checkpoint on the volume
    }
    assert "resubmitted" in [n.kind for n in notifier.sent]


def test_a_pending_snapshot_leaves_the_job_snapshotting_until_its_event():
    store = FakeJobStore()
    arn1 = TASK + "1" * 32
    store.jobs["j1"] = _job(ebs_volume="checkpoints", checkpoint_uri="file:///ckpt/")
    volumes = FakeVolumes("pending")
    volumes.add_volume("j1", 1)
    engine, _, _ = _engine(store, FakeJobEcs(RunResult(task_arn=arn1)), volumes)
    engine.drive("j1")
    stopped = TaskEvent(
        task_arn=arn1, cluster_arn=CLUSTER, version=3, last_status="STOPPED", containers=({"exitCode": 75},)
    )
    job, _ = engine.run("j1", lambda j: on_task_event(j, stopped, None, T0))
    assert job.state is JobState.SNAPSHOTTING and job.attempts[0].snapshot_id == "snap-00000001"


def test_cancel_does_not_drive_and_stops_the_live_task():
    store = FakeJobStore()
    arn1 = TASK + "1" * 32
    store.jobs["j1"] = _job()
    engine, _, _ = _engine(store, FakeJobEcs(RunResult(task_arn=arn1)))
    engine.drive("j1")
    job, _ = engine.run("j1", lambda j: request_cancel(j, T0, "no longer needed"), drive=False)
    assert job.cancel_requested and engine.ecs.stops[0][0] == arn1


def test_a_transition_that_changes_nothing_writes_nothing():
    store = FakeJobStore()
    store.jobs["j1"] = _job(state=JobState.SUCCEEDED)
    engine, _, _ = _engine(store, FakeJobEcs())
    job, note = engine.run("j1", lambda j: Step(note="nothing to do"))
    assert note == "nothing to do" and store.writes == 0 and job.state is JobState.SUCCEEDED


class _LateReader(FakeJobStore):
    """A job store whose next `get` hands out the job as it stood before (`stale`): a Lambda that read
    the job just before another Lambda wrote it."""

    def __init__(self) -> None:
        super().__init__()
        self.stale: Job | None = None

    def get(self, job_id: str) -> Job | None:
        if self.stale is not None:
            job, self.stale = self.stale, None
            return job
        return super().get(job_id)


def test_an_attempt_stopped_by_two_lambdas_at_once_is_spent_once(capsys):
    """The same STOPPED event applied by two Lambdas at once (EventBridge delivers at least once): the
    second read the job while its attempt still ran, lost the compare-and-set and found the stop done.
    Its GPU-hours are counted by the one write that stopped the attempt, not by each Lambda."""
    from spotguard.adapters.job_metrics import SpendMeter
    from spotguard.usecases.jobs.service import JobService

    store = _LateReader()
    arn = TASK + "1" * 32
    store.jobs["j1"] = _job()
    engine, _, retries = _engine(store, FakeJobEcs(RunResult(task_arn=arn)))
    engine.on_written = [SpendMeter(store)]
    service = JobService(engine, None, None, retries=retries)  # type: ignore[arg-type]
    engine.drive("j1")

    def event(status: str, version: int, **kw) -> TaskEvent:
        return TaskEvent(
            task_arn=arn,
            cluster_arn=CLUSTER,
            version=version,
            last_status=status,
            started_by="spotguard/j1/1",
            started_at=T0,
            containers=({"name": "train", "exitCode": 0},) if status == "STOPPED" else (),
            **kw,
        )

    service.on_task_event(event("RUNNING", 2))
    running = store.get("j1")
    stopped = event("STOPPED", 3, stopped_at=T0 + timedelta(hours=2))
    service.on_task_event(stopped)  # the first Lambda
    store.stale = running
    service.on_task_event(stopped)  # the second, which read the job before the first wrote it
    job = store.get("j1")
    assert job.state is JobState.SUCCEEDED and job.attempts[0].outcome == "succeeded"
    out = capsys.readouterr().out
    assert out.count('"GpuHours":[') == 1 and '"GpuHours":[2.0]' in out  # 2 h x 1 GPU, once


# ------------------------------------------------------------------------------------------- outbox
def _notifying(message: str = "attempt 1: spot interruption"):
    """A transition that writes the job and one notification."""
    from spotguard.domain.jobs.effects import Notify
    from spotguard.domain.jobs.model import bump

    return lambda j: Step(
        job=bump(j, T0, last_reason=message), effects=[Notify(kind="interrupted", message=message)]
    )


def test_a_notification_goes_out_once_though_another_lambda_reads_the_job_while_it_is_sent():
    """The writer holds what it wrote: a second Lambda flushing the job during the send (a status call,
    another event of the job) leaves it alone, and it is sent once, then taken out of the outbox."""
    store = FakeJobStore()
    store.jobs["j1"] = _job(state=JobState.RUNNING)
    engine, notifier, _ = _engine(store, FakeJobEcs())
    seen_meanwhile: list[int] = []
    send = notifier.send_all

    def send_while_another_reads(notifications):
        if not seen_meanwhile:
            seen_meanwhile.append(len(store.jobs["j1"].outbox))
            engine.flush(store.get("j1"))  # the other Lambda, in the middle of this send
        send(notifications)

    notifier.send_all = send_while_another_reads
    engine.run("j1", _notifying(), drive=False)
    assert seen_meanwhile == [1] and [n.kind for n in notifier.sent] == ["interrupted"]
    assert store.jobs["j1"].outbox == []


def test_a_failed_send_lets_go_of_its_notifications_and_the_retry_sends_them_at_once():
    store = FakeJobStore()
    store.jobs["j1"] = _job(state=JobState.RUNNING)
    engine, notifier, _ = _engine(store, FakeJobEcs())
    send = notifier.send_all
    notifier.send_all = lambda notifications: (_ for _ in ()).throw(RuntimeError("SNS: throttled"))
    with pytest.raises(RuntimeError):
        engine.run("j1", _notifying(), drive=False)
    (left,) = store.jobs["j1"].outbox
    assert left.sending_until is None  # nobody holds it
    notifier.send_all = send
    engine.drive("j1")  # the event's retry, a second later: the same clock
    assert [n.id for n in notifier.sent] == [left.id] and store.jobs["j1"].outbox == []


def test_a_leftover_of_a_sender_that_died_is_sent_once_its_hold_runs_out_by_one_of_two_readers():
    from spotguard.usecases.jobs.engine import OUTBOX_HOLD_SECONDS

    store = FakeJobStore()
    store.jobs["j1"] = _job(state=JobState.RUNNING)
    engine, notifier, _ = _engine(store, FakeJobEcs())
    notifier.send_all = lambda notifications: (_ for _ in ()).throw(SystemExit("the function timed out"))
    with pytest.raises(SystemExit):  # died in its send: it could not let go
        engine.run("j1", _notifying(), drive=False)
    (left,) = store.jobs["j1"].outbox
    assert left.sending_until == T0 + timedelta(seconds=OUTBOX_HOLD_SECONDS)
    sent: list = []
    engine.notifier.send_all = sent.extend
    engine.flush(store.get("j1"))  # within the hold: left to the sender
    assert sent == [] and len(store.jobs["j1"].outbox) == 1

    engine.clock = lambda: T0 + timedelta(seconds=OUTBOX_HOLD_SECONDS)
    first = True

    def second_reader_meanwhile(notifications):
        nonlocal first
        if first:
            first = False
            engine.flush(store.get("j1"))  # claimed by the first reader: nothing for this one
        sent.extend(notifications)

    engine.notifier.send_all = second_reader_meanwhile
    engine.flush(store.get("j1"))
    assert [n.id for n in sent] == [left.id] and store.jobs["j1"].outbox == []


class _LostAnswer(FakeJobStore):
    """The first replace() goes through but its answer is lost: botocore sends it again, and the second
    try meets the first (a condition that no longer holds)."""

    def __init__(self) -> None:
        super().__init__()
        self.lost = 1

    def replace(self, job: Job, expected_rev: int) -> bool:
        if self.lost and super().replace(job, expected_rev):
            self.lost -= 1
            return False
        return super().replace(job, expected_rev)


def test_a_write_whose_answer_was_lost_sends_its_own_notifications_at_once():
    store = _LostAnswer()
    store.jobs["j1"] = _job(state=JobState.RUNNING)
    engine, notifier, _ = _engine(store, FakeJobEcs())
    engine.run("j1", _notifying(), drive=False)
    assert [n.kind for n in notifier.sent] == ["interrupted"] and store.jobs["j1"].outbox == []


def test_a_write_whose_answer_was_lost_carries_out_its_effects_and_is_watched_once():
    """No notification to recognise it by: the job's own `written_by` says the write was this one."""
    from spotguard.domain.jobs.effects import Stop
    from spotguard.domain.jobs.model import bump

    store = _LostAnswer()
    store.jobs["j1"] = _job(state=JobState.RUNNING)
    engine, _, _ = _engine(store, FakeJobEcs())
    watched: list[tuple[int, int]] = []
    engine.on_written = [lambda old, new: watched.append((old.rev, new.rev))]
    stop = Stop(cluster=CLUSTER, task_arn=TASK + "9" * 32, reason="SpotGuard: moving job j1")
    engine.run("j1", lambda j: Step(job=bump(j, T0, last_reason="moving"), effects=[stop]), drive=False)
    assert engine.ecs.stops == [(stop.task_arn, stop.reason)] and watched == [(0, 1)]


def test_legacy_outbox_items_without_a_holder_are_sent_by_the_next_reader():
    from spotguard.domain.jobs.model import OutboxItem

    store = FakeJobStore()
    legacy = OutboxItem(id="j1:4:0", kind="succeeded", message="m", at=T0)  # written before holds
    store.jobs["j1"] = _job(state=JobState.SUCCEEDED, outbox=[legacy])
    engine, notifier, _ = _engine(store, FakeJobEcs())
    engine.drive("j1")
    assert [n.id for n in notifier.sent] == ["j1:4:0"] and store.jobs["j1"].outbox == []


def test_a_claim_that_keeps_losing_still_sends_the_writers_own_notifications():
    """Other writers keep changing the job: the leftover is left for the next reader, but what this
    write holds goes out now, not 30 s later."""
    from spotguard.domain.jobs.model import OutboxItem

    store = FakeJobStore(conflicts=100)
    own = OutboxItem(id="j1:5:0", kind="interrupted", message="m", at=T0, held_by="mine", sending_until=T0)
    left = OutboxItem(id="j1:3:0", kind="waiting", message="m", at=T0, held_by="dead", sending_until=T0)
    store.jobs["j1"] = _job(state=JobState.RUNNING, outbox=[left, own])
    engine, notifier, _ = _engine(store, FakeJobEcs())
    engine.flush(store.get("j1"), held_by="mine")
    assert [n.id for n in notifier.sent] == ["j1:5:0"]


def test_a_failed_send_lets_go_only_of_what_it_held():
    """A send slower than the hold: another Lambda claimed the same item meanwhile. The first one's
    failure must not clear the second's hold (a third reader would send it a third time)."""
    from spotguard.domain.jobs.model import OutboxItem

    store = FakeJobStore()
    item = OutboxItem(id="j1:5:0", kind="interrupted", message="m", at=T0, held_by="slow", sending_until=T0)
    store.jobs["j1"] = _job(state=JobState.RUNNING, outbox=[item])
    engine, notifier, _ = _engine(store, FakeJobEcs())
    later = T0 + timedelta(seconds=31)

    def slow_then_fails(notifications):
        held = revised(item, held_by="second", sending_until=later + timedelta(seconds=30))
        store.jobs["j1"] = revised(store.jobs["j1"], outbox=[held], rev=store.jobs["j1"].rev + 1)
        raise RuntimeError("SNS: timed out")

    notifier.send_all = slow_then_fails
    with pytest.raises(RuntimeError):
        engine.flush(store.get("j1"), held_by="slow")
    (still,) = store.jobs["j1"].outbox
    assert still.held_by == "second" and still.sending_until is not None
