"""The spares' calls on a group, one holder at a time (issue 45, item 4): a raise reads the group's desired
capacity and sets it one higher; a give-back terminates an instance with the desired capacity lowered.
Interleaved by two Lambdas, two raises recorded two spares for one instance, and a give-back between a
raise's read and set left the group one instance above its size for good. Each ordering is forced here:
the group's SetDesiredCapacity runs the other Lambda's call at the worst moment."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from spotguard.adapters.autoscaling import AsgSpares
from spotguard.domain.jobs.effects import GiveBackSpare, RaiseSpare
from spotguard.domain.jobs.spares import give_back, spare_raised
from spotguard.usecases.jobs.spares import LEASE_SECONDS, LEASE_WAIT_SECONDS, Spares
from tests.fakes import FakeJobStore
from tests.unit.test_spare_adapter import Ecs
from tests.unit.test_spares import _asked

from .test_jobs_domain import T0


class Group:
    """One Auto Scaling group: its desired capacity and instances; `between` runs inside SetDesiredCapacity,
    after the caller read the group and before its set lands (another Lambda's call at that moment)."""

    def __init__(self, instances: list[str]) -> None:
        self.instances, self.desired = list(instances), len(instances)
        self.between: Callable[[], Any] | None = None
        self.terminated: list[str] = []

    def describe_auto_scaling_groups(self, AutoScalingGroupNames: list[str]) -> dict[str, Any]:
        listed = [{"InstanceId": i, "LifecycleState": "InService"} for i in self.instances]
        return {"AutoScalingGroups": [{"DesiredCapacity": self.desired, "MaxSize": 10, "Instances": listed}]}

    def set_desired_capacity(
        self, AutoScalingGroupName: str, DesiredCapacity: int, HonorCooldown: bool
    ) -> None:
        if self.between is not None:
            between, self.between = self.between, None
            between()
        self.desired = DesiredCapacity

    def terminate_instance_in_auto_scaling_group(
        self, InstanceId: str, ShouldDecrementDesiredCapacity: bool
    ) -> None:
        self.instances.remove(InstanceId)
        self.terminated.append(InstanceId)
        self.desired -= 1


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def sleep(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def _spares(group: Group, ecs: Ecs, store: FakeJobStore, clock: Clock) -> Spares:
    return Spares(AsgSpares(group, ecs), ["g"], store, lambda: clock.now, leases=store, sleep=clock.sleep)


def _outcome(spares: Spares, job: Any, effect: Any) -> Any:
    (transition,) = spares.carry(job, effect)
    return transition(job)


def test_two_raises_at_once_raise_the_group_twice_or_record_one_not_raised():
    group, store, clock = Group(["i-1", "i-2"]), FakeJobStore(), Clock()
    first, second = _spares(group, Ecs({}), store, clock), _spares(group, Ecs({}), store, clock)
    job = _asked()
    results: list[Any] = []
    group.between = lambda: results.append(_outcome(second, job, RaiseSpare(attempt=1, group="g")))
    results.insert(0, _outcome(first, job, RaiseSpare(attempt=1, group="g")))
    raised = [r.job.spare.state for r in results].count("raised")
    assert group.desired - 2 == raised  # every spare recorded raised is an instance the group was asked
    assert results[1].job.spare.state == "not-raised" and "being asked or given back" in results[1].note
    # and once the first has let the group go, the next raise goes in
    assert _outcome(second, job, RaiseSpare(attempt=1, group="g")).job.spare.state == "raised"
    assert group.desired == 4


def test_a_give_back_between_a_raises_read_and_set_waits_for_it():
    group, store, clock = Group(["i-old", "i-spare"]), FakeJobStore(), Clock()
    ecs = Ecs({"i-old": 1, "i-spare": 0})  # job B's spare, idle: to be given back
    raiser, giver = _spares(group, ecs, store, clock), _spares(group, ecs, store, clock)
    job_a = _asked()
    job_b = give_back(spare_raised(_asked(), 1, True, ("i-old",), "raised", T0).job, "done", T0).job
    back: list[Any] = []
    effect = GiveBackSpare(attempt=1, cluster="gpu-spot", group="g", before=("i-old",))
    group.between = lambda: back.append(_outcome(giver, job_b, effect))
    _outcome(raiser, job_a, RaiseSpare(attempt=1, group="g"))
    assert group.terminated == [] and group.desired == 3  # nothing given back in between: 2 + A's spare
    assert back[0].job.spare.state == "giving-back" and "tried again later" in back[0].note
    clock.now += timedelta(seconds=1)
    done = _outcome(giver, job_b, effect)  # afterwards: given back, the group at 2 + A's spare - B's
    assert done.job.spare.state == "given-back" and group.terminated == ["i-spare"] and group.desired == 2


def test_a_lease_whose_holder_died_frees_the_group_after_its_bound():
    group, store, clock = Group(["i-1"]), FakeJobStore(), Clock()
    assert store.hold_group(
        "g", "a-lambda-that-died", clock.now, clock.now + timedelta(seconds=LEASE_SECONDS)
    )
    spares = _spares(group, Ecs({}), store, clock)
    started = clock.now
    outcome = _outcome(spares, _asked(), RaiseSpare(attempt=1, group="g"))
    assert outcome.job.spare.state == "not-raised"  # waited LEASE_WAIT_SECONDS, in vain
    assert (clock.now - started).total_seconds() >= LEASE_WAIT_SECONDS
    clock.now = started + timedelta(seconds=LEASE_SECONDS + 1)
    assert _outcome(spares, _asked(), RaiseSpare(attempt=1, group="g")).job.spare.state == "raised"
