"""The replay's parts without the stack (issue 19): the clock that jumps, the pools that follow a trace,
and what is read from a replayed job's logs. The whole replay runs in tests/e2e/test_replay.py."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from spotguard_agent.agent import AgentEnv

from spotguard_cli.answers import AttemptView, read_status
from spotguard_cli.emulator.gpucluster import Host
from spotguard_cli.emulator.scaledclock import ScaledClock
from spotguard_cli.local.replay.command import check
from spotguard_cli.local.replay.report import live_row as _live_row
from spotguard_cli.local.replay.schedule import JobRun
from spotguard_cli.local.replay.world import ReplayWorld
from spotguard_cli.simulator import Job, Prices, Trace


# ------------------------------------------------------------------------------------ the clock
def test_the_clock_jumps_forward_and_never_back():
    start = datetime(2026, 1, 5, tzinfo=UTC)
    clock = ScaledClock(100.0, start)
    assert abs((clock.now() - start).total_seconds()) < 60  # 100x: well under a minute of its time
    clock.jump_to(start + timedelta(hours=5))
    assert timedelta(hours=5) <= clock.now() - start < timedelta(hours=5, minutes=1)
    with pytest.raises(ValueError, match="cannot go back"):
        clock.jump_to(start)


def test_a_task_started_after_a_jump_reads_the_same_clock():
    clock = ScaledClock(600.0, datetime(2026, 1, 5, tzinfo=UTC))
    clock.jump_to(datetime(2026, 2, 1, tzinfo=UTC))
    env = AgentEnv.model_validate({"SPOTGUARD_CHECKPOINT_URI": "s3://b/p/", **clock.task_environment()})
    time.sleep(0.05)  # 30 s of the clock's time
    assert abs((env.clock() - clock.now()).total_seconds()) < 5


def test_the_wall_clock_tells_tasks_nothing():
    assert ScaledClock(1.0).task_environment() == {}
    assert AgentEnv.model_validate({"SPOTGUARD_CHECKPOINT_URI": "s3://b/p/"}).clock().tzinfo is UTC


# ------------------------------------------------------------------------------- the pools
@dataclass
class _Scheduler:
    short_providers: set[str] = field(default_factory=set)


@dataclass
class _Stack:
    region: str = "us-east-1"
    account: str = "123456789012"


class _System:
    """What ReplayWorld uses of LocalSystem, recording what it is asked."""

    def __init__(self) -> None:
        self.scheduler, self.stack = _Scheduler(), _Stack()
        self.clock = ScaledClock(1.0)
        self.events: list[dict[str, Any]] = []
        self.notices: list[str] = []
        self.taken: list[str] = []
        self.n = 0

    def add_pool_host(self, provider: str, zone: str | None = None) -> Host:
        self.n += 1
        return Host(f"i-{self.n:04d}", f"ci/{self.n}", "us-east-1a", "p3.2xlarge", provider)

    def put(self, event: dict[str, Any]) -> None:
        self.events.append(event)

    def notice(self, kind: str, instance_id: str) -> None:
        self.notices.append(instance_id)

    def take_away(self, host: Host) -> None:
        self.taken.append(host.instance_id)


def _world(data: list[int], floor: float = 0.0) -> tuple[ReplayWorld, _System]:
    system = _System()
    trace = Trace("a", 1 / 6, tuple(bool(v) for v in data))
    return ReplayWorld(system, [trace], 2, Prices(), floor), system  # type: ignore[arg-type]


def _kinds(system: _System) -> list[str]:
    return [e["detail-type"] for e in system.events]


def test_a_pool_follows_its_trace_tick_by_tick():
    world, system = _world([1, 1, 0, 0, 1])
    provider = world.pools[0].group.capacity_provider
    world.tick(0)  # spot there: the group launches its two instances
    assert _kinds(system) == ["EC2 Instance Launch Successful"] * 2 and len(world.pools[0].hosts) == 2
    world.tick(1)  # no change: nothing said
    assert len(system.events) == 2
    hosts = list(world.pools[0].hosts)
    assert world.warn(1) == [] and world.warn(2) == hosts  # warned before the tick that loses spot only
    assert system.notices == [h.instance_id for h in hosts] and world.pools[0].hosts == []
    world.tick(2)  # spot gone: no placement there, and Auto Scaling's launch fails
    assert provider in system.scheduler.short_providers
    assert _kinds(system)[-1] == "EC2 Instance Launch Unsuccessful"
    assert world.take_away() == 0.0 and system.taken == [h.instance_id for h in hosts]
    world.tick(3)  # still gone: the group keeps failing, and says so at every tick
    assert _kinds(system)[-1] == "EC2 Instance Launch Unsuccessful" and len(system.events) == 4
    world.tick(4)  # back: new instances, placements allowed again
    assert provider not in system.scheduler.short_providers and len(world.pools[0].hosts) == 2
    assert _kinds(system)[-2:] == ["EC2 Instance Launch Successful"] * 2
    assert world.counts == {"warnings": 2, "taken_away": 2, "launch_failures": 2, "launches": 4}


def test_instances_are_not_taken_before_the_warning_floor():
    world, system = _world([1, 0], floor=30.0)
    world.tick(0)
    world.warn(1)
    world.tick(1)
    wait = world.take_away()
    assert 29.0 < wait <= 30.0 and system.taken == []  # a task has the floor's wall time to checkpoint


def test_spot_back_at_the_next_tick_brings_new_instances_while_the_warned_ones_go():
    """A pool out for one tick: its warned (drained) instances are still taken away, and the group
    launches new ones for the next tick, so the pool can place tasks again at once."""
    world, system = _world([1, 0, 1], floor=30.0)
    world.tick(0)
    warned = world.warn(1)
    world.tick(1)
    assert world.take_away() > 0 and system.taken == []  # within the floor: kept for now
    world.tick(2)
    assert len(world.pools[0].hosts) == 2 and not set(world.pools[0].hosts) & set(warned)
    world.warn_floor = 0.0
    assert world.take_away() == 0.0 and system.taken == [h.instance_id for h in warned]


def test_the_replay_checks_its_arguments():
    trace = Trace("a", 1 / 6, (True,) * 600)
    check([trace], Job(6, 9, 0.2), 4.0)
    with pytest.raises(ValueError, match="cannot meet"):
        check([trace], Job(6, 6, 0.2), 4.0)
    with pytest.raises(ValueError, match="--time-scale"):
        check([trace], Job(6, 9, 0.2), 0.1)
    with pytest.raises(ValueError, match="the same trace twice"):
        check([trace, trace], Job(6, 9, 0.2), 4.0)
    with pytest.raises(ValueError, match="at most 6 traces"):
        check([Trace(str(i), 1 / 6, (True,) * 600) for i in range(7)], Job(6, 9, 0.2), 4.0)


# ---------------------------------------------------------------------------- a job's result
def _run(logs: list[str], state: str = "succeeded") -> JobRun:
    at = datetime(2026, 1, 5, tzinfo=UTC)
    attempts = [
        {
            "task_arn": f"t/{i}",
            "started_at": (at + timedelta(hours=i)).isoformat(),
            "stopped_at": (at + timedelta(hours=i + 1)).isoformat(),
            "market": "spot" if i == 0 else "on-demand",
            "interrupted_by": "spot" if i < len(logs) - 1 else None,
        }
        for i in range(len(logs))
    ]
    run = JobRun("replay-1", 0, at, at + timedelta(hours=9), logs=logs)
    run.status = read_status({"state": state, "attempts": attempts, "spend": {"dollars": 4.0}})
    return run


def test_a_job_resumed_from_its_newest_commit_lost_nothing():
    first = "step 0 done\nstep 1 done\ncommitted step 1\nstep 2 done\ncheckpointed after step 2: exit 75\n"
    first = first.replace("step 2 done\n", "step 2 done\ncommitted step 2\n")
    second = "resumed after step 2\nstep 3 done\nfinished\n"
    row = _live_row(_run([first, second]))
    assert row["met"] and not row["lost_committed_step"] and row["steps_redone"] == 0
    assert row["spot_hours"] == 1.0 and row["on_demand_hours"] == 1.0 and row["interruptions"] == 1


def test_a_resume_behind_the_newest_commit_is_a_lost_step():
    first = "step 0 done\ncommitted step 0\nstep 1 done\ncommitted step 1\n"
    second = "resumed after step 0\nstep 1 done\nstep 2 done\nfinished\n"
    row = _live_row(_run([first, second]))
    assert row["lost_committed_step"] and row["steps_redone"] == 1


def test_a_fresh_start_after_a_commit_is_a_lost_step():
    row = _live_row(_run(["step 0 done\ncommitted step 0\n", "step 0 done\nstep 1 done\nfinished\n"]))
    assert row["lost_committed_step"]


def test_a_job_that_did_not_finish_missed_its_deadline():
    row = _live_row(_run(["step 0 done\n"], state="failed"))
    assert not row["met"] and row["finished_hours"] is None and row["steps_redone"] is None


def test_attempts_at_once_counts_attempts_of_a_job_that_overlap():
    from spotguard_cli.local.replay.report import _at_once

    def a(start: str, stop: str | None) -> AttemptView:
        times = {"started_at": f"2026-11-01T{start}:00Z", "stopped_at": stop and f"2026-11-01T{stop}:00Z"}
        return AttemptView.model_validate(times)

    assert _at_once([]) == 0
    assert _at_once([a("01:00", "02:00"), a("02:00", "03:00"), a("03:30", None)]) == 1  # one after another
    assert _at_once([a("01:00", "02:00"), a("01:59", "03:00")]) == 2  # the next began before the last stopped
    assert _at_once([a("01:00", None), a("02:00", "03:00")]) == 2  # one never stopped
