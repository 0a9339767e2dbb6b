"""Auto Scaling's launch events as pool facts: "EC2 Instance Launch Unsuccessful" backs a group's pools
off, "EC2 Instance Launch Successful" is the positive evidence that ends the backoff, and a decision that
may move a running job (any trigger but "launch") takes a spot pool only on such evidence."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from spotguard.domain.jobs.model import Attempt, JobState, revised
from spotguard.domain.jobs.submission import JobOptions
from spotguard.domain.jobs.task_events import PoolEvent, classify_task_message
from spotguard.domain.pools import MAX_AHEAD, Observation, fold, fold_all, merge_discovered
from spotguard.domain.settings import Settings
from spotguard.domain.tasks import TaskEvent
from spotguard.ports import PoolMarks
from spotguard.usecases.jobs.advisor import PlacementAdvisor
from spotguard.usecases.jobs.service import JobService
from spotguard.usecases.pools import PoolService
from tests.conftest import EVENTS
from tests.fakes import FakeJobEcs, FakeJobStore, FakePoolStore
from tests.unit.test_job_engine import CLUSTER, TASK, _engine, _job
from tests.unit.test_placement import T0, _job_on, _running, advisor, pool
from tests.unit.test_pool_facts import record

SPOT = "gpu-spot/g5.xlarge/us-east-1a"
ON_DEMAND = "gpu-on-demand/g5.xlarge/us-east-1a"


def _sample(name: str) -> dict:
    return json.loads((EVENTS / name).read_text())


def _classify(event: dict, now: datetime | None = None):
    return classify_task_message(json.dumps(event), Settings(clusters=("gpu-spot",)), now)


# ------------------------------------------------------------------------------------ classification
def test_a_successful_launch_is_an_available_pool_event_of_the_group_and_zone():
    msg = _classify(_sample("asg-launch-successful.json"))
    assert msg.outcome == "pool" and "launched" in msg.reason
    ev = msg.pool_event
    assert ev is not None and ev.available is True
    assert (ev.group, ev.zone) == ("gpu-cluster-Gpu1SpotGroup", "us-east-1b")
    assert ev.message == "launched i-0b7c2d9e4f1a35c68"
    assert ev.at == datetime(2026, 3, 2, 10, 2, 41, tzinfo=UTC)


def test_an_unsuccessful_launch_is_an_unavailable_pool_event():
    msg = _classify(_sample("asg-launch-unsuccessful.json"))
    assert msg.outcome == "pool" and msg.pool_event is not None and msg.pool_event.available is False
    assert "sufficient g5.xlarge capacity" in msg.pool_event.message


def test_the_sqs_sample_wraps_the_same_event():
    (record,) = json.loads((EVENTS.parent / "sqs" / "asg-launch-successful.json").read_text())["Records"]
    assert json.loads(record["body"]) == _sample("asg-launch-successful.json")


def test_a_successful_launch_without_an_instance_id_is_still_a_fact():
    event = _sample("asg-launch-successful.json")
    del event["detail"]["EC2InstanceId"]
    msg = _classify(event)
    assert msg.outcome == "pool" and msg.pool_event.available and msg.pool_event.message


@pytest.mark.parametrize(
    ("field", "value"),
    [("AutoScalingGroupName", ""), ("AutoScalingGroupName", None), ("EC2InstanceId", 7), ("Details", [])],
)
def test_a_successful_launch_with_a_bad_detail_is_rejected(field, value):
    event = _sample("asg-launch-successful.json")
    event["detail"][field] = value
    msg = _classify(event)
    assert msg.outcome == "reject" and msg.reason.startswith("detail.")


# ------------------------------------------------------------------------------------ pool facts
def _fact(minutes: float, available: bool, source: str, detail: str = "") -> Observation:
    return Observation(at=T0 + timedelta(minutes=minutes), available=available, source=source, detail=detail)


def test_a_launch_success_ends_the_backoff_like_a_launch():
    failed = fold(pool("spot", "us-east-1a"), _fact(0, False, "launch-failure", "no capacity"))
    assert failed.unavailable_until == T0 + timedelta(minutes=15)
    back = fold(failed, _fact(5, True, "launch-success", "launched i-1"))
    assert back.unavailable_until is None and back.backoff_streak == 0
    assert back.available_at(T0 + timedelta(minutes=6)) and back.confirmed_at(T0 + timedelta(minutes=6))
    # the same fact again changes nothing
    assert fold(back, _fact(5, True, "launch-success", "launched i-1")) is back


def test_confirmed_needs_a_newest_fact_that_is_available_or_no_fact_at_all():
    fresh = pool("spot", "us-east-1a")
    assert fresh.confirmed_at(T0)
    failed = fold(fresh, _fact(0, False, "launch-failure"))
    later = T0 + timedelta(hours=1)
    assert failed.available_at(later) and not failed.confirmed_at(later)  # backoff over, no evidence
    assert not fold(failed, _fact(20, False, "interruption", "i-1")).confirmed_at(later)
    assert fold(failed, _fact(20, True, "run")).confirmed_at(later)  # a task of ours runs there
    # backed off is never confirmed, whatever the newest fact says
    inside = fold_all(fresh, [_fact(0, False, "launch-failure"), _fact(5, True, "run")])
    assert not inside.confirmed_at(T0 + timedelta(minutes=6))
    assert not fold(fresh, _fact(0, True, "launch")).model_copy(update={"gone_since": T0}).confirmed_at(T0)


# ------------------------------------------------------------------------------------ the advisor
def test_the_advisor_records_a_successful_launch_as_an_available_fact():
    adv, book = advisor([pool("spot", "us-east-1a"), pool("on-demand", "us-east-1a")])
    ev = PoolEvent(group="asg-spot", zone="us-east-1a", message="launched i-1", at=T0, available=True)
    assert adv.pool_event(ev) == PoolMarks(kept=(("gpu-spot", SPOT),), in_effect=(("gpu-spot", SPOT),))
    ((name, fact),) = book.facts
    assert (name, fact.available, fact.source, fact.detail, fact.at) == (
        SPOT,
        True,
        "launch-success",
        "launched i-1",
        T0,
    )
    book.facts.clear()
    adv.pool_event(ev.model_copy(update={"available": False, "message": "no capacity"}))
    assert [(f.available, f.source) for _, f in book.facts] == [(False, "launch-failure")]


def _on_demand_job():
    job = _running(options=JobOptions(deadline=T0 + timedelta(hours=60), work_hours=10))
    attempt = revised(job.attempts[0], market="on-demand", pool=ON_DEMAND)
    return revised(job, attempts=[attempt])


def test_a_decision_for_a_running_job_takes_spot_only_on_evidence_a_launch_on_an_expired_backoff():
    expired = fold(pool("spot", "us-east-1a"), _fact(-60, False, "launch-failure", "no capacity"))
    assert expired.available_at(T0) and not expired.confirmed_at(T0)
    adv, _ = advisor([expired, pool("on-demand", "us-east-1a")])
    job = _on_demand_job()
    stay = adv.decide(job, "reconcile")
    assert stay is not None and stay.placement != "spot"  # no move to a pool with no evidence
    launch = adv.decide(_job_on(options=job.options), "launch")
    assert launch is not None and launch.placement == "spot" and launch.pool == SPOT  # as before

    back = fold(expired, _fact(-10, True, "launch-success", "launched i-1"))
    adv, _ = advisor([back, pool("on-demand", "us-east-1a")])
    move = adv.decide(job, "reconcile")
    assert move is not None and move.placement == "spot" and move.pool == SPOT


def test_the_pool_a_job_runs_in_is_its_own_evidence():
    here = fold(pool("spot", "us-east-1a"), _fact(-60, False, "interruption", "i-0"))
    other = fold(pool("spot", "us-east-1b"), _fact(-60, False, "launch-failure"))
    adv, _ = advisor([here, other, pool("on-demand", "us-east-1a")])
    job = _running(options=JobOptions(deadline=T0 + timedelta(hours=60), work_hours=10))
    decision = adv.decide(job, "reconcile")
    assert decision is not None and decision.placement == "spot" and decision.pool == SPOT


# ------------------------------------------------------------------------- an event's time (issue 29)
# The sample's time is 2026-03-02T10:02:41Z: the clock of these tests is a minute later.
SAMPLE_NOW = datetime(2026, 3, 2, 10, 3, 41, tzinfo=UTC)


@pytest.mark.parametrize(
    "time",
    ["2026-03-03T10:02:41Z", "3000-01-01T00:00:00Z", "9999-12-31T23:59:59Z", "2026-03-02T10:09:42Z"],
)
@pytest.mark.parametrize("sample", ["asg-launch-successful.json", "asg-launch-unsuccessful.json"])
def test_a_pool_event_dated_ahead_of_the_clock_is_rejected_in_one_line(sample, time):
    event = _sample(sample)
    event["time"] = time
    msg = _classify(event, now=SAMPLE_NOW)
    assert msg.outcome == "reject" and not hasattr(msg, "pool_event")  # a reject carries no event
    assert "\n" not in msg.reason and "ahead of the clock" in msg.reason and time[:4] in msg.reason


def test_clock_skew_is_taken_and_the_past_however_far_is_history():
    for time in ("2026-03-02T10:08:41Z", "1970-01-01T00:00:00Z", "0001-01-01T00:00:00Z"):
        event = _sample("asg-launch-unsuccessful.json")
        event["time"] = time
        msg = _classify(event, now=SAMPLE_NOW)
        assert msg.outcome == "pool" and msg.pool_event is not None, time
        assert msg.pool_event.at == datetime.fromisoformat(time)


def test_a_time_with_no_utc_value_is_rejected_without_a_clock_too():
    event = _sample("asg-launch-unsuccessful.json")
    event["time"] = "9999-12-31T23:59:59-14:00"  # 10000-01-01 in UTC
    msg = _classify(event)
    assert msg.outcome == "reject" and "out of range" in msg.reason


NOW = datetime(2026, 11, 21, 15, 0, tzinfo=UTC)
GROUP = "gpu-spot-a-group"
NAME = "gpu-spot-a/g5.xlarge/us-east-1a"


def _waiting(launched: datetime):
    """A job whose task waits for an instance in the spot pool, launched at `launched`."""
    attempt = Attempt(
        number=1,
        task_arn=TASK + "a" * 32,
        launched_at=launched,
        last_status="PROVISIONING",
        pool=NAME,
        market="spot",
        ecs_version=1,
    )
    return _job(state=JobState.RUNNING, attempts=[attempt])


def _service(*jobs):
    """JobService on fakes, with the real PoolService over an in-memory ledger (it folds facts)."""
    ledger = FakePoolStore(record("gpu-spot-a", "spot"), record("gpu-od", "on-demand"))
    store = FakeJobStore()
    store.jobs.update({j.job_id: j for j in jobs})
    ecs = FakeJobEcs()
    engine, _, _ = _engine(store, ecs)
    engine.clock = lambda: NOW
    book = PoolService(None, ledger, "us-east-1")  # type: ignore[arg-type]
    advisor = PlacementAdvisor(book, FakeJobStore(), lambda: NOW, clusters=("gpu-spot",))
    engine.placement = advisor
    engine.on_written = [advisor.task_seen]  # as the runtime wires it
    service = JobService(
        engine, None, None, placement=advisor, pool_observations=advisor, retries=engine.retries
    )  # type: ignore[arg-type]
    return service, ledger, ecs


def _event(at: datetime, available: bool) -> PoolEvent:
    message = "launched i-1" if available else "no capacity"
    return PoolEvent(group=GROUP, zone="us-east-1a", message=message, at=at, available=available)


@pytest.mark.parametrize(
    "ahead",
    [
        timedelta(days=1),
        datetime(3000, 1, 1, tzinfo=UTC) - NOW,
        datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC) - NOW,
    ],
)
def test_a_failure_dated_ahead_is_refused_and_a_launch_now_leaves_the_pool_available(ahead):
    service, ledger, _ = _service()
    note = service.on_pool_event(_event(NOW + ahead, available=False))  # never an OverflowError
    assert note.startswith("refused: ") and "ahead of the clock" in note and "\n" not in note
    assert ledger.by_name[NAME].observations == ()
    assert service.on_pool_event(_event(NOW, available=True)).startswith("marked available")
    assert ledger.by_name[NAME].available_at(NOW) and ledger.by_name[NAME].confirmed_at(NOW)


def test_a_failure_dated_1970_is_old_history_it_neither_backs_off_nor_stops_a_task():
    service, ledger, ecs = _service(_waiting(NOW - timedelta(minutes=1)))
    note = service.on_pool_event(_event(datetime(1970, 1, 1, tzinfo=UTC), available=False))
    assert note.startswith("kept as history")
    pool = ledger.by_name[NAME]
    assert [o.source for o in pool.observations] == ["launch-failure"]  # kept, at its time
    assert pool.available_at(NOW) and ecs.stops == []


def test_a_failure_older_than_a_launch_seen_after_it_backs_nothing_off():
    service, ledger, ecs = _service(_waiting(NOW - timedelta(minutes=20)))
    service.on_pool_event(_event(NOW - timedelta(minutes=5), available=True))
    note = service.on_pool_event(_event(NOW - timedelta(minutes=10), available=False))  # arrives late
    assert note.startswith("kept as history")
    assert ledger.by_name[NAME].available_at(NOW) and ecs.stops == []


def test_a_failure_stops_only_the_tasks_launched_before_it():
    later = _waiting(NOW - timedelta(minutes=1))
    service, ledger, ecs = _service(later)
    note = service.on_pool_event(_event(NOW - timedelta(minutes=2), available=False))
    assert note.startswith("marked unavailable") and "0 waiting task(s) stopped" in note
    assert not ledger.by_name[NAME].available_at(NOW) and ecs.stops == []

    earlier = revised(
        later, job_id="j2", attempts=[revised(later.attempts[0], launched_at=NOW - timedelta(minutes=3))]
    )
    service, ledger, ecs = _service(earlier)
    note = service.on_pool_event(_event(NOW - timedelta(minutes=2), available=False))
    assert "1 waiting task(s) stopped" in note and [arn for arn, _ in ecs.stops] == [
        earlier.attempts[0].task_arn
    ]


def test_discovery_drops_facts_kept_ahead_of_the_clock_before_they_were_refused():
    fresh = record("gpu-spot-a", "spot")
    poisoned = fold_all(
        fresh,
        [
            Observation(at=NOW - timedelta(hours=3), available=False, source="launch-failure", detail="old"),
            Observation(at=datetime(3000, 1, 1, tzinfo=UTC), available=False, source="launch-failure"),
        ],
    )
    assert not poisoned.available_at(NOW)  # until the year 3000
    found = fresh.model_copy(update={"discovered_at": NOW})
    healed = merge_discovered(poisoned, found)
    assert healed.available_at(NOW) and [o.detail for o in healed.observations] == ["old"]
    assert healed.launch_failures.at == NOW - timedelta(hours=3) and healed.launch_failures.value == 1.0
    assert merge_discovered(healed, found) == healed
    skewed = fold(healed, Observation(at=NOW + MAX_AHEAD, available=True, source="launch-success"))
    assert len(merge_discovered(skewed, found).observations) == 2  # clock skew is no poison


def test_an_interruption_applied_by_two_lambdas_at_once_is_one_fact_of_its_pool():
    """The STOPPED event of an interrupted spot attempt, applied by two Lambdas a second apart (delivered
    twice): the second read the job while it ran and lost the compare-and-set. The pool keeps one
    start and one interruption, not two of each at two times, which would double its interruption rate."""
    service, ledger, _ = _service(_waiting(NOW - timedelta(minutes=5)))
    store = service.store
    arn = TASK + "a" * 32
    clock = [NOW]
    service.engine.clock = lambda: clock[0]
    service.pool_observations.clock = lambda: clock[0]  # type: ignore[attr-defined]
    common = {"task_arn": arn, "cluster_arn": CLUSTER, "started_by": "spotguard/j1/1", "started_at": NOW}
    service.on_task_event(TaskEvent(version=2, last_status="RUNNING", **common))
    running = store.get("j1")
    stopped = TaskEvent(
        version=3,
        last_status="STOPPED",
        stopped_at=NOW,
        stopped_reason="Host EC2 (instance i-0abc) terminated.",
        containers=({"name": "train", "exitCode": 75},),
        **common,
    )
    service.on_task_event(stopped)
    clock[0] = NOW + timedelta(seconds=1)
    real_get = store.get
    store.get = lambda job_id: (setattr(store, "get", real_get), running)[1]  # read before the first wrote
    service.on_task_event(stopped)
    assert store.get("j1").attempts[0].outcome == "resubmit"
    facts = [(o.source, o.available) for o in ledger.by_name[NAME].observations]
    assert facts.count(("interruption", False)) == 1 and facts.count(("launch", True)) == 1
    assert ledger.by_name[NAME].interruptions.value_at(NOW + timedelta(seconds=1)) < 1.01


def _listed_before_it_started(service, launched: datetime):
    """The store holds the job with its task just started; list() still hands it out as it was before,
    waiting for an instance (a sweep or a pool event that listed it a moment earlier)."""
    waiting = _waiting(launched)
    started = revised(
        waiting, attempts=[revised(waiting.attempts[0], last_status="RUNNING", started_at=NOW, ecs_version=2)]
    )
    service.store.jobs[started.job_id] = started
    service.store.list = lambda state, limit, **kw: [waiting] if state in (None, JobState.RUNNING) else []
    return started


def test_a_pool_failure_does_not_stop_a_task_that_started_after_the_jobs_were_listed():
    service, _, ecs = _service()
    _listed_before_it_started(service, NOW - timedelta(minutes=3))
    note = service.on_pool_event(_event(NOW - timedelta(minutes=2), available=False))
    assert note.startswith("marked unavailable") and "0 waiting task(s) stopped" in note
    assert ecs.stops == []


def test_reconcile_does_not_abandon_a_task_that_started_after_its_sweep_listed_it():
    from spotguard.usecases.jobs.reconcile import Reconciler

    service, ledger, ecs = _service()
    started = _listed_before_it_started(service, NOW - timedelta(hours=1))  # far past the bound
    counts = Reconciler(service, pool_observations=service.pool_observations).reconcile()
    assert counts.provisioning_abandoned == 0 and ecs.stops == []
    assert [o.source for o in ledger.by_name[NAME].observations] == []  # no provisioning-timeout fact
    assert service.store.get(started.job_id) == started


@pytest.mark.parametrize(("desired", "kept"), [("RUNNING", True), ("STOPPED", False)])
def test_reconcile_keeps_a_run_fact_only_on_ecs_word_that_the_task_runs_now(desired, kept):
    """The sweep's "run" fact says spot is still there. It comes from DescribeTasks at that moment, not
    from the job as the sweep listed it: a task being stopped (its instance reclaimed, say) is no run."""
    from spotguard.usecases.jobs.reconcile import Reconciler

    waiting = _waiting(NOW - timedelta(minutes=30))
    attempt = revised(waiting.attempts[0], last_status="RUNNING", started_at=NOW - timedelta(minutes=29))
    job = revised(waiting, attempts=[attempt])
    service, ledger, ecs = _service(job)
    described = TaskEvent(
        task_arn=attempt.task_arn,
        cluster_arn=CLUSTER,
        version=3,
        last_status="RUNNING",
        desired_status=desired,
    )
    asked: list[list[str]] = []
    ecs.describe_many = lambda cluster, arns: (
        asked.append(list(arns)),
        ({described.task_arn: described}, []),
    )[1]
    counts = Reconciler(service, pool_observations=service.pool_observations).reconcile()
    assert asked == [[attempt.task_arn]] and counts.failed == 0
    runs = [o for o in ledger.by_name[NAME].observations if o.source == "run"]
    assert [(o.available, o.at) for o in runs] == ([(True, NOW)] if kept else [])


def test_reconcile_sends_the_notifications_a_dead_sender_left_once_its_hold_has_run_out():
    from spotguard.domain.jobs.model import OutboxItem
    from spotguard.usecases.jobs.reconcile import Reconciler

    held = OutboxItem(id="j1:3:0", kind="interrupted", message="m", at=NOW, sending_until=NOW)  # ran out
    job = revised(_waiting(NOW - timedelta(minutes=1)), outbox=[held])
    service, _, ecs = _service(job)
    ecs.describe_many = lambda cluster, arns: ({}, [])
    sent: list = []
    service.engine.notifier.send_all = sent.extend
    Reconciler(service, pool_observations=service.pool_observations).reconcile()
    assert [n.id for n in sent] == ["j1:3:0"] and service.store.get("j1").outbox == []
    Reconciler(service, pool_observations=service.pool_observations).reconcile()
    assert len(sent) == 1


def test_reconcile_sends_what_a_dead_writer_left_on_a_job_that_ended_after_it_and_leaves_holds_alone():
    """A Lambda wrote a notification and died; another ended the job within the hold, sending only its
    own. Reconcile sends the leftover once its hold has run out, and not before."""
    from spotguard.domain.jobs.model import OutboxItem
    from spotguard.usecases.jobs.reconcile import Reconciler

    held = OutboxItem(id="j1:3:0", kind="interrupted", message="m", at=NOW, held_by="dead")
    held = revised(held, sending_until=NOW + timedelta(seconds=20))
    job = revised(_waiting(NOW - timedelta(minutes=1)), state=JobState.SUCCEEDED, outbox=[held])
    service, _, ecs = _service(job)
    ecs.describe_many = lambda cluster, arns: ({}, [])
    sent: list = []
    service.engine.notifier.send_all = sent.extend
    Reconciler(service, pool_observations=service.pool_observations).reconcile()
    assert sent == []  # still held
    service.engine.clock = service.clock = lambda: NOW + timedelta(seconds=20)
    Reconciler(service, pool_observations=service.pool_observations).reconcile()
    assert [n.id for n in sent] == ["j1:3:0"] and service.store.get("j1").outbox == []
