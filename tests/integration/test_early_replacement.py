"""The early replacement through the template, over moto: a spot warning on a job's host asks one more
instance of the next pool's Auto Scaling group while the old task checkpoints, the relaunch goes to that
pool, and the spare is given back when the job no longer needs it; never two for one task, nothing in a
group the stack does not list, and every call allowed by the functions' roles (the fixture fails a test
on a call its role does not allow)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from spotguard.adapters import clients
from spotguard_cli.emulator.inject import make_event
from spotguard_cli.emulator.world import JobsWorld, make_jobs_world
from spotguard_cli.jobs.render import render

from .conftest import fresh_aws
from .test_capacity import POOLS, _provider, _running, _stopped

pytestmark = pytest.mark.slow  # every test deploys the stack into moto

GROUPS = "gpu-spot-a-group,gpu-spot-b-group,gpu-od-group"


def _world(groups: str) -> Iterator[tuple[JobsWorld, list[tuple[str, dict[str, Any]]]]]:
    """POOLS with an instance in each (as test_capacity's world), the stack listing `groups` as
    SpareCapacityGroups; and every Auto Scaling write call the functions make, in order."""
    with fresh_aws():
        w = make_jobs_world(parameters={"SpareCapacityGroups": groups})
        w.cluster.add_pools(w.stack.client("autoscaling"), POOLS)
        w.cluster.add_host("g5.xlarge", "us-east-1a", "gpu-spot-a")
        w.cluster.add_host("g5.xlarge", "us-east-1b", "gpu-spot-b")
        w.cluster.add_host("g5.xlarge", "us-east-1a", "gpu-od", spot=False)
        calls: list[tuple[str, dict[str, Any]]] = []
        for op in ("SetDesiredCapacity", "TerminateInstanceInAutoScalingGroup"):
            clients.on_event(
                f"provide-client-params.autoscaling.{op}",
                lambda params, op=op, **_: calls.append((op, dict(params))),
            )
        w.reconcile()  # the pools discovered
        yield w, calls


@pytest.fixture
def world() -> Iterator[tuple[JobsWorld, list[tuple[str, dict[str, Any]]]]]:
    yield from _world(GROUPS)


def _desired(w: JobsWorld, group: str) -> int:
    g = w.stack.client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[group])
    return int(g["AutoScalingGroups"][0]["DesiredCapacity"])


def _instances(w: JobsWorld, group: str) -> list[str]:
    """The group's instances, as Auto Scaling lists them."""
    g = w.stack.client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[group])
    return [i["InstanceId"] for i in g["AutoScalingGroups"][0]["Instances"]]


def _warn(w: JobsWorld, attempt: dict[str, Any], kind: str = "spot-interruption") -> dict[str, Any]:
    """The spot warning for the attempt's instance, through EventBridge as AWS delivers it: to the
    interruption function (which stops the task) and to the task-events function (the spare)."""
    event = make_event(kind, attempt["instance_id"])
    w.put(event)
    w.task_events.drain()
    return event


def _submitted_and_running(w: JobsWorld) -> tuple[dict[str, Any], dict[str, Any]]:
    deadline = (datetime.now(UTC) + timedelta(hours=40)).isoformat()
    job = w.submit(gpus=1, deadline=deadline, work_hours=10)
    return job, _running(w, job["job_id"])


def _other(pool: str) -> str:
    return "b" if "/us-east-1a" in pool else "a"


def _joined(w: JobsWorld, other: str) -> str:
    """The spare the group added boots and registers with ECS in its pool (moto launches it at once)."""
    (spare_id,) = _instances(w, f"gpu-spot-{other}-group")
    w.cluster.register_host(spare_id, "g5.xlarge", f"us-east-1{other}", f"gpu-spot-{other}")
    return spare_id


def test_a_warning_boots_the_next_pool_s_instance_and_the_relaunch_goes_there(world):
    w, calls = world
    job, first = _submitted_and_running(w)
    assert first["market"] == "spot"
    other = _other(first["pool"])
    group = f"gpu-spot-{other}-group"
    event = _warn(w, first)

    spare = w.status(job["job_id"])["spare"]
    assert spare["state"] == "raised" and spare["group"] == group and spare["attempt"] == 1
    assert spare["decision"]["trigger"] == "warning" and spare["decision"]["pool"].startswith(
        f"gpu-spot-{other}/"
    )
    assert calls == [
        ("SetDesiredCapacity", {"AutoScalingGroupName": group, "DesiredCapacity": 1, "HonorCooldown": False})
    ]
    shown = render(w.invoke({"action": "status", "job_id": job["job_id"]}))  # spotguard jobs status
    assert f"spare instance for attempt 2 in gpu-spot-{other}/" in shown and f"({group})" in shown
    assert _desired(w, group) == 1

    # the same warning again, and the task's own stop: never a second spare for the task
    w.put(event)
    w.task_events.drain()
    w.interruptions.drain()
    assert len(calls) == 1 and _desired(w, group) == 1

    # the task checkpoints and stops: the relaunch carries out the warning's decision, in that pool
    w.commit_checkpoint(job, 1, progress=0.1)
    _stopped(w, first["task_arn"])
    request = w.scheduler.requests[-1]
    assert _provider(request) == f"gpu-spot-{other}"
    status = w.status(job["job_id"])
    assert status["decisions"][-1]["trigger"] == "warning"


def test_a_booting_spare_is_given_back_once_it_has_joined_and_not_before(world):
    """The next attempt ran on an instance that was there already (the pool's own), so the instance the
    group added for it is not needed. Still booting (not registered with ECS), it is not terminated: it
    could register and take a task between the look and the terminate, with nothing to drain it (issue
    45, item 4). Once it has joined, the sweep drains it and terminates it, the desired capacity lowered."""
    from spotguard.domain.jobs.spares import RETRY_GIVE_BACK_SECONDS

    w, calls = world
    job, first = _submitted_and_running(w)
    other = _other(first["pool"])
    group = f"gpu-spot-{other}-group"
    _warn(w, first)
    w.interruptions.drain()
    added = _instances(w, group)
    assert len(added) == 1  # moto launched the group's instance at once (on AWS: it boots meanwhile)
    w.commit_checkpoint(job, 1, progress=0.1)
    _stopped(w, first["task_arn"])
    second = _running(w, job["job_id"])
    assert second["number"] == 2

    spare = w.status(job["job_id"])["spare"]
    assert spare["state"] == "giving-back" and not any(op.startswith("Terminate") for op, _ in calls), spare
    _joined(w, other)
    w.shift_clock(RETRY_GIVE_BACK_SECONDS + 1)
    assert w.reconcile()["spares_given_back"] == 1
    spare = w.status(job["job_id"])["spare"]
    assert spare["state"] == "given-back" and f"terminated {added[0]}" in spare["detail"], spare
    assert calls[-1] == (
        "TerminateInstanceInAutoScalingGroup",
        {"InstanceId": added[0], "ShouldDecrementDesiredCapacity": True},
    )
    assert _desired(w, group) == 0


def test_a_spare_whose_instance_runs_the_next_attempt_is_kept(world):
    """The group's new instance registered and the next attempt placed on it: nothing is terminated."""
    w, calls = world
    job, first = _submitted_and_running(w)
    other = _other(first["pool"])
    group = f"gpu-spot-{other}-group"
    _warn(w, first)
    w.interruptions.drain()
    (spare_id,) = _instances(w, group)
    # the pool's instance that was there is drained; the spare boots and registers with ECS in the pool
    for h in w.cluster.hosts:
        if h.capacity_provider == f"gpu-spot-{other}":
            w.scheduler.status[h.container_instance_arn] = "DRAINING"
    w.cluster.register_host(spare_id, "g5.xlarge", f"us-east-1{other}", f"gpu-spot-{other}")
    w.commit_checkpoint(job, 1, progress=0.1)
    _stopped(w, first["task_arn"])
    second = _running(w, job["job_id"])
    assert second["instance_id"] == spare_id
    spare = w.status(job["job_id"])["spare"]
    assert spare["state"] == "kept" and "1 new instance(s) run tasks" in spare["detail"], spare
    assert not any(op == "TerminateInstanceInAutoScalingGroup" for op, _ in calls)
    assert _desired(w, group) == 1


def test_a_cancelled_job_gives_its_spare_back(world):
    w, _ = world
    job, first = _submitted_and_running(w)
    group = f"gpu-spot-{_other(first['pool'])}-group"
    _warn(w, first)
    assert _desired(w, group) == 1
    _joined(w, _other(first["pool"]))
    w.invoke({"action": "cancel", "job_id": job["job_id"]})
    spare = w.status(job["job_id"])["spare"]
    assert spare["state"] == "given-back" and "cancelled" in spare["detail"], spare
    assert _desired(w, group) == 0


def test_a_spare_nothing_took_is_given_back_by_the_sweep_after_its_bound(world):
    """The warned task never stopped (its instance was not reclaimed after all): nothing ends the spare
    but time; the reconcile sweep gives it back after SPARE_BOUND_SECONDS."""
    from spotguard.domain.jobs.spares import SPARE_BOUND_SECONDS

    w, _ = world
    job, first = _submitted_and_running(w)
    group = f"gpu-spot-{_other(first['pool'])}-group"
    event = make_event("spot-interruption", first["instance_id"])
    w.put(event)
    w.task_events.drain()  # the interruption function's queue is left alone: the task keeps running
    assert _desired(w, group) == 1
    _joined(w, _other(first["pool"]))
    w.shift_clock(SPARE_BOUND_SECONDS - 60)
    w.reconcile()
    assert w.status(job["job_id"])["spare"]["state"] == "raised"
    w.shift_clock(SPARE_BOUND_SECONDS + 60)
    counts = w.reconcile()
    assert counts["spares_given_back"] == 1
    spare = w.status(job["job_id"])["spare"]
    assert spare["state"] == "given-back" and "within 20 minutes" in spare["detail"], spare
    assert _desired(w, group) == 0


def test_a_terminate_action_asks_a_spare_too(world):
    w, calls = world
    job, first = _submitted_and_running(w)
    event = make_event("lifecycle-terminate", first["instance_id"])
    w.put(event)
    w.task_events.drain()
    spare = w.status(job["job_id"])["spare"]
    assert spare is not None and spare["state"] == "raised" and spare["instance_id"] == first["instance_id"]
    assert [op for op, _ in calls] == ["SetDesiredCapacity"]


@pytest.mark.parametrize("groups", ["gpu-od-group"])
def test_nothing_is_asked_of_a_group_the_stack_does_not_list(groups):
    for w, calls in _world(groups):
        job, first = _submitted_and_running(w)
        _warn(w, first)
        assert calls == []
        assert w.status(job["job_id"])["spare"] is None
        assert all(_desired(w, g) == 0 for g in GROUPS.split(","))


def test_with_no_groups_listed_the_stack_has_no_early_replacement():
    for w, calls in _world(""):
        job, first = _submitted_and_running(w)
        _warn(w, first)
        assert calls == [] and w.status(job["job_id"])["spare"] is None
        rules = [r["Name"] for r in w.stack.client("events").list_rules()["Rules"]]
        assert not any("EarlyReplacement" in r for r in rules), rules


def _failing(op: str, times: int) -> list[int]:
    """The next `times` calls of Auto Scaling's `op` fail as a throttled call does after its retries."""
    from botocore.exceptions import ClientError

    left = [times]

    def fail(**_: object) -> None:
        if left[0] > 0:
            left[0] -= 1
            raise ClientError({"Error": {"Code": "Throttling", "Message": "Rate exceeded"}}, op)

    clients.on_event(f"before-call.autoscaling.{op}", fail)
    return left


def test_a_spare_that_could_not_be_asked_fails_nothing_and_the_relaunch_decides_again(world):
    w, _ = world
    _failing("SetDesiredCapacity", 1)
    job, first = _submitted_and_running(w)
    _warn(w, first)
    spare = w.status(job["job_id"])["spare"]
    assert spare["state"] == "not-raised" and "could not be asked: ClientError" in spare["detail"], spare
    assert (
        w.received(w.stack.outputs["TaskEventsDeadLetterQueueUrl"]) == []
    )  # the warning's record did not fail
    w.interruptions.drain()
    w.commit_checkpoint(job, 1, progress=0.1)
    _stopped(w, first["task_arn"])
    assert w.status(job["job_id"])["decisions"][-1]["trigger"] == "launch"


def test_a_give_back_that_failed_is_tried_again_by_the_sweep(world):
    """The cancel is not failed for it; once RETRY_GIVE_BACK_SECONDS have passed, the sweep gives the
    spare back."""
    from spotguard.domain.jobs.spares import RETRY_GIVE_BACK_SECONDS

    w, _ = world
    job, first = _submitted_and_running(w)
    group = f"gpu-spot-{_other(first['pool'])}-group"
    _warn(w, first)
    _joined(w, _other(first["pool"]))
    _failing("DescribeAutoScalingGroups", 1)
    answer = w.invoke({"action": "cancel", "job_id": job["job_id"]})
    assert answer["ok"], answer
    assert w.status(job["job_id"])["spare"]["state"] == "giving-back"
    assert _desired(w, group) == 1
    w.shift_clock(RETRY_GIVE_BACK_SECONDS + 1)
    assert w.reconcile()["spares_given_back"] == 1
    assert w.status(job["job_id"])["spare"]["state"] == "given-back"
    assert _desired(w, group) == 0


@pytest.mark.parametrize("groups", [GROUPS])
def test_with_spare_on_rebalance_the_recommendation_asks_it_and_the_warning_finds_it(groups):
    """SpareOnRebalance: the recommendation, minutes before the warning, asks the spare (its boot then
    overlaps those minutes); the warning finds it held and asks nothing more; the relaunch goes there."""
    with fresh_aws():
        w = make_jobs_world(parameters={"SpareCapacityGroups": groups, "SpareOnRebalance": "true"})
        w.cluster.add_pools(w.stack.client("autoscaling"), POOLS)
        w.cluster.add_host("g5.xlarge", "us-east-1a", "gpu-spot-a")
        w.cluster.add_host("g5.xlarge", "us-east-1b", "gpu-spot-b")
        w.cluster.add_host("g5.xlarge", "us-east-1a", "gpu-od", spot=False)
        calls: list[str] = []
        clients.on_event(
            "provide-client-params.autoscaling.SetDesiredCapacity", lambda **_: calls.append("raise")
        )
        w.reconcile()
        job, first = _submitted_and_running(w)
        group = f"gpu-spot-{_other(first['pool'])}-group"
        _warn(w, first, "rebalance-recommendation")
        assert w.status(job["job_id"])["spare"]["state"] == "raised" and calls == ["raise"]
        _warn(w, first)  # the spot warning, minutes later
        w.interruptions.drain()
        assert calls == ["raise"] and _desired(w, group) == 1
        w.commit_checkpoint(job, 1, progress=0.1)
        _stopped(w, first["task_arn"])
        assert _provider(w.scheduler.requests[-1]) == group.removesuffix("-group")


def test_an_idle_spare_that_registered_is_drained_then_given_back(world):
    """The spare booted and registered, but the next attempt ran on the pool's older instance: the spare
    is drained (nothing more placed on it), then terminated, with the role's own rights."""
    w, calls = world
    job, first = _submitted_and_running(w)
    other = _other(first["pool"])
    group = f"gpu-spot-{other}-group"
    _warn(w, first)
    w.interruptions.drain()
    (spare_id,) = _instances(w, group)
    spare_host = w.cluster.register_host(spare_id, "g5.xlarge", f"us-east-1{other}", f"gpu-spot-{other}")
    w.scheduler.status[spare_host.container_instance_arn] = "DRAINING"  # the relaunch takes the older one
    w.commit_checkpoint(job, 1, progress=0.1)
    _stopped(w, first["task_arn"])
    second = _running(w, job["job_id"])
    assert second["instance_id"] != spare_id
    spare = w.status(job["job_id"])["spare"]
    assert spare["state"] == "given-back" and f"terminated {spare_id}" in spare["detail"], spare
    ci = w.stack.client("ecs").describe_container_instances(
        cluster="gpu-spot", containerInstances=[spare_host.container_instance_arn]
    )["containerInstances"][0]
    assert ci["status"] == "DRAINING"
    assert calls[-1][0] == "TerminateInstanceInAutoScalingGroup"
