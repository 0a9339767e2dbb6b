"""Run capacity policies on real spot availability traces, and the omniscient lower bound.

A trace is `{"metadata": {"gap_seconds": G}, "data": [1, 0, ...]}`: data[i] covers [i*G, (i+1)*G) from
the trace start; a value of 1 or more means spot could be had. Several traces given together as pools
are simultaneous alternatives (cut to the shortest).

Bookkeeping per run: cost is price x billed hours on each instance (restart overhead included, the last
tick billed only up to completion); `spot_hours` and `ondemand_hours` are the hours of *work* done on
each, so that they add up to the job's hours (the measure of the paper's Table 3); the billed hours are
reported beside them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from spotguard.domain.capacity import EPS, CapacityPolicy, Placement, Situation, slack_grid


class TraceError(ValueError):
    """A trace file that cannot be used, said in one line."""


@dataclass(frozen=True)
class Trace:
    name: str
    gap_hours: float
    available: tuple[bool, ...]

    def head(self, hours: float) -> Trace:
        return Trace(self.name, self.gap_hours, self.available[: round(hours / self.gap_hours)])


def load_trace(path: str | Path) -> Trace:
    p = Path(path)
    try:
        raw = json.loads(p.read_text())
    except OSError as exc:
        raise TraceError(f"{p}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise TraceError(f"{p}: not JSON: {exc}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("data"), list):
        raise TraceError(f"{p}: expected an object with a 'data' list")
    gap = (raw.get("metadata") or {}).get("gap_seconds") if isinstance(raw.get("metadata"), dict) else None
    if not isinstance(gap, (int, float)) or isinstance(gap, bool) or gap <= 0:
        raise TraceError(f"{p}: metadata.gap_seconds must be a positive number")
    data = raw["data"]
    bad = next(
        (i for i, v in enumerate(data) if isinstance(v, bool) or not isinstance(v, (int, float))), None
    )
    if bad is not None:
        raise TraceError(f"{p}: data[{bad}] is {data[bad]!r}, not a number")
    if not data:
        raise TraceError(f"{p}: data is empty")
    return Trace(p.stem, gap / 3600.0, tuple(v >= 1 for v in data))


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
    finished_hours: float | None = None
    missed: bool = False
    placements: list[tuple[Placement, int | None]] = field(default_factory=list)


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
    placement, pool, overhead, done = Placement.NONE, None, 0.0, 0.0
    for i in range(ticks):
        elapsed = i * gap
        if done >= job.hours - EPS:
            break
        avail = tuple(t.available[start + i] for t in pools)
        if placement is Placement.SPOT and pool is not None and not avail[pool]:
            placement, pool = Placement.NONE, None  # preempted at the tick boundary
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
        if choice.placement is Placement.SPOT and (choice.pool is None or not avail[choice.pool]):
            raise RuntimeError(f"{policy.name} chose spot in pool {choice.pool}, which is not available")
        new_pool = choice.pool if choice.placement is Placement.SPOT else None
        if choice.placement is not Placement.NONE and (choice.placement, new_pool) != (placement, pool):
            overhead, res.launches = job.restart_hours, res.launches + 1
        placement, pool = choice.placement, new_pool
        res.placements.append((placement, pool))
        if placement is Placement.NONE:
            continue
        dt = min(gap, job.deadline_hours - elapsed)
        paid_overhead = min(overhead, dt)
        overhead -= paid_overhead
        work = min(dt - paid_overhead, job.hours - done)
        billed = paid_overhead + work if work < dt - paid_overhead - EPS else dt
        done += work
        if placement is Placement.SPOT:
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


# ------------------------------------------------------------------------------------------ omniscient


def omniscient(pools: Sequence[Trace], start: int, job: Job, prices: Prices = Prices()) -> RunResult:
    """The cheapest run that knows the whole trace: exact dynamic programming over (tick, work left,
    instance and pool, restart overhead left), on a grid of sub-ticks in which the overhead is whole
    (the job's hours are rounded up to that grid). The lower bound every online policy is measured
    against."""
    check_job(job, pools)
    gap = pools[0].gap_hours
    k = slack_grid(gap, job.restart_hours)
    unit = gap / k
    d = round(job.restart_hours / unit)
    work = math.ceil(job.hours / unit - 1e-6)
    ticks = math.ceil(job.deadline_hours / gap - EPS)
    if start < 0 or start + ticks > min(len(t.available) for t in pools):
        raise TraceError(f"start {start} + {ticks} ticks runs past the end of the trace")
    # Overhead left at a tick boundary: d - j*k for j >= 1 while positive, else 0.
    overheads = sorted({max(0, d - j * k) for j in range(1, d // k + 2)} | {0})
    kinds = (
        [(Placement.NONE, None)]
        + [(Placement.ON_DEMAND, None)]
        + [(Placement.SPOT, p) for p in range(len(pools))]
    )
    states = [(kinds[0], 0)] + [(kd, o) for kd in kinds[1:] for o in overheads]
    index = {s: i for i, s in enumerate(states)}
    inf = np.inf
    left = np.arange(work + 1)
    value = np.full((len(states), work + 1), inf)
    value[:, 0] = 0.0
    policy: list[np.ndarray] = []  # per tick: best action (index into kinds) per state and work left
    for i in range(ticks - 1, -1, -1):
        avail = [t.available[start + i] for t in pools]
        span = min(k, round((job.deadline_hours - i * gap) / unit))
        new = np.full_like(value, inf)
        new[:, 0] = 0.0
        act = np.zeros((len(states), work + 1), dtype=np.int8)
        for (kind, ov), si in index.items():
            held = kind if not (kind[0] is Placement.SPOT and not avail[kind[1]]) else kinds[0]
            best = np.full(work + 1, inf)
            best_a = np.zeros(work + 1, dtype=np.int8)
            for a, target in enumerate(kinds):
                if target[0] is Placement.SPOT and not avail[target[1]]:
                    continue
                if target[0] is Placement.NONE:
                    cand = value[index[(kinds[0], 0)]].copy()
                else:
                    o = ov if target == held else d
                    paid = min(o, span)
                    rest = o - paid
                    progress = span - paid
                    after = np.maximum(left - progress, 0)
                    billed = (paid + np.minimum(progress, left)) * unit
                    price = prices.spot if target[0] is Placement.SPOT else prices.on_demand
                    cand = price * billed + value[index[(target, rest if rest in overheads else 0)]][after]
                better = cand < best - 1e-12
                best = np.where(better, cand, best)
                best_a = np.where(better, a, best_a)
            best[0] = 0.0
            new[si], act[si] = best, best_a
        value = new
        policy.append(act)
    policy.reverse()
    return _replay(policy, kinds, index, overheads, pools, start, job, prices, k, d, work)


def _replay(
    policy: list[np.ndarray],
    kinds: list[tuple[Placement, int | None]],
    index: dict[tuple[tuple[Placement, int | None], int], int],
    overheads: list[int],
    pools: Sequence[Trace],
    start: int,
    job: Job,
    prices: Prices,
    k: int,
    d: int,
    work: int,
) -> RunResult:
    """Walk the optimal actions forward to get the run's hours and cost."""
    gap = pools[0].gap_hours
    unit = gap / k
    res = RunResult()
    state, ov, left = kinds[0], 0, work
    for i, act in enumerate(policy):
        if left <= 0:
            break
        avail = [t.available[start + i] for t in pools]
        if state[0] is Placement.SPOT and not avail[state[1]]:
            state, ov = kinds[0], 0
        target = kinds[int(act[index[(state, ov)], left])]
        res.placements.append(target)
        if target[0] is Placement.NONE:
            state, ov = kinds[0], 0
            continue
        span = min(k, round((job.deadline_hours - i * gap) / unit))
        o = ov if target == state else d
        if target != state:
            res.launches += 1
        paid = min(o, span)
        progress = min(span - paid, left)
        billed = (paid + progress) * unit
        left -= progress
        if target[0] is Placement.SPOT:
            res.cost += prices.spot * billed
            res.spot_hours += progress * unit
            res.spot_billed_hours += billed
        else:
            res.cost += prices.on_demand * billed
            res.ondemand_hours += progress * unit
            res.ondemand_billed_hours += billed
        rest = o - paid
        state, ov = target, rest if rest in overheads else 0
        if left <= 0:
            res.finished_hours = i * gap + billed
    res.missed = left > 0
    return res
