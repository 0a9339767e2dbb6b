"""The omniscient lower bound: the cheapest run that knows the whole trace (exact dynamic programming)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from spotguard.domain.capacity.model import EPS, Market, slack_grid
from spotguard_cli.simulator.policy_run import Job, Prices, RunResult, check_job
from spotguard_cli.simulator.traces import Trace, TraceError


def omniscient(
    pools: Sequence[Trace],
    start: int,
    job: Job,
    prices: Prices = Prices(),  # noqa: B008  (frozen: one shared default is safe)
) -> RunResult:
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
    kinds = [(Market.NONE, None)] + [(Market.ON_DEMAND, None)] + [(Market.SPOT, p) for p in range(len(pools))]
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
            held = kind if not (kind[0] is Market.SPOT and not avail[kind[1]]) else kinds[0]
            best = np.full(work + 1, inf)
            best_a = np.zeros(work + 1, dtype=np.int8)
            for a, target in enumerate(kinds):
                if target[0] is Market.SPOT and not avail[target[1]]:
                    continue
                if target[0] is Market.NONE:
                    cand = value[index[(kinds[0], 0)]].copy()
                else:
                    o = ov if target == held else d
                    paid = min(o, span)
                    rest = o - paid
                    progress = span - paid
                    after = np.maximum(left - progress, 0)
                    billed = (paid + np.minimum(progress, left)) * unit
                    price = prices.spot if target[0] is Market.SPOT else prices.on_demand
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
    kinds: list[tuple[Market, int | None]],
    index: dict[tuple[tuple[Market, int | None], int], int],
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
        if state[0] is Market.SPOT and not avail[state[1]]:
            state, ov = kinds[0], 0
        target = kinds[int(act[index[(state, ov)], left])]
        res.placements.append(target)
        if target[0] is Market.NONE:
            state, ov = kinds[0], 0
            res.idle_with_spot_hours += gap if any(avail) else 0.0
            continue
        span = min(k, round((job.deadline_hours - i * gap) / unit))
        o = ov if target == state else d
        if target != state:
            res.launches += 1
        paid = min(o, span)
        progress = min(span - paid, left)
        billed = (paid + progress) * unit
        left -= progress
        if target[0] is Market.SPOT:
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
