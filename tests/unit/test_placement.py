"""Capacity in the jobs core: what the policy is told about a job, decisions turned into RunTask
placement, waits, moves and provisioning timeouts as transitions, the engine asking its placement, and
the capacity advisor on a fake pool book with the real policy. No AWS."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from spotguard.domain.capacity.decision import PlacementDecision
from spotguard.domain.checkpoints import CheckpointRef
from spotguard.domain.jobs.effects import Checkpoint, Launch, Notify, Stop
from spotguard.domain.jobs.gangs import NOTHING_TO_ABANDON
from spotguard.domain.jobs.launches import begin_launch, launch_succeeded
from spotguard.domain.jobs.model import Attempt, Job, JobState, revised
from spotguard.domain.jobs.placement import DEFAULT_RESTART_HOURS, job_needs, placement_params, progress_rate
from spotguard.domain.jobs.replies import RunResult
from spotguard.domain.jobs.request import run_task_params
from spotguard.domain.jobs.submission import JobOptions, RunTaskRequest
from spotguard.domain.jobs.transitions import (
    abandon_provisioning,
    move_abandoned,
    move_checkpointed,
    on_task_event,
    request_move,
)
from spotguard.domain.pools import Observation, PoolRecord, Refreshed, fold
from spotguard.domain.tasks import TaskEvent
from spotguard.ports import LaunchPlacement
from spotguard.usecases.jobs.advisor import PlacementAdvisor
from tests.fakes import FakeJobEcs, FakeJobStore, FakeSignaller
from tests.unit.test_job_engine import TASK, _engine, _job

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
URI = "s3://bucket/jobs/j1/"


def ref(seq: int, attempt: int, minutes: float, progress: float) -> CheckpointRef:
    return CheckpointRef(
        prefix_uri=URI,
        sequence=seq,
        manifest_uri=f"{URI}checkpoints/{seq:08d}/MANIFEST.json",
        attempt=attempt,
        progress=progress,
        created_at=T0 + timedelta(minutes=minutes),
    )


def spot_decision(**kw) -> PlacementDecision:
    base = {
        "at": T0,
        "placement": "spot",
        "pool": "gpu-spot/g5.xlarge/us-east-1a",
        "capacity_provider": "gpu-spot",
        "instance_type": "g5.xlarge",
        "availability_zone": "us-east-1a",
        "constrain_type": True,
        "constrain_zone": True,
        "reason": "spot: expected to last long enough to pay its restart",
        "expected_cost": 3.5,
    }
    return PlacementDecision(**{**base, **kw})


# ------------------------------------------------------------------------------- what the policy is told
def test_the_rate_is_measured_within_attempts_and_replaces_the_estimate():
    refs = [ref(1, 1, 0, 0.0), ref(2, 1, 30, 0.05), ref(3, 2, 300, 0.06), ref(4, 2, 330, 0.11)]
    assert progress_rate(refs) == pytest.approx(0.1)  # 0.1 of progress in one hour of running
    needs = job_needs(1, refs, [], work_hours=100.0, submitted_at=T0, deadline=None, now=T0)
    assert needs.rate_measured and needs.work_left_hours == pytest.approx(0.89 / 0.1)


def test_before_any_measure_the_estimate_then_the_deadline_then_a_default():
    by_estimate = job_needs(1, [], [], work_hours=10.0, submitted_at=T0, deadline=None, now=T0)
    assert by_estimate.work_left_hours == pytest.approx(10.0) and not by_estimate.rate_measured
    by_deadline = job_needs(1, [], [], None, T0, T0 + timedelta(hours=20), T0)
    assert by_deadline.work_left_hours == pytest.approx(10.0)  # half the time to the deadline
    assert by_deadline.time_left_hours == pytest.approx(20.0)
    assert by_deadline.restart_hours == DEFAULT_RESTART_HOURS and not by_deadline.restart_measured
    assert by_deadline.work_assumed and not by_estimate.work_assumed
    measured = [ref(1, 1, 0, 0.0), ref(2, 1, 30, 0.05)]
    assert not job_needs(1, measured, [], None, T0, T0 + timedelta(hours=20), T0).work_assumed


def test_the_restart_overhead_is_runtask_to_first_commit_less_the_progress_it_made():
    # rate 0.1/h; attempt 2 launched at 280 min, resumed from 0.05, first commit at 300 min with 0.06:
    # 20 minutes elapsed, of which 0.01 / 0.1 h = 6 minutes of work: 14 minutes of restart.
    refs = [ref(1, 1, 0, 0.0), ref(2, 1, 30, 0.05), ref(3, 2, 300, 0.06), ref(4, 2, 330, 0.11)]
    needs = job_needs(1, refs, [(2, T0 + timedelta(minutes=280))], None, T0, None, T0)
    assert needs.restart_measured and needs.restart_hours == pytest.approx(14 / 60)


# --------------------------------------------------------------------------------- RunTask placement
def test_a_decision_places_the_task_with_its_provider_and_pins_type_and_zone_first():
    job = _job(
        placement=spot_decision(),
        avoid_instances=["i-0123456789abcdef0"],
        request=RunTaskRequest(
            cluster="gpu-spot",
            taskDefinition="train:1",
            launchType="EC2",
            placementConstraints=[{"type": "memberOf", "expression": "attribute:gpu == yes"}],
        ),
    )
    params = run_task_params(job, Launch(attempt=1, client_token="t"), "", T0)
    assert "launchType" not in params
    assert params["capacityProviderStrategy"] == [{"capacityProvider": "gpu-spot", "weight": 1, "base": 0}]
    expressions = [c["expression"] for c in params["placementConstraints"]]
    assert expressions[0] == (
        "attribute:ecs.instance-type == g5.xlarge and attribute:ecs.availability-zone == us-east-1a"
    )
    assert expressions[1:] == ["attribute:gpu == yes", "ec2InstanceId !in [i-0123456789abcdef0]"]


def test_a_provider_of_one_type_in_one_zone_needs_no_constraint_and_no_decision_changes_nothing():
    params = {"cluster": "c", "taskDefinition": "t", "launchType": "EC2"}
    one = spot_decision(constrain_type=False, constrain_zone=False)
    assert "placementConstraints" not in placement_params(params, one)
    assert placement_params(params, None) == params
    assert placement_params(params, spot_decision(placement="none", capacity_provider=None)) == params


# -------------------------------------------------------------------------------------- transitions
def test_a_launch_records_its_decision_and_says_it_on_the_bus():
    step = begin_launch(_job(), T0, spot_decision())
    assert step.job is not None and step.job.state is JobState.LAUNCHING
    assert step.job.placement == spot_decision() and step.job.decisions == [spot_decision()]
    kinds = [e.kind for e in step.effects if isinstance(e, Notify)]
    assert kinds == ["decision"] and isinstance(step.effects[-1], Launch)
    started = launch_succeeded(step.job, TASK + "a" * 32, "t", "", T0, resubmitted=False).job
    assert started is not None
    assert (started.attempts[0].pool, started.attempts[0].market) == ("gpu-spot/g5.xlarge/us-east-1a", "spot")


def test_a_wait_keeps_the_job_queued_until_its_recheck_and_is_said_once_per_reason():
    wait = spot_decision(
        placement="none", pool=None, reason="wait: spot is expected back", recheck_seconds=300
    )
    first = begin_launch(_job(), T0, wait)
    assert first.job is not None and first.job.state is JobState.QUEUED
    assert first.job.retry_at == T0 + timedelta(seconds=300) and first.job.launch_tries == 1
    assert {e.kind for e in first.effects if isinstance(e, Notify)} == {"decision", "waiting"}
    later = T0 + timedelta(seconds=301)
    again = begin_launch(first.job, later, revised(wait, at=later))
    assert again.job is not None and again.effects == [] and len(again.job.decisions) == 1
    assert again.job.launch_tries == 2  # the first wait's retry message is stale now


def _running(**kw) -> Job:
    attempt = Attempt(
        number=1,
        task_arn=TASK + "a" * 32,
        launched_at=T0,
        last_status="RUNNING",
        started_at=T0,
        instance_id="i-0123456789abcdef0",
        pool="gpu-spot/g5.xlarge/us-east-1a",
        market="spot",
        ecs_version=2,
    )
    return _job(state=JobState.RUNNING, attempts=[attempt], **kw)


def _stopped(job: Job, reason: str, exit_code: int | None = 75) -> TaskEvent:
    live = job.attempts[-1]
    return TaskEvent(
        task_arn=live.task_arn,
        cluster_arn=job.request.cluster,
        version=live.ecs_version + 1,
        last_status="STOPPED",
        desired_status="STOPPED",
        stopped_reason=reason,
        containers=({"name": "train", "exitCode": exit_code},),
        detail={"containers": [{"name": "train", "exitCode": exit_code}], "stoppedReason": reason},
    )


def test_a_move_checkpoints_first_then_stops_then_relaunches_as_decided_without_an_interruption():
    to = spot_decision(placement="on-demand", pool="gpu-od/g5.xlarge/us-east-1a", trigger="reconcile")
    asked = request_move(_running(), 1, to, T0)
    assert asked.job is not None and asked.job.move is not None
    assert [type(e) for e in asked.effects] == [Notify, Checkpoint]
    assert request_move(asked.job, 1, to, T0).job is None  # one move at a time
    assert request_move(_running(), 2, to, T0).job is None  # decided for another attempt: a stale look
    stopping = _running()
    stopping = revised(
        stopping, attempts=[revised(stopping.attempts[0], stopped_reason="Host EC2 terminated")]
    )
    assert request_move(stopping, 1, to, T0).job is None  # being stopped since the decision
    stop = move_checkpointed(asked.job, T0 + timedelta(minutes=2))
    assert stop.job is not None and isinstance(stop.effects[0], Stop)
    assert stop.effects[0].reason.startswith("SpotGuard: moving job j1 to on-demand")
    said = spot_decision(pool="gpu-spot-b/g5.xlarge/us-east-1b", trigger="reconcile")
    said = said.model_copy(update={"reason": "spot in gpu-spot-b/g5.xlarge/us-east-1b: the plan says so"})
    other = move_checkpointed(request_move(_running(), 1, said, T0).job, T0 + timedelta(minutes=2))
    assert other.effects[0].reason == (  # where it goes, said once
        "SpotGuard: moving job j1 to spot in gpu-spot-b/g5.xlarge/us-east-1b: the plan says so"
    )
    again = move_checkpointed(stop.job, T0 + timedelta(minutes=3))
    assert again.job is None and isinstance(again.effects[0], Stop)  # repeated: the same StopTask
    stopped = on_task_event(stop.job, _stopped(stop.job, stop.effects[0].reason), None, T0).job
    assert stopped is not None and stopped.state is JobState.QUEUED
    assert stopped.moves_made == 1 and stopped.move is None
    assert stopped.placement == to.model_copy(
        update={"trigger": "move"}
    )  # the move's, for the launch to carry
    assert stopped.attempts[0].interrupted_by is None and stopped.avoid_pools == []


def test_an_interruption_during_a_move_is_an_interruption_and_ends_the_move():
    asked = request_move(_running(), 1, spot_decision(placement="on-demand"), T0).job
    assert asked is not None
    stopped = on_task_event(
        asked, _stopped(asked, "Host EC2 (instance i-0123456789abcdef0) terminated."), None, T0
    )
    assert stopped.job is not None and stopped.job.move is None and stopped.job.moves_made == 0
    assert any(isinstance(e, Notify) and e.kind == "interrupted" for e in stopped.effects)


def test_a_move_without_its_checkpoint_is_abandoned_and_the_job_goes_on():
    asked = request_move(_running(), 1, spot_decision(placement="on-demand"), T0).job
    assert asked is not None
    off = move_abandoned(asked, T0 + timedelta(minutes=20), "no checkpoint").job
    assert off is not None and off.move is None and off.state is JobState.RUNNING and off.moves_made == 0


def test_a_task_without_an_instance_is_stopped_to_launch_elsewhere():
    job = _running()
    waiting = revised(job, attempts=[revised(job.attempts[0], last_status="PROVISIONING", started_at=None)])
    step = abandon_provisioning(waiting, 1, "still provisioning after 700 s", T0)
    assert isinstance(step.effects[0], Stop) and "gpu-spot/g5.xlarge/us-east-1a" in step.effects[0].reason
    assert abandon_provisioning(job, 1, "x", T0).effects == []  # it runs: nothing to abandon
    other = abandon_provisioning(waiting, 2, "still provisioning after 700 s", T0)  # not that attempt
    assert other.effects == [] and other.note == NOTHING_TO_ABANDON


# ------------------------------------------------------------------------------------------ the engine
class ScriptedPlacement(LaunchPlacement):
    def __init__(self, *decisions: PlacementDecision | None) -> None:
        self.decisions = list(decisions)
        self.failed: list[str] = []

    def decide(self, job, trigger):
        return self.decisions.pop(0)

    def launch_failed(self, job, reason):
        self.failed.append(job.placement.pool)

    def provider_refused(self, job, reason):
        self.failed.append(f"refused {job.placement.capacity_provider}")


def test_the_engine_waits_as_the_placement_says_with_its_retry_scheduled_first():
    store = FakeJobStore()
    store.jobs["j1"] = _job()
    engine, _, retries = _engine(store, FakeJobEcs())
    engine.placement = ScriptedPlacement(spot_decision(placement="none", pool=None, recheck_seconds=420))
    job = engine.drive("j1")
    assert job.state is JobState.QUEUED and retries.scheduled == [("j1", 1, 420)]


def test_a_pool_without_capacity_is_marked_and_the_job_decided_again_at_once():
    store = FakeJobStore()
    store.jobs["j1"] = _job()
    other = spot_decision(pool="gpu-spot/g5.xlarge/us-east-1b", availability_zone="us-east-1b")
    ecs = FakeJobEcs(
        RunResult(reason="RESOURCE:GPU", failure="capacity"), RunResult(task_arn=TASK + "b" * 32)
    )
    engine, _, _ = _engine(store, ecs)
    engine.placement = placement = ScriptedPlacement(spot_decision(), other)
    job = engine.drive("j1")
    assert placement.failed == ["gpu-spot/g5.xlarge/us-east-1a"]
    assert job.state is JobState.RUNNING and job.attempts[0].pool == other.pool
    zones = [c["expression"] for run in ecs.runs for c in run["placementConstraints"]]
    assert "us-east-1a" in zones[0] and "us-east-1b" in zones[1]


NOT_ASSOCIATED = (
    "InvalidParameterException: The specified capacity provider strategy cannot contain a capacity provider "
    "that is not associated with the cluster. Associate the capacity provider with the cluster or specify a "
    "valid capacity provider and try again."
)


def test_a_pool_whose_provider_was_detached_is_marked_and_the_job_goes_elsewhere_not_failed():
    """Issue 29: ECS refusing the decision's provider (detached since the last sweep) failed the job."""
    store = FakeJobStore()
    store.jobs["j1"] = _job()
    od = spot_decision(placement="on-demand", pool="gpu-od/g5.xlarge/us-east-1a", capacity_provider="gpu-od")
    ecs = FakeJobEcs(RunResult(failure="request", reason=NOT_ASSOCIATED), RunResult(task_arn=TASK + "b" * 32))
    engine, _, retries = _engine(store, ecs)
    engine.placement = placement = ScriptedPlacement(spot_decision(), od)
    job = engine.drive("j1")
    assert placement.failed == ["refused gpu-spot"]
    assert job.state is JobState.RUNNING and job.attempts[0].pool == od.pool
    assert [r["capacityProviderStrategy"][0]["capacityProvider"] for r in ecs.runs] == ["gpu-spot", "gpu-od"]
    assert len(retries.scheduled) == 1  # the backstop, as for capacity


def test_a_request_that_names_a_detached_provider_itself_still_fails_the_job():
    store = FakeJobStore()
    store.jobs["j1"] = _job()
    engine, _, _ = _engine(store, FakeJobEcs(RunResult(failure="request", reason=NOT_ASSOCIATED)))
    engine.placement = placement = ScriptedPlacement(None)  # placed as the request says (capacity fixed)
    job = engine.drive("j1")
    assert job.state is JobState.FAILED and "not associated with the cluster" in (job.last_reason or "")
    assert placement.failed == []


# ----------------------------------------------------------------------------------------- the advisor
class FakeBook:
    def __init__(self, pools: list[PoolRecord]) -> None:
        self.by_cluster = {"gpu-spot": pools}
        self.facts: list[tuple[str, Observation]] = []

    def pools(self, cluster):
        return self.by_cluster.get(cluster, [])

    def record_fact(self, cluster, pool_name, fact):
        self.facts.append((pool_name, fact))
        return None

    def record_group_fact(self, cluster, group, fact, availability_zone=None):
        pools = [p for p in self.pools(cluster) if p.auto_scaling_group == group]
        self.facts += [(p.name, fact) for p in pools]
        return [fold(p, fact) for p in pools]

    def refresh(self, cluster, now):
        return Refreshed(cluster=cluster, pools=tuple(self.pools(cluster)))


def pool(market: str, zone: str, gpus: int = 1, itype: str = "g5.xlarge", **kw) -> PoolRecord:
    base = {
        "cluster": "gpu-spot",
        "capacity_provider": f"gpu-{market}",
        "auto_scaling_group": f"asg-{market}",
        "market": market,
        "instance_type": itype,
        "availability_zone": zone,
        "gpus_per_instance": gpus,
        "constrain_type": False,
        "constrain_zone": True,
        "on_demand_price": 1.006,
        "spot_price": 0.4 if market == "spot" else None,
        "spot_priced_at": T0 if market == "spot" else None,
        "discovered_at": T0,
    }
    return PoolRecord(**{**base, **kw})


def advisor(pools: list[PoolRecord]) -> tuple[PlacementAdvisor, FakeBook]:
    book = FakeBook(pools)
    return PlacementAdvisor(book, FakeJobStore(), lambda: T0, clusters=("gpu-spot",)), book


def _job_on(cluster: str = "gpu-spot", **kw) -> Job:
    request = RunTaskRequest(cluster=cluster, taskDefinition="train:1", launchType="EC2")
    return _job(request=request, **kw)


def test_spot_available_now_is_taken_even_with_a_loose_deadline():
    adv, _ = advisor(
        [pool("spot", "us-east-1a"), pool("spot", "us-east-1b"), pool("on-demand", "us-east-1a")]
    )
    job = _job_on(options=JobOptions(deadline=T0 + timedelta(hours=60), work_hours=10))
    decision = adv.decide(job, "launch")
    assert decision is not None and decision.placement == "spot" and decision.capacity_provider == "gpu-spot"
    assert decision.work_left_hours == pytest.approx(10) and decision.time_left_hours == pytest.approx(60)


def test_a_backed_off_or_avoided_pool_is_not_chosen():
    backed_off = pool("spot", "us-east-1a", unavailable_until=T0 + timedelta(minutes=10))
    adv, _ = advisor([backed_off, pool("spot", "us-east-1b")])
    decision = adv.decide(_job_on(), "launch")
    assert decision is not None and decision.availability_zone == "us-east-1b"


def test_a_tight_deadline_goes_on_demand_in_the_on_demand_pool():
    adv, _ = advisor(
        [
            pool("spot", "us-east-1a", unavailable_until=T0 + timedelta(hours=1)),
            pool("on-demand", "us-east-1a"),
        ]
    )
    job = _job_on(options=JobOptions(deadline=T0 + timedelta(hours=10.5), work_hours=10))
    decision = adv.decide(job, "launch")
    assert decision is not None and decision.placement == "on-demand"
    assert decision.capacity_provider == "gpu-on-demand"


def test_a_job_no_pool_can_serve_says_so_and_waits():
    adv, _ = advisor([pool("spot", "us-east-1a"), pool("on-demand", "us-east-1a")])
    decision = adv.decide(_job_on(gpus=8), "launch")
    assert decision is not None and decision.placement == "none" and not decision.servable
    assert "8" in decision.reason and decision.recheck_seconds > 0


def test_no_pools_fixed_capacity_or_cpu_jobs_keep_the_request_as_submitted():
    adv, _ = advisor([pool("spot", "us-east-1a")])
    assert adv.decide(_job_on(cluster="other"), "launch") is None
    assert adv.decide(_job_on(options=JobOptions(capacity="fixed")), "launch") is None
    assert adv.decide(_job_on(gpus=0), "launch") is None


def test_a_moves_decision_is_followed_by_the_launch_after_it():
    adv, _ = advisor([pool("spot", "us-east-1a"), pool("on-demand", "us-east-1a")])
    carried = spot_decision(placement="on-demand", pool="gpu-on-demand/g5.xlarge/us-east-1a", trigger="move")
    assert adv.decide(_job_on(placement=carried), "launch") == carried


def test_what_tasks_teach_is_written_on_their_pools():
    adv, book = advisor([pool("spot", "us-east-1a")])
    before = _running()
    first = revised(before.attempts[0], started_at=None, last_status="PROVISIONING")
    adv.task_seen(revised(before, attempts=[first]), before)
    interrupted = revised(before.attempts[0], interrupted_by="spot-warning", outcome="resubmit")
    adv.task_seen(before, revised(before, attempts=[interrupted]))
    assert [(f.available, f.source) for _, f in book.facts] == [(True, "launch"), (False, "interruption")]


def test_a_spot_attempt_still_running_is_a_fact_of_its_pool_at_each_look():
    adv, book = advisor([pool("spot", "us-east-1a")])
    adv.still_running(_running())
    adv.still_running(_running(options=JobOptions(capacity="auto")))  # the same minute: one fact twice
    assert next((n, f.available, f.source) for n, f in book.facts) == (
        "gpu-spot/g5.xlarge/us-east-1a",
        True,
        "run",
    )
    on_demand = _running()
    adv.still_running(revised(on_demand, attempts=[revised(on_demand.attempts[0], market="on-demand")]))
    assert len(book.facts) == 2  # nothing learnt about spot from an on-demand attempt


def test_a_refused_provider_backs_off_every_pool_of_it_but_is_no_spot_history():
    pools = [pool("spot", "us-east-1a"), pool("spot", "us-east-1b"), pool("on-demand", "us-east-1a")]
    adv, book = advisor(pools)
    job = _job_on(placement=spot_decision(capacity_provider="gpu-spot"))
    adv.provider_refused(job, NOT_ASSOCIATED)
    assert sorted(n for n, _ in book.facts) == [
        "gpu-spot/g5.xlarge/us-east-1a",
        "gpu-spot/g5.xlarge/us-east-1b",
    ]
    assert {(f.source, f.available, f.at) for _, f in book.facts} == {("provider-refused", False, T0)}
    marked = fold(pools[0], book.facts[0][1])
    assert not marked.available_at(T0 + timedelta(minutes=5)) and not marked.confirmed_at(
        T0 + timedelta(hours=1)
    )
    assert marked.history_facts == () and marked.capacity_facts == (book.facts[0][1],)


def test_a_move_asks_for_its_checkpoint_through_the_engine_s_signaller():
    """The move's SIGUSR1 is an effect the engine carries out through the Signaller port (SSM), not a
    call into the capacity advisor."""
    store = FakeJobStore()
    store.jobs["j1"] = _running()
    engine, _, _ = _engine(store, FakeJobEcs())
    engine.signaller = signaller = FakeSignaller()
    to = spot_decision(placement="on-demand", pool="gpu-od/g5.xlarge/us-east-1a", trigger="reconcile")
    job, _ = engine.run("j1", lambda j: request_move(j, j.live_attempt.number, to, T0), drive=False)
    assert job.move is not None
    ((instance, (task,), signal),) = signaller.sent
    assert (instance, signal, task.task_arn) == ("i-0123456789abcdef0", "SIGUSR1", TASK + "a" * 32)
    engine.signaller = None  # none configured: the move waits (logged), nothing raises
    store.jobs["j2"] = _running(job_id="j2")
    engine.run("j2", lambda j: request_move(j, j.live_attempt.number, to, T0), drive=False)
