"""One run of a capacity policy over spot availability traces, tick by tick.

Bookkeeping per run: cost is price x billed hours on each instance (restart overhead included, the last
tick billed only up to completion); `spot_hours` and `ondemand_hours` are the hours of *work* done on
each, so that they add up to the job's hours (the measure of the paper's Table 3); the billed hours are
reported beside them. Time is judged too: the hours to finish, and the hours the job ran on nothing while
some pool it may use had spot (`idle_with_spot_hours`), which money alone does not see.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from spotguard.domain.capacity.model import EPS, CapacityPolicy, Market, Situation
from spotguard_cli.simulator.traces import Trace, TraceError


@dataclass(frozen=True)
class Prices:
    spot: float = 0.9731  # $/h, p3.2xlarge in the paper
    on_demand: float = 3.06


@dataclass(frozen=True)
class Job:
    hours: float  # C: compute needed
    deadline_hours: float  # R: from the start
    restart_hours: float  # d: overhead of every launch


@dataclass
class RunResult:
    cost: float = 0.0
    spot_hours: float = 0.0  # work done on spot
    ondemand_hours: float = 0.0  # work done on on-demand
    spot_billed_hours: float = 0.0
    ondemand_billed_hours: float = 0.0
    launches: int = 0
    finished_hours: float | None = None  # from the start to the end of the work (None: not finished)
    idle_with_spot_hours: float = 0.0  # ticks the job ran on nothing while some pool had spot
    missed: bool = False
    placements: list[tuple[Market, int | None]] = field(default_factory=list)


def check_job(job: Job, pools: Sequence[Trace]) -> None:
    if not pools:
        raise TraceError("no trace given")
    gaps = {t.gap_hours for t in pools}
    if len(gaps) > 1:
        raise TraceError("the traces have different gap_seconds")
    if job.hours <= 0 or job.restart_hours < 0:
        raise ValueError("job hours must be > 0 and restart hours >= 0")
    if job.deadline_hours < job.hours + job.restart_hours - EPS:
        raise ValueError(
            f"a {job.hours} h job with {job.restart_hours} h restart overhead cannot meet a "
            f"{job.deadline_hours} h deadline even on on-demand"
        )


def simulate(
    policy: CapacityPolicy, pools: Sequence[Trace], start: int, job: Job, prices: Prices = Prices()
) -> RunResult:
    """One run from tick `start`. The policy sees each tick's availability, never the future."""
    check_job(job, pools)
    gap = pools[0].gap_hours
    ticks = math.ceil(job.deadline_hours / gap - EPS)
    if start < 0 or start + ticks > min(len(t.available) for t in pools):
        raise TraceError(f"start {start} + {ticks} ticks runs past the end of the trace")
    policy.reset(job.hours, job.deadline_hours, job.restart_hours)
    res = RunResult()
    placement, pool, overhead, done = Market.NONE, None, 0.0, 0.0
    for i in range(ticks):
        elapsed = i * gap
        if done >= job.hours - EPS:
            break
        avail = tuple(t.available[start + i] for t in pools)
        if placement is Market.SPOT and pool is not None and not avail[pool]:
            placement, pool = Market.NONE, None  # preempted at the tick boundary
        s = Situation(
            elapsed_hours=elapsed,
            work_left_hours=job.hours - done,
            time_left_hours=job.deadline_hours - elapsed,
            placement=placement,
            pool=pool,
            overhead_left_hours=overhead,
            spot_available=avail,
            tick_hours=gap,
            restart_hours=job.restart_hours,
        )
        choice = policy.decide(s)
        if choice.placement is Market.SPOT and (choice.pool is None or not avail[choice.pool]):
            raise RuntimeError(f"{policy.name} chose spot in pool {choice.pool}, which is not available")
        new_pool = choice.pool if choice.placement is Market.SPOT else None
        if choice.placement is not Market.NONE and (choice.placement, new_pool) != (placement, pool):
            overhead, res.launches = job.restart_hours, res.launches + 1
        placement, pool = choice.placement, new_pool
        res.placements.append((placement, pool))
        if placement is Market.NONE:
            res.idle_with_spot_hours += gap if any(avail) else 0.0
            continue
        dt = min(gap, job.deadline_hours - elapsed)
        paid_overhead = min(overhead, dt)
        overhead -= paid_overhead
        work = min(dt - paid_overhead, job.hours - done)
        billed = paid_overhead + work if work < dt - paid_overhead - EPS else dt
        done += work
        if placement is Market.SPOT:
            res.cost += prices.spot * billed
            res.spot_hours += work
            res.spot_billed_hours += billed
        else:
            res.cost += prices.on_demand * billed
            res.ondemand_hours += work
            res.ondemand_billed_hours += billed
        if done >= job.hours - EPS:
            res.finished_hours = elapsed + billed
    res.missed = done < job.hours - EPS
    return res
