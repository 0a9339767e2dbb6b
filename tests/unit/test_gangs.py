"""Multi-node jobs (gangs), the pure part: the gang forms (node 0 first, then the others with its
address), ends once for all its nodes however their events arrive, and is given up whole when it does not
form. Over moto: tests/integration/test_gangs.py."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from spotguard.domain.jobs import gangs
from spotguard.domain.jobs.effects import Launch, LaunchLater, LaunchPeers, Stop
from spotguard.domain.jobs.launches import begin_launch, launch_succeeded
from spotguard.domain.jobs.model import Job, JobState, client_token, revised, started_by
from spotguard.domain.jobs.request import run_task_params
from spotguard.domain.jobs.spend import spend
from spotguard.domain.jobs.submission import JobOptions, RunTaskRequest
from spotguard.domain.jobs.transitions import abandon_provisioning, on_task_event, request_cancel
from spotguard.domain.tasks import TaskEvent

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
CLUSTER = "arn:aws:ecs:us-east-1:123456789012:cluster/gpu-spot"
TASK = "arn:aws:ecs:us-east-1:123456789012:task/gpu-spot/"


def _arn(attempt: int, node: int) -> str:
    return f"{TASK}{attempt:016x}{node:016x}"


def _job(nodes: int = 3, **options) -> Job:
    return Job(
        job_id="g1",
        state=JobState.QUEUED,
        request=RunTaskRequest(cluster="gpu-spot", taskDefinition="train-8gpu:1", launchType="EC2"),
        options=JobOptions(nodes=nodes, **options),
        checkpoint_uri="s3://bucket/jobs/g1/",
        gpus=8,
        containers=["train"],
        created_at=T0,
        updated_at=T0,
    )


def _ev(attempt: int, node: int, version: int, status: str, exit_code: int | None = None, **kw) -> TaskEvent:
    containers = ({"name": "train", "exitCode": exit_code},) if status == "STOPPED" else ({"name": "train"},)
    return TaskEvent(
        task_arn=_arn(attempt, node),
        cluster_arn=CLUSTER,
        version=version,
        last_status=status,
        desired_status="STOPPED" if status == "STOPPED" else "RUNNING",
        started_by=started_by("g1", attempt, node),
        containers=containers,
        **kw,
    )


def _apply(job: Job, ev: TaskEvent, notice: str | None = None, at: datetime = T0):
    step = on_task_event(job, ev, notice, at)
    return (step.job or job), step


def _formed(nodes: int = 3, attempt: int = 1) -> Job:
    """A gang whose every node runs (node 0 with its address, then the others launched and running)."""
    job = _job(nodes)
    job = begin_launch(job, T0).job
    job = launch_succeeded(job, _arn(attempt, 0), "tok", "", T0, resubmitted=False).job
    job, step = _apply(job, _ev(attempt, 0, 2, "RUNNING", private_ip="10.0.0.5"))
    assert step.effects == [LaunchPeers(attempt=attempt)]
    for k in range(1, nodes):
        token = client_token("g1", attempt, 0, k)
        job = gangs.peer_launched(job, attempt, k, _arn(attempt, k), token, T0).job
    for k in range(1, nodes):
        job, _ = _apply(job, _ev(attempt, k, 2, "RUNNING"))
    return job


def test_node_0_runs_first_then_the_others_are_launched_and_the_gang_forms():
    job = _job(3)
    job = begin_launch(job, T0).job
    job = launch_succeeded(job, _arn(1, 0), "tok", "", T0, resubmitted=False).job
    live = job.live_attempt
    assert live is not None and live.nodes == 3 and live.gang and not live.formed
    job, step = _apply(job, _ev(1, 0, 1, "PENDING"))
    assert step.effects == []  # not running yet: no address to give the others
    job, step = _apply(job, _ev(1, 0, 2, "RUNNING", private_ip="10.0.0.5"))
    assert step.effects == [LaunchPeers(attempt=1)]
    assert gangs.rendezvous(job.attempts[-1]) == "10.0.0.5"
    assert gangs.missing_nodes(job.attempts[-1]) == [1, 2]
    job = _formed(3)
    assert job.attempts[-1].formed and "all 3 nodes" in job.last_reason


def test_every_node_gets_its_rank_the_count_and_node_0s_address():
    job = _formed(2)
    launch = Launch(attempt=1, client_token="t")
    first = run_task_params(job, launch, "", T0)
    second = run_task_params(job, launch, "", T0, node=1, rendezvous="10.0.0.5", beside=["i-0aaa"])

    def env(params) -> dict[str, str]:
        (c,) = params["overrides"]["containerOverrides"]
        return {e["name"]: e["value"] for e in c["environment"]}

    e0, e1 = env(first), env(second)
    assert (e0["SPOTGUARD_NODE_RANK"], e0["PET_NODE_RANK"], e0["PET_NNODES"]) == ("0", "0", "2")
    assert "PET_MASTER_ADDR" not in e0  # node 0 hosts the rendezvous
    assert e1["PET_MASTER_ADDR"] == "10.0.0.5" and e1["PET_MASTER_PORT"] == "29500"
    assert e1["SPOTGUARD_RENDEZVOUS"] == "10.0.0.5:29500" and e1["SPOTGUARD_NODES"] == "2"
    assert first["startedBy"] == "spotguard/g1/1" and second["startedBy"] == "spotguard/g1/1/1"
    assert {"key": "spotguard:node", "value": "1"} in second["tags"]
    assert {"type": "memberOf", "expression": "ec2InstanceId !in [i-0aaa]"} in second["placementConstraints"]
    # one node: nothing of the gang's
    single = _job(1)
    (c,) = run_task_params(single, launch, "", T0)["overrides"]["containerOverrides"]
    assert not {e["name"] for e in c["environment"]} & {"SPOTGUARD_NODES", "PET_NNODES"}


def test_a_peer_seen_before_its_runtask_answer_is_bound_to_its_node():
    job = _job(2)
    job = begin_launch(job, T0).job
    job = launch_succeeded(job, _arn(1, 0), "tok", "", T0, resubmitted=False).job
    job, _ = _apply(job, _ev(1, 0, 2, "RUNNING", private_ip="10.0.0.5"))
    job, step = _apply(job, _ev(1, 1, 2, "RUNNING"))
    assert [t.node for t in job.attempts[-1].tasks] == [0, 1] and job.attempts[-1].formed
    assert not any(isinstance(e, Stop) for e in step.effects)
    # the RunTask answer written after: already there
    assert gangs.peer_launched(job, 1, 1, _arn(1, 1), "t", T0).job is None


def _stop_all(
    job: Job, order: list[tuple[int, int | None, str | None]], version: int = 3
) -> tuple[Job, list]:
    effects: list = []
    for node, code, notice in order:
        job, step = _apply(job, _ev(1, node, version, "STOPPED", code), notice)
        effects += step.effects
    return job, effects


@pytest.mark.parametrize("seed", range(6))
def test_a_warned_node_checkpoints_with_the_others_and_the_gang_is_relaunched_once(seed):
    """Node 1's instance is warned (SpotGuard stopped it for the notice); every node exits 75 on the one
    checkpoint. Whatever the order of the three STOPPED events, repeated: one relaunch, after the last."""
    job = _formed(3)
    stopped = [(0, 75, None), (1, 75, "spot-interruption:i-1"), (2, 75, None)]
    events = stopped * 2
    random.Random(seed).shuffle(events)
    relaunches = 0
    for node, code, notice in events:
        before = job.state
        job, step = _apply(job, _ev(1, node, 3, "STOPPED", code), notice)
        assert not any(isinstance(e, Stop) for e in step.effects)  # they agreed: nobody is cut
        relaunches += before is JobState.RUNNING and job.state is JobState.QUEUED
    assert relaunches == 1 and job.state is JobState.QUEUED
    a = job.attempts[-1]
    assert a.outcome == "resubmit" and a.outcome_reason.startswith("node ")
    assert job.attempts_used == 1


def test_a_node_lost_without_a_notice_stops_the_others_and_one_relaunch_follows():
    job = _formed(3)
    job, step = _apply(
        job, _ev(1, 2, 3, "STOPPED", 137, stopped_reason="Host EC2 (instance i-0abc) terminated.")
    )
    stops = [e for e in step.effects if isinstance(e, Stop)]
    assert {s.task_arn for s in stops} == {_arn(1, 0), _arn(1, 1)}
    assert all(s.reason.startswith(gangs.GANG_STOP_PREFIX) for s in stops)
    assert job.state is JobState.RUNNING  # until every node has stopped
    # the others, stopped by SpotGuard (their exit says nothing of their own: 143)
    job, step = _apply(job, _ev(1, 0, 3, "STOPPED", 143, stopped_reason=stops[0].reason))
    assert step.effects == [] and job.state is JobState.RUNNING
    job, step = _apply(job, _ev(1, 1, 3, "STOPPED", 143, stopped_reason=stops[1].reason))
    assert job.state is JobState.QUEUED
    a = job.attempts[-1]
    assert a.outcome == "resubmit" and "host went away" in a.outcome_reason
    assert [t.node for t in gangs.lost_nodes(a)] == [2]


def test_a_failure_of_one_node_fails_the_job_when_no_node_was_interrupted():
    job = _formed(2)
    job, step = _apply(job, _ev(1, 1, 3, "STOPPED", 1, stopped_reason="Essential container in task exited"))
    (stop,) = [e for e in step.effects if isinstance(e, Stop)]
    job, _ = _apply(job, _ev(1, 0, 3, "STOPPED", 143, stopped_reason=stop.reason))
    assert job.state is JobState.FAILED and job.attempts[-1].outcome_reason.startswith("node 1: exit 1")


def test_the_gang_succeeds_when_every_node_exits_0():
    job = _formed(2)
    job, _ = _stop_all(job, [(1, 0, None)])
    assert job.state is JobState.RUNNING
    job, _ = _stop_all(job, [(0, 0, None)])
    assert job.state is JobState.SUCCEEDED


def test_cancel_stops_every_node():
    job = _formed(3)
    step = request_cancel(job, T0, "no longer needed")
    assert {e.task_arn for e in step.effects if isinstance(e, Stop)} == {_arn(1, k) for k in range(3)}


def test_a_cancels_stop_is_recorded_and_asked_again_while_a_task_still_runs():
    """Issue 45, item 1: the cancel recorded no stop, so a StopTask that failed was never asked again (a
    one-node job's: tests/integration/test_gangs.py)."""
    nodes = 3
    job = request_cancel(_formed(nodes), T0, "no longer needed").job
    assert job is not None and job.attempts[-1].gang_stopped_at == T0
    assert gangs.stop_again(job, T0 + timedelta(seconds=gangs.STOP_RETRY_SECONDS)).effects == []
    later = T0 + timedelta(seconds=gangs.STOP_RETRY_SECONDS + 1)
    step = gangs.stop_again(job, later)
    assert {e.task_arn for e in step.effects if isinstance(e, Stop)} == {_arn(1, k) for k in range(nodes)}
    assert all(e.reason == "SpotGuard: cancelled job g1" for e in step.effects if isinstance(e, Stop))
    assert step.job is not None and step.job.attempts[-1].gang_stopped_at == later  # once a retry bound
    assert gangs.stop_again(step.job, later).effects == []


def test_a_gang_that_does_not_form_is_stopped_whole_and_launched_again_without_counting():
    job = _job(3)
    job = begin_launch(job, T0).job
    job = launch_succeeded(job, _arn(1, 0), "tok", "", T0, resubmitted=False).job
    job, _ = _apply(job, _ev(1, 0, 2, "RUNNING", private_ip="10.0.0.5"))
    job = gangs.peer_launched(job, 1, 1, _arn(1, 1), "t", T0).job  # node 2's RunTask placed nothing
    late = abandon_provisioning(job, 2, "1 of 3 nodes running after 700 s", T0 + timedelta(seconds=700))
    assert late.job is None and late.effects == []  # asked about another attempt: this one is left alone
    assert gangs.abandon_gang(job, 2, "x", T0).effects == []
    step = abandon_provisioning(job, 1, "1 of 3 nodes running after 700 s", T0 + timedelta(seconds=700))
    assert {e.task_arn for e in step.effects if isinstance(e, Stop)} == {_arn(1, 0), _arn(1, 1)}
    job = step.job
    # a node launched meanwhile is not taken
    late = gangs.peer_launched(job, 1, 2, _arn(1, 2), "t", T0)
    assert late.job is None and isinstance(late.effects[0], Stop)
    job, effects = _stop_all(job, [(1, None, None), (0, 143, None)])
    assert job.state is JobState.QUEUED and job.attempts[-1].abandoned
    assert job.attempts_used == 0  # a gang that never ran costs no attempt
    # tried again later, not at once: a wait that grows with each gang in a row that did not form
    assert LaunchLater(launch_try=0, delay_seconds=30) in effects and job.retry_at is not None


def test_stragglers_are_stopped_after_the_bound():
    job = _formed(2)
    job, _ = _stop_all(job, [(0, 75, None)])
    assert gangs.stragglers(job, T0 + timedelta(seconds=60)).effects == []
    later = T0 + timedelta(seconds=gangs.STRAGGLER_SECONDS + 1)
    (stop,) = gangs.stragglers(job, later).effects
    assert stop.task_arn == _arn(1, 1)


def test_spend_counts_every_node():
    job = _formed(2)
    job, _ = _stop_all(job, [])
    one = on_task_event(job, _ev(1, 0, 3, "RUNNING", started_at=T0), None, T0)
    job = one.job or job
    job = on_task_event(job, _ev(1, 1, 3, "RUNNING", started_at=T0), None, T0).job or job
    s = spend(job, {}, T0 + timedelta(hours=1))
    assert s.gpu_hours == 16.0  # two nodes of 8 GPUs for an hour


def test_a_node_stopped_for_its_instance_stops_every_other_node_once():
    job = _formed(3)
    warned = "SpotGuard: spot-interruption i-0bbb (event e-1)"
    ev = _ev(1, 1, 3, "RUNNING", stopped_reason=warned)
    ev = ev.model_copy(update={"desired_status": "STOPPED"})
    job, step = _apply(job, ev)
    stops = [e for e in step.effects if isinstance(e, Stop)]
    assert {s.task_arn for s in stops} == {_arn(1, 0), _arn(1, 2)}
    assert "node 1's instance is going" in stops[0].reason
    again = ev.model_copy(update={"version": 4})
    job, step = _apply(job, again)
    assert step.effects == []  # asked once
    # then all stop on the one checkpoint: the attempt ends once, the warned node's instance avoided
    job, _ = _stop_all(job, [(0, 75, None), (2, 75, None), (1, 75, "spot-interruption:i-0bbb")], version=5)
    assert job.state is JobState.QUEUED and job.attempts[-1].outcome == "resubmit"


def test_old_gangs_are_folded_so_the_ledger_item_stays_small_and_spend_still_counts_them():
    """A 64-node gang interrupted twelve times: the job's JSON stays far below DynamoDB's 400 KB, the
    newest gang keeps every node until the next one runs, and spend counts the folded nodes over node 0's
    time (the worst case the door accepts: tests/contract/test_ledger_item_bound.py)."""
    job = _job(64)
    for n in range(1, 13):
        job = begin_launch(job, T0).job
        job = launch_succeeded(job, _arn(n, 0), "tok", "", T0, resubmitted=n > 1).job
        job, _ = _apply(job, _ev(n, 0, 2, "RUNNING", private_ip="10.0.0.5", started_at=T0))
        for k in range(1, 64):
            job = gangs.peer_launched(job, n, k, _arn(n, k), client_token("g1", n, 0, k), T0).job
            job, _ = _apply(job, _ev(n, k, 2, "RUNNING", started_at=T0))
            job = job.model_copy(
                update={
                    "attempts": [
                        *job.attempts[:-1],
                        job.attempts[-1].with_node(
                            job.attempts[-1].peers[-1].model_copy(update={"price_per_hour": 1.0})
                        ),
                    ]
                }
            )
        job = job.model_copy(
            update={
                "attempts": [*job.attempts[:-1], job.attempts[-1].model_copy(update={"price_per_hour": 1.0})]
            }
        )
        hour = T0 + timedelta(hours=1)
        for k in range(64):
            reason = "Host EC2 (instance i-0abc) terminated." if k == 1 else None
            job, _ = _apply(job, _ev(n, k, 3, "STOPPED", 75, stopped_at=hour, stopped_reason=reason))
        assert job.state is JobState.QUEUED
    assert len(job.model_dump_json()) < 200_000
    whole = [a.number for a in job.attempts if a.peers]
    assert whole == [12] and job.attempts[0].folded_peers == 63
    s = spend(job, {}, T0 + timedelta(hours=2))
    assert s.gpu_hours == 12 * 64 * 8 and s.dollars == 12 * 64


def test_the_spend_metric_counts_a_gang_once_when_its_last_node_has_stopped(capsys):
    from spotguard.adapters.job_metrics import SpendMeter
    from tests.fakes import FakeJobStore

    job = _formed(2)
    hour = T0 + timedelta(hours=1)
    for k in range(2):
        job = on_task_event(job, _ev(1, k, 3, "RUNNING", started_at=T0), None, T0).job or job
    meter = SpendMeter(FakeJobStore())
    first, _ = _apply(job, _ev(1, 0, 4, "STOPPED", 75, stopped_at=hour))
    meter(job, first)
    assert "GpuHours" not in capsys.readouterr().out  # node 1 still runs
    last, _ = _apply(first, _ev(1, 1, 4, "STOPPED", 75, stopped_at=hour))
    meter(first, last)
    meter(last, last)  # the same change seen again: counted once
    out = capsys.readouterr().out
    assert out.count('"GpuHours":[') == 1 and '"GpuHours":[16.0]' in out  # one record, both nodes


def test_a_gang_whose_nodes_finished_but_one_that_hung_succeeds_once_that_one_is_stopped():
    job = _formed(2)
    job, _ = _stop_all(job, [(0, 0, None)])  # node 0 finished; node 1 never exits
    (stop,) = gangs.stragglers(job, T0 + timedelta(seconds=gangs.STRAGGLER_SECONDS + 1)).effects
    job, _ = _apply(job, _ev(1, 1, 3, "STOPPED", 143, stopped_reason=stop.reason))
    assert job.state is JobState.SUCCEEDED


def test_a_gang_stop_that_did_not_take_is_asked_again_by_reconcile():
    job = _formed(3)
    job, step = _apply(
        job, _ev(1, 2, 3, "STOPPED", 137, stopped_reason="Host EC2 (instance i-0abc) terminated.")
    )
    assert len(step.effects) == 2  # the StopTasks that may be lost after the write
    assert gangs.stop_again(job, T0 + timedelta(seconds=60)).effects == []
    later = T0 + timedelta(seconds=gangs.STOP_RETRY_SECONDS + 1)
    again = gangs.stop_again(job, later)
    assert {e.task_arn for e in again.effects} == {_arn(1, 0), _arn(1, 1)}
    assert gangs.stop_again(again.job, later + timedelta(seconds=60)).effects == []  # paced


def test_a_node_whose_runtask_is_refused_fails_the_job_and_stops_the_gang():
    job = _job(2)
    job = begin_launch(job, T0).job
    job = launch_succeeded(job, _arn(1, 0), "tok", "", T0, resubmitted=False).job
    job, _ = _apply(job, _ev(1, 0, 2, "RUNNING", private_ip="10.0.0.5"))
    step = gangs.peer_refused(job, 1, "node 1: InvalidParameterException: too many constraints", T0)
    assert step.job.state is JobState.FAILED and "RunTask refused" in step.job.last_reason
    assert [e.task_arn for e in step.effects if isinstance(e, Stop)] == [_arn(1, 0)]


def test_a_gang_that_never_forms_gives_up_after_max_attempts_tries_in_a_row():
    job = _job(2, max_attempts=3)
    for n in range(1, 4):
        job = job.model_copy(update={"retry_at": None})
        job = begin_launch(job, T0).job
        job = launch_succeeded(job, _arn(n, 0), "tok", "", T0, resubmitted=n > 1).job
        job = abandon_provisioning(job, job.live_attempt.number, "0 of 2 nodes running after 700 s", T0).job
        job, _ = _apply(job, _ev(n, 0, 3, "STOPPED", 143, stopped_reason="SpotGuard: gang of job g1: x"))
    assert job.state is JobState.GAVE_UP and "did not form in 3 tries in a row" in job.last_reason


def test_node_0_being_stopped_as_it_starts_gets_no_peers():
    job = _job(2)
    job = begin_launch(job, T0).job
    job = launch_succeeded(job, _arn(1, 0), "tok", "", T0, resubmitted=False).job
    ev = _ev(1, 0, 2, "RUNNING", private_ip="10.0.0.5").model_copy(update={"desired_status": "STOPPED"})
    job, step = _apply(job, ev)
    assert not any(isinstance(e, LaunchPeers) for e in step.effects)


def test_torchrun_waits_at_the_rendezvous_longer_than_spotguard_gives_the_gang_and_one_node_keeps_its_pet():
    job = _formed(2)
    (c,) = run_task_params(job, Launch(attempt=1, client_token="t"), "", T0)["overrides"][
        "containerOverrides"
    ]
    env = {e["name"]: e["value"] for e in c["environment"]}
    assert env["PET_RDZV_CONF"] == f"timeout={600 + 900}"  # the formation bound, then reconcile's sweep
    single = _job(1).model_copy(
        update={
            "request": RunTaskRequest(
                cluster="gpu-spot",
                taskDefinition="train-8gpu:1",
                launchType="EC2",
                overrides={
                    "containerOverrides": [
                        {"name": "train", "environment": [{"name": "PET_NNODES", "value": "1"}]}
                    ]
                },
            )
        }
    )
    (c,) = run_task_params(single, Launch(attempt=1, client_token="t"), "", T0)["overrides"][
        "containerOverrides"
    ]
    assert {"name": "PET_NNODES", "value": "1"} in c["environment"]  # a one-node job's own, kept


def test_gangs_that_did_not_form_are_counted_in_a_row_across_the_folded_attempts():
    """The oldest attempts are folded to bound the ledger item (KEEP_ATTEMPTS): a gang that keeps not
    forming must still reach max_attempts in a row and give up, not be tried for ever."""
    from spotguard.domain.jobs.endings import fold_old
    from spotguard.domain.jobs.model import KEEP_ATTEMPTS, FoldedAttempts

    one = _formed(2).attempts[-1]
    attempts = [revised(one, number=n, outcome="resubmit", abandoned="did not form") for n in range(1, 26)]
    kept, folded = fold_old(attempts, FoldedAttempts(), 8, T0)
    assert len(kept) == KEEP_ATTEMPTS and folded.count == 25 - KEEP_ATTEMPTS
    assert folded.unformed_tail == 25 - KEEP_ATTEMPTS
    assert gangs.unformed_in_a_row(kept, folded.unformed_tail) == 25
    # one that formed among the kept ones ends the run
    kept[3] = revised(kept[3], abandoned=None)
    assert gangs.unformed_in_a_row(kept, folded.unformed_tail) == KEEP_ATTEMPTS - 4
