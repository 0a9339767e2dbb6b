"""Capacity decisions under a deadline: each tick, run the job on spot (in which pool), on on-demand, or
wait. Pure: the Lambdas and the simulator (`spotguard_cli.simulator`) run this very code.

The model (as in "Can't Be Late", Wu et al., NSDI 2024): time moves in ticks; spot in a pool can be held
only while it is available and is lost when it is not; every launch on a new instance costs the restart
overhead (billed, no progress). A policy must never miss a deadline that on-demand alone could still
meet: `on_demand_needed` is that safety net, shared by every policy here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

EPS = 1e-9


class Market(StrEnum):
    NONE = "none"
    SPOT = "spot"
    ON_DEMAND = "on-demand"


@dataclass(frozen=True, slots=True)
class Situation:
    """What a policy knows at the start of a tick."""

    elapsed_hours: float
    work_left_hours: float
    time_left_hours: float
    placement: Market  # what the job runs on now (NONE after a preemption)
    pool: int | None  # the spot pool it runs on, when on spot
    overhead_left_hours: float  # restart overhead still to pay on the current instance
    spot_available: Sequence[bool]  # per pool, for this tick
    tick_hours: float
    restart_hours: float

    def first_available(self) -> int | None:
        return next((i for i, a in enumerate(self.spot_available) if a), None)

    def spot_progress(self, pool: int) -> float:
        """Progress this tick if the job runs on spot in `pool` (known: availability is for this tick)."""
        if not self.spot_available[pool]:
            return 0.0
        staying = self.placement is Market.SPOT and self.pool == pool
        overhead = self.overhead_left_hours if staying else self.restart_hours
        return max(0.0, self.tick_hours - overhead)


@dataclass(frozen=True, slots=True)
class JobNeeds:
    """What the capacity policy is told about a job (`domain.jobs.placement.job_needs` makes it from the
    job and its checkpoints; the capacity advisor adds what the job holds now)."""

    gpus: int
    work_left_hours: float  # from the newest checkpoint's progress, at the job's rate
    restart_hours: float  # measured: launch to the first step after a restore
    time_left_hours: float | None  # to the deadline; None: no deadline
    placement: Market = Market.NONE
    pool: str | None = None  # the spot pool it runs in, on spot
    overhead_left_hours: float = 0.0
    waited_hours: float = 0.0  # since it last ran
    max_wait_hours: float = 1.0  # without a deadline: how long to wait for spot before on-demand
    time_value_per_hour: float | None = None  # $ per hour unfinished; None: TIME_VALUE_SHARE of on-demand
    # where the figures above come from (job_needs): the newest checkpoint's progress, the rate of progress
    # per hour of running, and whether the rate and the restart were measured or are defaults
    progress: float = 0.0
    rate_per_hour: float | None = None
    rate_measured: bool = False
    work_assumed: bool = (
        False  # neither measured nor estimated: `UNKNOWN_WORK_SHARE` of the time to the deadline
    )
    restart_measured: bool = False


@dataclass(frozen=True, slots=True)
class Choice:
    placement: Market
    pool: int | None = None
    reason: str = ""


def on_demand_needed(s: Situation) -> bool:
    """True when anything but on-demand this tick could make the deadline impossible: after the tick,
    the job must still be able to launch on-demand (paying the restart overhead) and finish in time."""
    best = max((s.spot_progress(p) for p in range(len(s.spot_available))), default=0.0)
    return s.time_left_hours - s.tick_hours < s.work_left_hours - best + s.restart_hours - EPS


def slack_grid(tick_hours: float, restart_hours: float) -> int:
    """Units per tick (K) such that the restart overhead is a whole number of units (at most 120; past
    that the overhead is rounded to 1/120 of a tick). The exact planners count time in these units."""
    for k in range(1, 121):
        units = restart_hours * k / tick_hours
        if abs(units - round(units)) < 1e-6:
            return k
    return 120


class CapacityPolicy(Protocol):
    name: str

    def reset(self, job_hours: float, deadline_hours: float, restart_hours: float) -> None: ...
    def decide(self, s: Situation) -> Choice: ...


def _stay_or_first_spot(s: Situation, reason: str) -> Choice | None:
    """Keep the spot instance the job holds; else take the first pool with spot; else None."""
    if s.placement is Market.SPOT and s.pool is not None and s.spot_available[s.pool]:
        return Choice(Market.SPOT, s.pool, reason)
    pool = s.first_available()
    return None if pool is None else Choice(Market.SPOT, pool, reason)


class OnDemandPolicy:
    """Always on-demand: the cost every other policy is measured against."""

    name = "on-demand"

    def reset(self, job_hours: float, deadline_hours: float, restart_hours: float) -> None:
        pass

    def decide(self, s: Situation) -> Choice:
        return Choice(Market.ON_DEMAND, None, "always on-demand")


class GreedyPolicy:
    """Spot whenever available; on-demand only when the deadline forces it, then to the end."""

    name = "greedy"

    def reset(self, job_hours: float, deadline_hours: float, restart_hours: float) -> None:
        self.committed = False

    def decide(self, s: Situation) -> Choice:
        if self.committed or on_demand_needed(s):
            self.committed = True
            return Choice(Market.ON_DEMAND, None, "the deadline needs on-demand from here on")
        return _stay_or_first_spot(s, "spot is available") or Choice(Market.NONE, None, "wait for spot")


class UniformProgressPolicy:
    """The paper's policy. Expected progress ep(t) = C t / R is the line to keep up with:
    1. idle and behind the line -> on-demand, to catch up;
    2. spot whenever it is available, kept until it is preempted;
    3. hysteresis: on on-demand, stay until progress reaches ep(t + 2d) -- but hand over to spot as soon
       as spot is available and progress is back on the line;
    4. safety net: on-demand to the end once the deadline needs it.
    With several pools it takes any available pool (the one it holds first)."""

    name = "uniform-progress"

    def reset(self, job_hours: float, deadline_hours: float, restart_hours: float) -> None:
        self.job, self.deadline, self.committed = job_hours, deadline_hours, False

    def _expected(self, hours: float) -> float:
        return self.job * hours / self.deadline

    def decide(self, s: Situation) -> Choice:
        if self.committed or on_demand_needed(s):
            self.committed = True
            return Choice(Market.ON_DEMAND, None, "the deadline needs on-demand from here on")
        done = self.job - s.work_left_hours
        behind = done < self._expected(s.elapsed_hours) - EPS
        spot = _stay_or_first_spot(s, "spot is available")
        if s.placement is Market.SPOT and spot is not None and spot.pool == s.pool:
            return spot
        if s.placement is Market.ON_DEMAND:
            if spot is not None and not behind:
                return spot
            if done < self._expected(s.elapsed_hours + 2 * s.restart_hours) - EPS:
                return Choice(Market.ON_DEMAND, None, "hysteresis: catching up on on-demand")
        if spot is not None:
            return spot
        if behind:
            return Choice(Market.ON_DEMAND, None, "behind uniform progress")
        return Choice(Market.NONE, None, "ahead of uniform progress: wait for spot")
