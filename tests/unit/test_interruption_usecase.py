"""The interruption use case with in-memory fakes of its ports (the ledger's: tests/fakes.py): what it
does, and that it is safe to repeat."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from spotguard.domain.interruption.notices import (
    ContainerInstanceUpdate,
    LifecycleRef,
    Notice,
    NoticeInProgress,
    NoticeKind,
    RebalanceMode,
    Settings,
)
from spotguard.domain.tasks import ContainerInstanceRef, ManageMode, TaskInfo
from spotguard.usecases.interruption import InterruptionConfig, InterruptionService, stop_reason
from tests.fakes import FakeEcs, FakeFollowUps, FakeLedger, FakeLifecycle, FakeSignaller

T0 = datetime(2026, 11, 21, 14, 46, 3, tzinfo=UTC)
CLUSTER = "arn:aws:ecs:us-west-2:123456789012:cluster/gpu-spot"
CI = "arn:aws:ecs:us-west-2:123456789012:container-instance/gpu-spot/b54a2a04046f4f5f8b7d1c0e9a6f3d21"
HOST = "i-0b662ef9931388ba0"


def task(n: int, **kw) -> TaskInfo:
    base = dict(
        task_arn=f"arn:aws:ecs:us-west-2:123456789012:task/gpu-spot/{n:032x}",
        cluster_arn=CLUSTER,
        task_definition_arn="td:1",
        container_instance_arn=CI,
        tags={"spotguard:managed": "true"},
        desired_status="RUNNING",
        last_status="RUNNING",
        containers=(("train", None),),
    )
    return TaskInfo(**{**base, **kw})


class Recorder:
    """The signaller's, the lifecycle's and the follow-ups' fakes (tests/fakes.py), in one log of calls."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.signaller = FakeSignaller(self.calls)
        self.lifecycle = FakeLifecycle(self.calls)
        self.follow_ups = FakeFollowUps(self.calls)


def notice(kind=NoticeKind.SPOT_INTERRUPTION, event_id="e-1", **kw) -> Notice:
    return Notice(
        kind=kind,
        instance_id=HOST,
        event_id=event_id,
        event_time=T0,
        deadline=T0 + timedelta(seconds=120),
        **kw,
    )


def service(
    tasks,
    *,
    rebalance=RebalanceMode.CHECKPOINT,
    manage=ManageMode.TAGGED,
    indexed=True,
    status="ACTIVE",
    now=T0,
):
    here = ContainerInstanceRef(cluster_arn=CLUSTER, container_instance_arn=CI, instance_id=HOST)
    host = here.model_copy(update={"status": status})
    ecs = FakeEcs(tasks, hosts=[host], definitions={"gpu-td": True, "cpu-td": False})
    ledger, rec = FakeLedger([here] if indexed else []), Recorder()
    clock = {"now": now + timedelta(seconds=1)}
    svc = InterruptionService(
        InterruptionConfig(
            settings=Settings(clusters=("gpu-spot",), rebalance=rebalance),
            manage=manage,
            lifecycle_wait_seconds=600,
        ),
        ecs=ecs,
        signaller=rec.signaller,
        lifecycle=rec.lifecycle,
        follow_ups=rec.follow_ups,
        ledger=ledger,
        clock=lambda: clock["now"],
    )
    return svc, ecs, ledger, rec, clock


@pytest.mark.parametrize("n", [1, 4, 8])
def test_spot_warning_drains_and_stops_every_managed_task_once(n):
    tasks = [task(i) for i in range(n)] + [task(99, tags={})]  # the last one is not managed
    svc, ecs, _ledger, _rec, _ = service(tasks)
    out = svc.handle(notice())
    assert out.drained and out.signal == "stop"
    assert sorted(out.signalled) == sorted(t.task_arn for t in tasks[:n])
    assert ecs.calls.count("stop") == n and ecs.calls.count("drain") == 1
    assert set(ecs.reasons) == {stop_reason(notice())}
    assert "e-1" in ecs.reasons[0] and HOST in ecs.reasons[0]
    assert ecs.tasks[tasks[-1].task_arn].desired_status == "RUNNING"
    assert out.signal_latency_seconds == pytest.approx(1.0)
    assert ecs.calls.count("find") == 0  # the index answered


def test_the_same_notice_again_stops_nothing_more():
    svc, ecs, *_ = service([task(1), task(2)])
    svc.handle(notice())
    svc.handle(notice())
    assert ecs.calls.count("stop") == 2


def test_a_second_source_for_the_same_host_stops_nothing_more():
    svc, ecs, ledger, *_ = service([task(1), task(2)])
    svc.handle(notice())
    # A new task shows up as desired RUNNING (say, forced there); the claim still belongs to the warning.
    ecs.tasks[task(3).task_arn] = task(3)
    out = svc.handle(notice(NoticeKind.INSTANCE_STATE, event_id="e-2", detail="state=shutting-down"))
    assert ecs.calls.count("stop") == 2
    assert out.skipped and "e-1" in out.skipped
    assert len(ledger.notices) == 2


def test_a_failed_stop_is_raised_after_the_others_and_the_retry_finishes_the_job():
    tasks = [task(1), task(2), task(3)]
    svc, ecs, _ledger, _rec, clock = service(tasks)
    ecs.fail_stop.add(tasks[1].task_arn)
    with pytest.raises(RuntimeError):
        svc.handle(notice())
    assert ecs.tasks[tasks[0].task_arn].desired_status == "STOPPED"
    assert ecs.tasks[tasks[2].task_arn].desired_status == "STOPPED"
    clock["now"] += timedelta(seconds=61)  # SQS redelivers after the visibility timeout: the lease ran out
    out = svc.handle(notice())  # same notice, claim is ours
    # the notice's record names every task it stopped, on either try (a lifecycle action waits for all)
    assert out.signalled == [t.task_arn for t in tasks]
    assert ecs.calls.count("stop") == 4  # 3 tries + the one retried; none stopped twice


def test_a_draining_host_is_not_drained_again():
    svc, ecs, ledger, *_ = service([task(1)])
    ledger.index[HOST] = ledger.index[HOST].model_copy(update={"status": "DRAINING"})
    out = svc.handle(notice())
    assert not out.drained and "drain" not in ecs.calls


def test_without_an_index_entry_it_looks_the_host_up_and_remembers_it():
    svc, ecs, ledger, *_ = service([task(1)], indexed=False)
    svc.handle(notice())
    assert ecs.calls.count("find") == 1 and HOST in ledger.index


def test_an_instance_that_is_no_container_instance_is_recorded_and_left_alone():
    svc, ecs, ledger, rec, _ = service([task(1)])
    out = svc.handle(
        Notice(
            kind=NoticeKind.SPOT_INTERRUPTION,
            instance_id="i-0000000000000000a",
            event_id="e",
            event_time=T0,
            deadline=T0,
        )
    )
    assert out.skipped and "no container instance" in out.skipped
    assert ecs.calls == ["find"] and rec.calls == []
    assert out.notice_key in ledger.notices


def test_rebalance_checkpoint_sends_sigusr1_and_keeps_tasks_running():
    svc, ecs, _, rec, _ = service([task(1), task(2, tags={})], rebalance=RebalanceMode.CHECKPOINT)
    out = svc.handle(
        Notice(kind=NoticeKind.REBALANCE, instance_id=HOST, event_id="r", event_time=T0, deadline=None)
    )
    assert out.signal == "SIGUSR1" and out.signalled == [task(1).task_arn]
    assert rec.calls == [("signal", HOST, (task(1).task_arn,), "SIGUSR1")]
    assert "drain" not in ecs.calls and "stop" not in ecs.calls


def test_rebalance_drain_mode_moves_tasks_off_like_an_interruption():
    svc, ecs, *_ = service([task(1)], rebalance=RebalanceMode.DRAIN)
    out = svc.handle(
        Notice(kind=NoticeKind.REBALANCE, instance_id=HOST, event_id="r", event_time=T0, deadline=None)
    )
    assert out.drained and out.signal == "stop" and ecs.calls.count("stop") == 1


def test_all_gpu_mode_also_stops_unmanaged_gpu_tasks():
    tasks = [task(1, tags={}, task_definition_arn="gpu-td"), task(2, tags={}, task_definition_arn="cpu-td")]
    svc, _ecs, *_ = service(tasks, manage=ManageMode.ALL_GPU)
    out = svc.handle(notice())
    assert out.signalled == [tasks[0].task_arn]


LIFECYCLE = LifecycleRef(group="gpu-spot-asg", hook="spotguard-drain", token="tok")


def lifecycle_notice() -> Notice:
    return Notice(
        kind=NoticeKind.LIFECYCLE_TERMINATE,
        instance_id=HOST,
        event_id="l-1",
        event_time=T0,
        deadline=None,
        lifecycle=LIFECYCLE,
    )


def check_notice(holder: str, deadline: datetime, event_id: str = "c-1") -> Notice:
    return Notice(
        kind=NoticeKind.LIFECYCLE_CHECK,
        instance_id=HOST,
        event_id=event_id,
        event_time=T0,
        deadline=deadline,
        lifecycle=LIFECYCLE,
        detail=holder,
    )


def test_lifecycle_with_nothing_to_stop_completes_at_once():
    svc, _, _, rec, _ = service([])
    out = svc.handle(lifecycle_notice())
    assert out.lifecycle == "completed" and ("complete", HOST) in rec.calls


def test_lifecycle_holds_the_instance_with_heartbeats_until_tasks_stop():
    svc, ecs, _, rec, _clock = service([task(1), task(2)])
    n = lifecycle_notice()
    out = svc.handle(n)
    assert out.lifecycle == "waiting" and ecs.calls.count("stop") == 2
    (check,) = [c for c in rec.calls if c[0] == "check"]
    assert check[2] == T0 + timedelta(seconds=600) and check[3] == n.key
    assert ("heartbeat", HOST) in rec.calls and ("complete", HOST) not in rec.calls

    # 20 s later one task is still stopping: heartbeat again and look again later.
    ecs.stopped_arns = {task(1).task_arn}
    rec.calls.clear()
    out = svc.handle(check_notice(n.key, check[2]))
    assert out.lifecycle == "waiting" and out.signalled == [task(2).task_arn]
    assert [c[0] for c in rec.calls] == ["heartbeat", "check"]

    ecs.stopped_arns.add(task(2).task_arn)
    rec.calls.clear()
    out = svc.handle(check_notice(n.key, check[2], "c-2"))
    assert out.lifecycle == "completed" and rec.calls == [("complete", HOST)]


def test_lifecycle_is_completed_when_the_deadline_passes():
    svc, _ecs, _, rec, clock = service([task(1)])
    n = lifecycle_notice()
    svc.handle(n)
    clock["now"] = T0 + timedelta(seconds=601)
    rec.calls.clear()
    out = svc.handle(check_notice(n.key, T0 + timedelta(seconds=600)))
    assert out.lifecycle == "completed" and "deadline passed" in (out.skipped or "")
    assert rec.calls == [("complete", HOST)]


def test_lifecycle_after_a_spot_warning_waits_for_the_warnings_tasks():
    svc, ecs, _, rec, _ = service([task(1)])
    warning = notice()
    svc.handle(warning)
    out = svc.handle(lifecycle_notice())
    assert ecs.calls.count("stop") == 1  # not stopped again
    assert out.lifecycle == "waiting"
    (check,) = [c for c in rec.calls if c[0] == "check"]
    assert check[3] == warning.key  # it waits on the tasks the warning stopped


def test_index_drops_stale_updates():
    svc, *_ = service([])
    upd = dict(cluster_arn=CLUSTER, container_instance_arn=CI, instance_id=HOST, event_id="x", event_time=T0)
    assert svc.index(ContainerInstanceUpdate(status="DRAINING", version=5, **upd))
    assert not svc.index(ContainerInstanceUpdate(status="ACTIVE", version=4, **upd))
    assert not svc.index(ContainerInstanceUpdate(status="ACTIVE", version=5, **upd))


def test_tasks_the_index_knows_are_not_described_and_listing_stays_the_truth():
    known, new, gone = task(1), task(2), task(3)
    svc, ecs, ledger, *_ = service([known, new])
    ledger.task_index = {known.task_arn: known, gone.task_arn: gone}  # `gone` has stopped since
    out = svc.handle(notice())
    assert sorted(out.signalled) == sorted([known.task_arn, new.task_arn])
    assert ecs.calls.count("describe-tasks") == 1  # for `new` only


def test_a_fully_indexed_host_is_not_described_at_all():
    tasks = [task(i) for i in range(8)]
    svc, ecs, ledger, *_ = service(tasks)
    ledger.task_index = {t.task_arn: t for t in tasks}
    svc.handle(notice())
    assert "describe-tasks" not in ecs.calls and ecs.calls.count("stop") == 8


def test_a_lifecycle_action_waits_for_the_tasks_another_notice_is_still_stopping():
    """The spot warning claimed the host and is still stopping its tasks (it has not finished, so its
    notice record names none yet) when the terminate hook arrives: the hook must wait for the tasks the
    claim names, not complete at once and let the instance go mid-checkpoint."""
    tasks = [task(1), task(2)]
    svc, ecs, ledger, rec, _ = service(tasks)
    ledger.claims[HOST] = "spot-interruption:w-1:" + HOST
    ledger.claimed[HOST] = [t.task_arn for t in tasks]
    ledger.claim_cluster[HOST] = CLUSTER
    out = svc.handle(lifecycle_notice())
    assert out.lifecycle == "waiting" and ("complete", HOST) not in rec.calls
    assert ecs.calls.count("stop") == 0  # the warning's notice stops them, not this one


# ------------------------------------------------------------------------- the path's length and its lease
def test_a_warning_reads_once_lists_and_claims_before_the_stops_and_records_after():
    """Four calls before the signals, whatever the number of tasks: the host query, ListTasks and the
    task index side by side, the claim; the drain goes out beside the stops; the record comes last."""
    tasks = [task(i) for i in range(8)]
    svc, ecs, ledger, *_ = service(tasks)
    ledger.task_index = {t.task_arn: t for t in tasks}
    svc.handle(notice())
    assert ledger.calls == ["host", "indexed-tasks", "claim", "finish"]
    assert ecs.calls.count("list") == 1 and ecs.calls.count("stop") == 8 and ecs.calls.count("drain") == 1
    assert "find" not in ecs.calls and "describe-tasks" not in ecs.calls


def test_the_tasks_of_a_host_are_stopped_side_by_side():
    """Every StopTask of a host is in flight at the same time: each waits at a barrier that only opens
    when all of them (and the drain) have arrived, which serial calls would never reach."""
    import threading

    n = 6
    tasks = [task(i) for i in range(n)]
    svc, ecs, *_ = service(tasks)
    barrier = threading.Barrier(n + 1, timeout=5)
    stop, drain = ecs.stop_task, ecs.drain

    def stop_at_barrier(*args):
        barrier.wait()
        stop(*args)

    def drain_at_barrier(ref):
        barrier.wait()
        drain(ref)

    ecs.stop_task, ecs.drain = stop_at_barrier, drain_at_barrier
    out = svc.handle(notice())
    assert out.drained and sorted(out.signalled) == sorted(t.task_arn for t in tasks)
    assert ecs.calls.count("stop") == n


def test_a_notice_handled_already_does_nothing_at_all():
    svc, ecs, ledger, rec, _ = service([task(1), task(2)])
    first = svc.handle(notice())
    ecs.calls.clear()
    ledger.calls.clear()
    again = svc.handle(notice())
    assert again.repeat and not first.repeat and again.model_copy(update={"repeat": False}) == first
    assert ecs.calls == [] and ledger.calls == ["host"] and rec.calls == []


def test_a_host_claimed_by_another_notice_is_not_listed():
    """The host query shows the claim: the later notice neither lists the host's tasks nor claims."""
    svc, ecs, ledger, *_ = service([task(1), task(2)])
    svc.handle(notice())
    ecs.calls.clear()
    ledger.calls.clear()
    out = svc.handle(notice(NoticeKind.INSTANCE_STATE, event_id="e-2", detail="state=shutting-down"))
    assert out.skipped and "e-1" in out.skipped
    assert "list" not in ecs.calls and "stop" not in ecs.calls
    assert ledger.calls == ["host", "finish"]


def test_two_copies_of_one_notice_at_once_stop_each_task_once():
    """The second copy lists the tasks before the first has stopped them, then meets the first's lease
    at the claim: it is retried (NoticeInProgress) and stops nothing; its redelivery, after the lease,
    finds the first's outcome."""
    svc, ecs, ledger, _rec, clock = service([task(1), task(2)])
    real_claim = ledger.claim_host
    second: dict[str, object] = {}

    def claim_then_race(*args, **kw):
        result = real_claim(*args, **kw)
        if not second:  # the first copy holds the claim; the second runs now, up to its own claim
            try:
                second["out"] = svc.handle(notice())
            except NoticeInProgress as exc:
                second["error"] = exc
        return result

    ledger.claim_host = claim_then_race
    first = svc.handle(notice())
    assert isinstance(second.get("error"), NoticeInProgress)
    assert ecs.calls.count("stop") == 2
    ledger.claim_host = real_claim
    clock["now"] += timedelta(seconds=61)
    assert svc.handle(notice()) == first.model_copy(update={"repeat": True})
    assert ecs.calls.count("stop") == 2


def test_a_try_that_died_after_claiming_is_taken_over_once_its_lease_runs_out():
    svc, ecs, _ledger, _rec, clock = service([task(1), task(2)])
    ecs.stop_task = lambda *a: (_ for _ in ()).throw(SystemExit("the function timed out"))
    with pytest.raises(SystemExit):
        svc.handle(notice(), lease_seconds=5)
    del ecs.stop_task  # the class's own again
    clock["now"] += timedelta(seconds=2)
    with pytest.raises(NoticeInProgress):  # within the dead try's lease: retried later
        svc.handle(notice())
    clock["now"] += timedelta(seconds=4)
    out = svc.handle(notice())
    assert sorted(out.signalled) == sorted([task(1).task_arn, task(2).task_arn])
    assert ecs.calls.count("stop") == 2


def test_two_copies_of_a_rebalance_recommendation_signal_once():
    svc, _ecs, ledger, rec, _ = service([task(1)], rebalance=RebalanceMode.CHECKPOINT)
    n = Notice(kind=NoticeKind.REBALANCE, instance_id=HOST, event_id="r", event_time=T0, deadline=None)
    ledger.leases[n.key] = ("another-try", T0 + timedelta(seconds=30))
    with pytest.raises(NoticeInProgress):
        svc.handle(n)
    assert rec.calls == []
    del ledger.leases[n.key]
    svc.handle(n)
    svc.handle(n)
    assert [c[0] for c in rec.calls] == ["signal"]


# ----------------------------------------------------------------------- rebalances on the pools
class FakePoolFacts:
    """The pools' side (usecases.pools.PoolRebalanceFacts): logs each call into `log`, fails when told."""

    def __init__(self, log: list, fail: Exception | None = None) -> None:
        self.log, self.fail = log, fail

    def record_rebalance(self, ref, instance_id, at):
        self.log.append(("pool-fact", ref.container_instance_arn, instance_id, at))
        if self.fail is not None:
            raise self.fail
        return ["gpu-spot-a/g5.xlarge/us-east-1a"]


def rebalance(event_id="r") -> Notice:
    return Notice(
        kind=NoticeKind.REBALANCE, instance_id=HOST, event_id=event_id, event_time=T0, deadline=None
    )


def test_a_rebalance_recommendation_is_kept_on_the_host_s_pool_after_the_signal():
    svc, _ecs, ledger, rec, _ = service([task(1)], rebalance=RebalanceMode.CHECKPOINT)
    svc.pool_facts = FakePoolFacts(rec.calls)
    out = svc.handle(rebalance())
    assert [c[0] for c in rec.calls] == ["signal", "pool-fact"]
    # the event's time and the instance: a redelivery is the same fact
    assert rec.calls[1] == ("pool-fact", CI, HOST, T0)
    assert out.pool_facts == ["gpu-spot-a/g5.xlarge/us-east-1a"] and out.pool_fact_error is None
    assert ledger.notices[out.notice_key]["pool_facts"] == out.pool_facts
    svc.handle(rebalance())  # the same notice again: its outcome, nothing done twice
    assert [c[0] for c in rec.calls] == ["signal", "pool-fact"]


def test_a_rebalance_on_a_host_with_no_managed_task_is_kept_on_its_pool_too():
    svc, *_rest = service([task(1, tags={})], rebalance=RebalanceMode.CHECKPOINT)
    log: list = []
    svc.pool_facts = FakePoolFacts(log)
    out = svc.handle(rebalance())
    assert out.skipped == "no managed task on this instance" and [c[0] for c in log] == ["pool-fact"]


def test_in_drain_mode_the_rebalance_is_kept_after_the_stops_and_the_drain():
    svc, ecs, *_ = service([task(1), task(2)], rebalance=RebalanceMode.DRAIN)
    svc.pool_facts = FakePoolFacts(ecs.calls)
    out = svc.handle(rebalance())
    assert ecs.calls[-1][0] == "pool-fact" and ecs.calls.count("stop") == 2 and out.drained
    assert out.pool_facts == ["gpu-spot-a/g5.xlarge/us-east-1a"]


def test_a_pool_fact_that_cannot_be_kept_fails_nothing():
    svc, _ecs, ledger, rec, _ = service([task(1)], rebalance=RebalanceMode.CHECKPOINT)
    svc.pool_facts = FakePoolFacts(rec.calls, fail=RuntimeError("ProvisionedThroughputExceededException"))
    out = svc.handle(rebalance())
    assert out.signal == "SIGUSR1" and out.signalled == [task(1).task_arn]
    assert out.pool_facts == [] and "ProvisionedThroughputExceeded" in (out.pool_fact_error or "")
    assert ledger.notices[out.notice_key]["pool_fact_error"] == out.pool_fact_error  # handled, recorded


@pytest.mark.parametrize("kind", [NoticeKind.SPOT_INTERRUPTION, NoticeKind.INSTANCE_STATE, NoticeKind.HEALTH])
def test_no_other_notice_touches_the_pools(kind):
    """A spot warning's path gets no new call (issue 21): the interruption itself is learnt by the jobs
    path, from the attempt it ends."""
    svc, *_rest = service([task(1)])
    log: list = []
    svc.pool_facts = FakePoolFacts(log)
    svc.handle(notice(kind))
    assert log == []


def test_a_notice_delivered_again_is_not_counted_again():
    """HostsDrained, TasksSignalled and SecondsToSignal count what was done: a notice delivered twice
    (at least once) was handled once, and is counted once."""
    from aws_lambda_powertools.metrics import EphemeralMetrics

    from spotguard.adapters.metrics import count_outcome

    svc, *_ = service([task(1), task(2)])
    first, again = svc.handle(notice()), svc.handle(notice())
    counted = EphemeralMetrics(namespace="SpotGuard")
    count_outcome(counted, first)
    assert {"HostsDrained", "TasksSignalled", "SecondsToSignal"} <= set(counted.metric_set)
    not_again = EphemeralMetrics(namespace="SpotGuard")
    count_outcome(not_again, again)
    assert not_again.metric_set == {}
