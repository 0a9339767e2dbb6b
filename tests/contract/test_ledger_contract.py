"""The interruption ledger's contract (DynamoLedger, adapters/ledger.py), the same cases against its fake
(tests/fakes.py FakeLedger) and against the adapter on moto: the container instance index, the stop claim
and its lease, the notice lease and outcome, the task index, and the checkpoints' newest record."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from spotguard.domain.checkpoints import CheckpointRef
from spotguard.domain.interruption.notices import (
    ContainerInstanceUpdate,
    HostClaim,
    HostRecord,
    Notice,
    NoticeInProgress,
    NoticeKind,
)
from spotguard.domain.tasks import ContainerInstanceRef, TaskInfo
from tests.contract.conftest import Side

T0 = datetime(2026, 11, 21, 14, 46, 3, 250000, tzinfo=UTC)
CLUSTER = "arn:aws:ecs:us-east-1:123456789012:cluster/gpu-spot"
OTHER_CLUSTER = "arn:aws:ecs:us-east-1:123456789012:cluster/other"
HOST = "i-0b662ef9931388ba0"
OTHER_HOST = "i-0123456789abcdef0"
CI = "arn:aws:ecs:us-east-1:123456789012:container-instance/gpu-spot/b54a2a04046f4f5f8b7d1c0e9a6f3d21"
CI2 = "arn:aws:ecs:us-east-1:123456789012:container-instance/gpu-spot/00000000000000000000000000000002"
LEASE = timedelta(seconds=60)


def arn(n: int) -> str:
    return f"arn:aws:ecs:us-east-1:123456789012:task/gpu-spot/{n:032x}"


def update(version: int, status: str = "ACTIVE", instance_id: str = HOST) -> ContainerInstanceUpdate:
    return ContainerInstanceUpdate(
        cluster_arn=CLUSTER,
        container_instance_arn=CI,
        instance_id=instance_id,
        status=status,
        version=version,
        event_id=f"ci-{version}",
        event_time=T0,
    )


def notice(event_id: str = "e-1", kind: NoticeKind = NoticeKind.SPOT_INTERRUPTION) -> Notice:
    return Notice(kind=kind, instance_id=HOST, event_id=event_id, event_time=T0, deadline=T0 + LEASE * 2)


def claim(side: Side, key: str, tasks: list[str], owner: str = "try-1", at: datetime = T0):
    return side.ledger.claim_host(HOST, key, at, CLUSTER, tasks, owner, at + LEASE)


def task(n: int, host: str = CI, status: str = "RUNNING") -> TaskInfo:
    return TaskInfo(
        task_arn=arn(n),
        cluster_arn=CLUSTER,
        task_definition_arn="arn:aws:ecs:us-east-1:123456789012:task-definition/train:1",
        container_instance_arn=host,
        tags={"spotguard:managed": "true"},
        last_status=status,
        desired_status="STOPPED" if status == "STOPPED" else "RUNNING",
        containers=(("train", "abc"),),
    )


def ref(sequence: int, prefix: str = "s3://bucket/jobs/j1/") -> CheckpointRef:
    return CheckpointRef(
        prefix_uri=prefix,
        sequence=sequence,
        manifest_uri=f"{prefix}checkpoints/{sequence:010d}/MANIFEST.json",
        step=100 * sequence,
        progress=sequence / 100,
        attempt=1,
        job_id="j1",
        created_at=T0 + timedelta(minutes=sequence),
        total_bytes=2**31 + sequence,
    )


# ---------------------------------------------------------------------------------------- the index
def test_an_instance_the_ledger_has_never_heard_of_has_an_empty_record(side: Side):
    assert side.ledger.host(HOST, notice().key) == HostRecord()
    assert side.ledger.claimed_tasks(HOST) == ("", [])
    assert side.ledger.stop_claim(HOST) is None


def test_the_index_takes_each_newer_event_and_drops_older_and_repeated_ones(side: Side):
    assert side.ledger.index_container_instance(update(5, "ACTIVE"))
    assert not side.ledger.index_container_instance(update(4, "DRAINING"))  # older
    assert not side.ledger.index_container_instance(update(5, "DRAINING"))  # the same version again
    assert side.ledger.host(HOST, "k").container_instance == ContainerInstanceRef(
        cluster_arn=CLUSTER, container_instance_arn=CI, instance_id=HOST, status="ACTIVE"
    )
    assert side.ledger.index_container_instance(update(6, "DRAINING"))
    assert side.ledger.host(HOST, "k").container_instance.status == "DRAINING"
    assert side.ledger.host(OTHER_HOST, "k").container_instance is None


@pytest.mark.parametrize("status", ["DEREGISTERING", "INACTIVE"])
def test_a_container_instance_on_its_way_out_is_no_container_instance(side: Side, status: str):
    side.ledger.index_container_instance(update(1))
    side.ledger.index_container_instance(update(2, status))
    assert side.ledger.host(HOST, "k").container_instance is None
    assert side.ledger.container_instance(HOST) is None


def test_a_lookup_is_remembered_but_never_overwrites_what_an_event_wrote(side: Side):
    found = ContainerInstanceRef(cluster_arn=CLUSTER, container_instance_arn=CI, instance_id=HOST)
    side.ledger.remember_container_instance(found)
    assert side.ledger.container_instance(HOST) == found
    assert not side.ledger.index_container_instance(update(0, "DRAINING"))  # kept as version 0
    assert side.ledger.index_container_instance(update(1, "DRAINING"))  # ECS counts from 1: any event
    side.ledger.remember_container_instance(found)  # a later lookup changes nothing
    assert side.ledger.host(HOST, "k").container_instance.status == "DRAINING"


# ----------------------------------------------------------------------------------- the stop claim
def test_the_first_notice_claims_the_host_and_names_its_tasks(side: Side):
    key = notice().key
    assert claim(side, key, [arn(1), arn(2)]) == (None, [arn(1), arn(2)])
    assert side.ledger.host(HOST, key).claim == HostClaim(
        notice_key=key, cluster_arn=CLUSTER, task_arns=(arn(1), arn(2))
    )
    assert side.ledger.claimed_tasks(HOST) == (CLUSTER, [arn(1), arn(2)])
    assert side.ledger.stop_claim(HOST) == key
    assert side.ledger.stop_claim(OTHER_HOST) is None


def test_another_notice_is_told_who_holds_the_claim_and_which_tasks_whatever_the_lease(side: Side):
    first, second = notice("w-1").key, notice("s-1", NoticeKind.INSTANCE_STATE).key
    claim(side, first, [arn(1)])
    assert claim(side, second, [arn(2)], owner="try-2") == (first, [arn(1)])  # lease live
    later = T0 + LEASE * 3
    assert claim(side, second, [arn(3)], owner="try-3", at=later) == (first, [arn(1)])  # lease run out
    assert side.ledger.claimed_tasks(HOST) == (CLUSTER, [arn(1)])
    assert side.ledger.stop_claim(HOST) == first


def test_a_second_try_of_the_notice_waits_for_a_live_lease_and_takes_over_one_run_out(side: Side):
    key = notice().key
    claim(side, key, [arn(1), arn(2)], owner="try-1")
    with pytest.raises(NoticeInProgress):
        claim(side, key, [arn(3)], owner="try-2", at=T0 + timedelta(seconds=30))
    # A lease is held up to its last millisecond: at lease_until exactly it still holds.
    with pytest.raises(NoticeInProgress):
        claim(side, key, [arn(3)], owner="try-2", at=T0 + LEASE)
    assert side.ledger.claimed_tasks(HOST) == (CLUSTER, [arn(1), arn(2)])  # the refused tries changed nothing
    # Run out: the redelivery's tasks are added to, never replace, what the first try claimed.
    got = claim(side, key, [arn(2), arn(3), arn(3)], owner="try-2", at=T0 + LEASE + timedelta(milliseconds=1))
    assert got == (None, [arn(1), arn(2), arn(3)])
    assert side.ledger.host(HOST, key).claim.task_arns == (arn(1), arn(2), arn(3))


def test_the_try_holding_the_lease_may_claim_again(side: Side):
    key = notice().key
    claim(side, key, [arn(1)], owner="try-1")
    assert claim(side, key, [arn(2)], owner="try-1", at=T0 + timedelta(seconds=1)) == (None, [arn(1), arn(2)])


def test_the_claim_keeps_the_cluster_of_its_latest_try(side: Side):
    key = notice().key
    claim(side, key, [arn(1)])
    later = T0 + LEASE * 2
    got = side.ledger.claim_host(HOST, key, later, OTHER_CLUSTER, [], "try-2", later + LEASE)
    assert got == (None, [arn(1)])
    assert side.ledger.claimed_tasks(HOST) == (OTHER_CLUSTER, [arn(1)])


# ------------------------------------------------------------------------------- notices: lease, record
def test_a_notice_lease_keeps_a_second_copy_out_until_it_runs_out(side: Side):
    n = notice("r-1", NoticeKind.REBALANCE)
    side.ledger.lease_notice(n, "try-1", T0, T0 + LEASE)
    with pytest.raises(NoticeInProgress):
        side.ledger.lease_notice(n, "try-2", T0 + timedelta(seconds=5), T0 + LEASE * 2)
    with pytest.raises(NoticeInProgress):
        side.ledger.lease_notice(n, "try-2", T0 + LEASE, T0 + LEASE * 2)  # held to its last millisecond
    side.ledger.lease_notice(n, "try-1", T0 + timedelta(seconds=5), T0 + LEASE)  # its holder may renew
    side.ledger.lease_notice(n, "try-2", T0 + LEASE * 2, T0 + LEASE * 3)  # run out: taken over
    with pytest.raises(NoticeInProgress):
        side.ledger.lease_notice(n, "try-1", T0 + LEASE * 2, T0 + LEASE * 3)
    # a lease is the notice's own: another notice of the host is not held up
    side.ledger.lease_notice(notice("r-2", NoticeKind.REBALANCE), "try-1", T0, T0 + LEASE)


def test_a_finished_notice_keeps_its_outcome_and_cannot_be_leased_again(side: Side):
    n = notice("r-1", NoticeKind.REBALANCE)
    side.ledger.lease_notice(n, "try-1", T0, T0 + LEASE)
    outcome = {
        "notice_key": n.key,
        "signalled": [arn(1), arn(2)],
        "signal": "SIGUSR1",
        "drained": False,
        "skipped": None,
        "cluster_arn": CLUSTER,
        "pool_facts": ["gpu-spot-a/g5.xlarge/us-east-1a"],
        "latency": {"signal_seconds": 1.25, "tries": 2},
    }
    side.ledger.finish_notice(n, T0 + timedelta(seconds=2), outcome)
    assert side.ledger.host(HOST, n.key).outcome == outcome
    assert side.ledger.host(HOST, notice("r-2").key).outcome is None
    for owner in ("try-1", "try-2"):  # neither its holder nor a later copy, even once the lease ran out
        with pytest.raises(NoticeInProgress):
            side.ledger.lease_notice(n, owner, T0 + LEASE * 5, T0 + LEASE * 6)


def test_an_outcome_is_kept_as_json(side: Side):
    n = notice()
    side.ledger.finish_notice(n, T0, {"signalled": (arn(1),), "at": T0, "count": 3})
    assert side.ledger.host(HOST, n.key).outcome == {"signalled": [arn(1)], "at": str(T0), "count": 3}


def test_a_notice_finished_while_another_holds_the_claim_leaves_the_claim_alone(side: Side):
    warning, state = notice("w-1"), notice("s-1", NoticeKind.INSTANCE_STATE)
    claim(side, warning.key, [arn(1)])
    side.ledger.finish_notice(state, T0, {"skipped": f"claimed by {warning.key}", "signalled": []})
    record = side.ledger.host(HOST, state.key)
    assert record.claim is not None and record.claim.notice_key == warning.key
    assert record.outcome == {"skipped": f"claimed by {warning.key}", "signalled": []}
    assert side.ledger.host(HOST, warning.key).outcome is None  # the warning is not finished


# ------------------------------------------------------------------------------------ the task index
def test_the_task_index_holds_a_hosts_running_tasks_as_their_newest_events_said(side: Side):
    assert side.ledger.indexed_tasks(CI) == {}
    assert side.ledger.index_task(task(1), 3, T0)
    assert side.ledger.index_task(task(2), 1, T0)
    assert side.ledger.index_task(task(3, host=CI2), 1, T0)
    assert not side.ledger.index_task(task(1).model_copy(update={"desired_status": "STOPPED"}), 3, T0)
    assert not side.ledger.index_task(task(1).model_copy(update={"desired_status": "STOPPED"}), 2, T0)
    assert side.ledger.indexed_tasks(CI) == {arn(1): task(1), arn(2): task(2)}
    assert side.ledger.indexed_tasks(CI2) == {arn(3): task(3, host=CI2)}


def test_a_stopped_task_leaves_the_index_and_a_late_running_event_cannot_bring_it_back(side: Side):
    side.ledger.index_task(task(1), 2, T0)
    side.ledger.index_task(task(2), 2, T0)
    assert side.ledger.index_task(task(1, status="STOPPED"), 4, T0)
    assert not side.ledger.index_task(task(1), 3, T0)  # the late RUNNING event, older than the stop
    assert side.ledger.indexed_tasks(CI) == {arn(2): task(2)}


# ------------------------------------------------------------------------------------- checkpoints
def test_the_newest_checkpoint_only_moves_forward(side: Side):
    prefix = ref(1).prefix_uri
    assert side.ledger.newest_checkpoint(prefix) is None
    assert side.ledger.record_checkpoint(ref(2)) == (True, True)
    assert side.ledger.record_checkpoint(ref(1)) == (True, False)  # older: recorded, not the newest
    assert side.ledger.record_checkpoint(ref(2)) == (False, False)  # the same event again: not new
    assert side.ledger.record_checkpoint(ref(1)) == (False, False)
    assert side.ledger.newest_checkpoint(prefix) == ref(2)
    assert side.ledger.record_checkpoint(ref(10)) == (True, True)
    assert side.ledger.newest_checkpoint(prefix) == ref(10)
    # found by listing before its event came (a relaunch looking for it): its event still counts it
    assert side.ledger.record_checkpoint(ref(11), count=False) == (False, True)
    assert side.ledger.record_checkpoint(ref(11)) == (True, False)
    assert side.ledger.record_checkpoint(ref(11)) == (False, False)
    assert side.ledger.newest_checkpoint(prefix) == ref(11)
    assert side.ledger.newest_checkpoint("s3://bucket/jobs/j2/") is None
