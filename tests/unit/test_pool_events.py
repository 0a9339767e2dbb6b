"""Auto Scaling's launch events as pool facts: "EC2 Instance Launch Unsuccessful" backs a group's pools
off, "EC2 Instance Launch Successful" is the positive evidence that ends the backoff, and a decision that
may move a running job (any trigger but "launch") takes a spot pool only on such evidence."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from spotguard.domain.jobs.model import JobOptions, revised
from spotguard.domain.notices import Settings
from spotguard.domain.pools import Observation, fold, fold_all
from spotguard.domain.task_events import PoolEvent, classify_task_message
from tests.conftest import EVENTS
from tests.unit.test_placement import T0, _job_on, _running, advisor, pool

SPOT = "gpu-spot/g5.xlarge/us-east-1a"
ON_DEMAND = "gpu-on-demand/g5.xlarge/us-east-1a"


def _sample(name: str) -> dict:
    return json.loads((EVENTS / name).read_text())


def _classify(event: dict):
    return classify_task_message(json.dumps(event), Settings(clusters=("gpu-spot",)))


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
    assert adv.pool_event(ev) == [("gpu-spot", SPOT)]
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
