"""The plans: the cheapest way to the deadline for the capacity model
(spotguard.domain.capacity.availability), by dynamic programming over (ticks left, slack left, what the job
holds, each pool's availability and run age). `Plan` is for one pool, `JointPlan` for two at once.
Over 400 lines: the two programmes and the grids they share (the horizon split, the far grid's junction),
whose private helpers would otherwise cross modules.

Slack (time left minus work left) is counted in units of u = tick / K, chosen so that the restart
overhead is a whole number D of units (`plan_grid`). An idle tick spends K units of slack; a launch
spends D (at most K per tick).

The cost of a plan is money plus time: every hour the job is still unfinished is charged
`time_value_per_hour` (spotguard.domain.capacity.rules sets its default). Without it, idle time is
free and a loose deadline makes waiting as good as running; with it, equal money is broken toward
finishing sooner.

Bounded work: a decision must be cheap enough to run on every launch in a Lambda, whatever the deadline.
The plan is therefore solved on two grids (`Horizon`):

- the fine grid, for the first ticks (at most `MAX_FINE_TICKS`, fewer if the value budget says so): the
  ticks themselves and K units per tick, exact for the model, and only on the slack the job can still
  reach (within `fine_ticks * K` units of its slack now: a window; and i ticks from now only the top
  i * K + 1 units of it, a triangle: `fine_values`, half the window's work for the same values);
- the far grid, for the rest up to the deadline: the same model and the same programme on steps of m
  ticks (hazards per step from the per-tick ones, `stretch_hazards`), with its own units, m the smallest
  that keeps the grid under its budget, ending at the deadline (the fine grid's length is fitted to
  whole steps). Its value at the junction, interpolated on slack, is the fine grid's terminal value.

The joint plan has about 6 times the single plan's values per tick and slack unit (1,008 against 160
for an overhead of 1.2 ticks: two pools' coarse bins against one pool's fine ones, and a class more per
overhead rest), so the same budgets give it the shorter fine grid and the coarser far steps. Both
plans share the budgets, counted in values, as a value costs about the same time in either.

The number of values computed is thus bounded by `FINE_BUDGET + FAR_BUDGET` for any deadline; a
deadline within the fine horizon needs no far grid, and the plan is then exact (tests/unit/
test_planner_exact.py ties it to the simulator's bookkeeping). A plan keeps the actions of its fine ticks
only: a caller that follows it (the simulator's policy) plans again before they run out.

The rest of a plan's work is bounded too, whatever the deadline (issue 29: a deadline a million hours
off took 10 s and 650 MB). Slack beyond max(`SLACK_CAP_HOURS`, `SLACK_CAP_WORK` x the work) is left out
(`collapse`): the deadline's far end is its safety net, not time to plan, and a plan with less slack than
there is stays safe. The far step is looked for from a lower bound (`_first_step`), then in steps of a
64th of itself past `LINEAR_STEPS`; its hazards come from a product over the age bins, not over its
ticks (spotguard.domain.capacity.availability). Where every action risks the deadline, a plan's value is its
sentinel `INF` weighted by that risk: `meets_deadline` tells it from a cost.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from spotguard.domain.capacity.availability import (
    ADVANCE,
    NB,
    NC,
    NEXT_BIN,
    coarse_transitions,
    step_bin,
    step_coarse_bin,
    stretch_coarse,
    stretch_hazards,
)
from spotguard.domain.capacity.model import Market

INF = 1e12  # the value of a missed deadline: a sentinel, never a cost (see `_Planned.meets_deadline`)
K_MAX = 6  # at most 6 units per tick: the overhead to within a sixth of a tick (rounded up)
MAX_FINE_TICKS = 72  # 12 hours of 10-minute ticks on the fine grid, at most
# Values (states x classes x slack units x ticks) each grid may compute. Chosen by measurement
# (bench/decide.py): a joint plan of both grids full takes about 0.1-0.2 s on one core here (0.3 s
# under load).
FINE_BUDGET = 6_000_000
FAR_BUDGET = 2_000_000
# A plan covers slack up to the larger of these, the rest is left out (`collapse`): beyond them extra
# slack changes nothing in a decision. Ordinary deadlines (slack up to 50 times the work, or up to 500
# hours) are planned whole.
SLACK_CAP_HOURS = 500.0
SLACK_CAP_WORK = 50
MIN_FINE_TICKS = 6  # the fine grid covers at least an hour of 10-minute ticks, budget or not
# The far step is looked for one tick at a time up to this many ticks (about 680 hours of 10-minute
# ticks: no deadline the door accepts needs more, see `collapse`), then in steps of 1/64 of itself.
LINEAR_STEPS = 4096


def plan_grid(tick_hours: float, restart_hours: float, k_max: int = K_MAX) -> tuple[int, int]:
    """(K, D): slack units per tick and the restart overhead in units. The exact grid (`slack_grid`)
    when it needs at most `k_max` units per tick; else the K <= k_max whose overhead, rounded up to whole
    units, is nearest (up: the plan then never counts on more slack than there is)."""
    for k in range(1, k_max + 1):  # `slack_grid`'s scan, stopped at k_max: the same answer, sooner
        units = restart_hours * k / tick_hours
        if abs(units - round(units)) < 1e-6:
            return k, round(units)

    def over(kk: int) -> float:
        return math.ceil(restart_hours * kk / tick_hours - 1e-9) * tick_hours / kk - restart_hours

    k = min(range(1, k_max + 1), key=lambda kk: (over(kk), kk))
    return k, math.ceil(restart_hours * k / tick_hours - 1e-9)


@dataclass(frozen=True, slots=True)
class Horizon:
    """How a plan of `ticks` ticks and `slack` units splits: `fine_ticks` on the fine grid, over slack
    units `lo`..`slack`; the rest (if any) in `far_steps` steps of `step` ticks, with `far_k` units per
    step, an overhead of `far_d` units and slack units 0..`far_slack`. The far grid covers whole steps
    and ends at the deadline (`split_horizon` fits the fine ticks to it); only where that cannot be does
    its deadline come early by the rest (`lost_ticks`: the job's slack there is that much less, cautious,
    and less than one far step)."""

    fine_ticks: int
    lo: int
    step: int = 0
    far_steps: int = 0
    far_k: int = 1
    far_d: int = 0
    far_slack: int = 0
    lost_ticks: int = 0

    def values(self, slack: int, k: int, per_cell: int) -> tuple[int, int]:
        """The values each grid computes, for a plan from slack `slack` with K = `k` and `per_cell`
        values per (tick, slack unit)."""
        fine = fine_values(self.fine_ticks, slack - self.lo, k, per_cell)
        return fine, self.far_steps * (self.far_slack + 1) * per_cell


def fine_values(ticks: int, slack: int, k: int, per_cell: int) -> int:
    """The values a fine grid of `ticks` ticks computes from slack `slack`: at i ticks from its junction
    it needs only the slack the job can reach by then, the `min(slack, i * k) + 1` units above the
    window's floor (slack falls by at most K units a tick). A triangle, not the window's rectangle: half
    the work for the same plan."""
    full = min(ticks, slack // k)  # the ticks i whose reach i * k is within the window
    return per_cell * ((k * full * (full + 1)) // 2 + (ticks - full) * slack + ticks)


def split_horizon(
    ticks: int,
    slack: int,
    k: int,
    d: int,
    tick_hours: float,
    per_cell: int,
    fine_budget: int = FINE_BUDGET,
    far_budget: int = FAR_BUDGET,
    max_fine_ticks: int = MAX_FINE_TICKS,
) -> Horizon:
    """The grids for a plan: as many fine ticks as the budget allows (at most `max_fine_ticks`), then a
    far grid of the finest step that keeps it within its budget. The far grid ends at the deadline: the
    ticks beyond a whole number of steps (fewer than one step) join the fine grid if its budget allows,
    else the fine grid hands the start of one more step to the far grid. Only when that would leave it
    fewer than `MIN_FINE_TICKS` (a step longer than the fine grid: deadlines far off with much slack)
    does the far grid's deadline come early by the rest instead (`lost_ticks`, cautious). An early far
    deadline was the joint plan's largest error: its steps are the coarsest (about 6 times the single
    plan's values per tick and slack unit), so it lost most slack at the junction, up to a step."""
    ticks, slack = max(1, ticks), max(0, slack)
    h = min(ticks, max_fine_ticks)
    while h > MIN_FINE_TICKS and fine_values(h, slack, k, per_cell) > fine_budget:
        h -= 1
    if h >= ticks:
        return Horizon(ticks, 0)
    hours_left = slack * tick_hours / k
    restart = d * tick_hours / k
    n = ticks - h
    m = _first_step(n, slack / k, per_cell, far_budget)
    while True:
        # The far grid ends at the deadline: the fine grid takes the rest of a step more if its budget
        # allows, else gives up the start of one; only if it would then be too short does the far
        # grid's deadline come early instead.
        steps, rest = divmod(n, m)
        fine, lost_ticks = h + rest, 0
        if rest and fine_values(fine, slack, k, per_cell) > fine_budget:
            steps += 1
            fine = ticks - steps * m
            if fine < MIN_FINE_TICKS:
                steps, fine, lost_ticks = steps - 1, h, rest
        lost = lost_ticks * tick_hours
        # At one unit per step (the fewest) the far grid is at its smallest: a step too fine for that
        # is too fine whatever its units, and needs no `plan_grid`. Its slack reaches the job's, rounded
        # up to a whole unit (`_on_slack` interpolates below it, never past its top).
        least = max(0, math.ceil((hours_left - lost) / (m * tick_hours) - 1e-6))
        if steps * (least + 1) * per_cell <= far_budget:
            far_k, far_d = plan_grid(m * tick_hours, restart)
            far_slack = max(0, math.ceil((hours_left - lost) * far_k / (m * tick_hours) - 1e-6))
            if steps * (far_slack + 1) * per_cell <= far_budget:
                return Horizon(fine, max(0, slack - fine * k), m, steps, far_k, far_d, far_slack, lost_ticks)
        if m >= n:
            raise AssertionError("unreachable: a single far step always fits")  # pragma: no cover
        m = min(n, m + 1 if m < LINEAR_STEPS else m + m // 64)


def _first_step(n: int, slack_ticks: float, per_cell: int, far_budget: int) -> int:
    """A far step (ticks) no finer than the finest that fits the budget, for `n` far ticks and
    `slack_ticks` of slack: below it, whatever the fit, there are more than n/m - 1 steps and more than
    slack_ticks/m - 1 slack units a step, so more than `far_budget` values (`split_horizon` then looks
    up from here instead of from 1: the same step, without the thousands of hopeless tries of a
    deadline far off)."""
    c = far_budget / per_cell
    if c <= 1 or n < 2 or slack_ticks < 2:
        return 1
    # (n/m - 1)(s/m - 1) = c at m = r (the smaller factor still positive there); every m < r exceeds it
    b = n + slack_ticks
    r = (-b + math.sqrt(b * b + 4 * (c - 1) * n * slack_ticks)) / (2 * (c - 1))
    return max(1, min(n, math.floor(r) - 1))


def collapse(ticks: int, slack: int, k: int, d: int, tick_hours: float) -> int:
    """The ticks a plan leaves out at its far end: slack beyond `SLACK_CAP_HOURS`, or beyond
    `SLACK_CAP_WORK` times the work and a restart if that is more, is planned as if it were not there
    (whole ticks, so the plan keeps at least that much slack). It is the deadline's safety net, not time
    to plan: priced at the time value, an idle hour costs a twentieth of an on-demand hour, so a plan
    expects to idle less than about 21 times the work (going on-demand at once costs no more), and the
    model forgets in a week (half-life 168 h) what it would forecast weeks ahead. Left in, it made the
    far grid's steps grow with the deadline, to thousands of hours (a deadline a million hours off took
    10 s and 650 MB). Planning with less slack than there is is cautious: a plan that meets the nearer
    deadline meets the real one, and the next decision plans again from its own time left."""
    unit = tick_hours / k
    work = max(0, ticks * k - slack)
    cap = max(math.ceil(SLACK_CAP_HOURS / unit - 1e-9), SLACK_CAP_WORK * (work + d))
    return max(0, (slack - cap) // k) if slack > cap else 0


def overhead_rests(d: int, k: int) -> list[int]:
    """Overhead still to pay at a tick boundary after a launch (D units, K per tick): D - jK while
    positive, and 0."""
    return sorted({max(0, d - j * k) for j in range(1, d // k + 2)} | {0})


def _shift(x: np.ndarray, k: int) -> np.ndarray:
    """out[..., s] = x[..., s - k]: spending k units of slack; below the window is out of reach."""
    if k == 0:
        return x
    out = np.full_like(x, INF)
    out[..., k:] = x[..., :-k]
    return out


def _nearest(rests: Sequence[int], hours: float, unit: float) -> int:
    return min(range(len(rests)), key=lambda i: abs(rests[i] * unit - hours))


def _on_slack(far: np.ndarray, lo: int, size: int, unit: float, far_unit: float, lost: float) -> np.ndarray:
    """The far grid's values (..., far slack) at the fine grid's slack units lo..lo+size-1 (less `lost`
    hours), linearly interpolated; out of reach below its slack 0."""
    x = ((lo + np.arange(size)) * unit - lost) / far_unit
    i0 = np.clip(np.floor(x + 1e-6).astype(int), 0, far.shape[-1] - 1)
    i1 = np.minimum(i0 + 1, far.shape[-1] - 1)
    w = np.clip(x - i0, 0.0, 1.0).astype(np.float32)
    out = np.minimum((1 - w) * far[..., i0] + w * far[..., i1], INF)
    out[..., x < -1e-6] = INF
    return out.astype(np.float32)


def _tail(value: np.ndarray, off: int, reach: int, left: int, k: int) -> tuple[np.ndarray, int]:
    """The part of `value` (whose slack index 0 is `off`) the next tick needs, and its offset: slack
    indices from `reach - (left + 1) * k` up, `left` ticks before the last (see `fine_values`)."""
    a = max(0, reach - (left + 1) * k)
    return (value[..., a - off :], a) if a > off else (value, off)


def _padded(value: np.ndarray, off: int, size: int) -> np.ndarray:
    """`value` (slack indices `off`..) on all `size` indices, out of reach (INF) below `off`."""
    if off == 0:
        return value
    out = np.full((*value.shape[:-1], size), INF, dtype=value.dtype)
    out[..., off:] = value
    return out


@dataclass(frozen=True, slots=True)
class _Prices:
    spot: Sequence[float]
    on_demand: float
    time_value: float


def _single_dp(
    hazards: np.ndarray,
    ticks: tuple[int, int],
    lo: int,
    size: int,
    k: int,
    d: int,
    u: float,
    prices: _Prices,
    terminal: np.ndarray | None,
    keep: int,
    reach: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Backward induction for one pool from `ticks[0]` ticks left (value `terminal`, else the deadline)
    to `ticks[1]`, on slack units lo..lo+size-1. Classes: 0 nothing held, 1 + i spot with overhead rest
    i, 1 + nr + i on-demand with rest i. Returns the values at `ticks[1]` and the actions (0 wait,
    1 on-demand, 2 spot) of the last `keep` ticks, the first tick's first. `reach`: the slack index the
    values at `ticks[1]` are needed from; each tick before needs K units more below it, and nothing
    lower is computed (INF there, actions 0)."""
    rests = overhead_rests(d, k)
    nr = len(rests)
    index = {r: i for i, r in enumerate(rests)}
    n_classes = 1 + 2 * nr
    sigma = lo + np.arange(size)
    hz = hazards.astype(np.float32)
    hh = hz[None, :, :, None]
    adv = ADVANCE.astype(np.float32)[None, None, :, None]
    value = np.full((n_classes, 2, NB, size), INF, np.float32) if terminal is None else terminal
    actions = np.zeros((keep, n_classes, 2, NB, size), dtype=np.int8)
    overheads = sorted(set(rests) | {d})
    od, spot, v = prices.on_demand + prices.time_value, prices.spot[0] + prices.time_value, prices.time_value
    h1, a1 = hz[1][:, None], adv[0, 0]
    start, end = ticks
    off = 0
    for n in range(start + 1, end + 1):
        value, off = _tail(value, off, reach, end - n, k)
        work = n * k - sigma[off:]
        flip = value[:, ::-1, 0:1, :]
        ev = hh * flip + (1 - hh) * (adv * value[:, :, NEXT_BIN, :] + (1 - adv) * value)
        # On spot, losing availability loses the instance: the next tick starts with nothing held.
        spot_next = [
            h1 * value[0, 0, 0][None, :]
            + (1 - h1) * (a1 * value[1 + i, 1][NEXT_BIN] + (1 - a1) * value[1 + i, 1])
            for i in range(nr)
        ]
        idle = v * k * u + _shift(ev[0], k)  # (2, NB, S)
        q_od: dict[int, np.ndarray] = {}
        q_spot: dict[int, np.ndarray] = {}
        for o in overheads:
            paid = min(o, k)
            rest = index.get(o - paid, 0)
            done_now = (work <= k - paid)[None, None, :]
            cost_done = ((paid + np.maximum(work, 0)) * u).astype(np.float32)
            q_od[o] = np.where(done_now, od * cost_done, od * k * u + _shift(ev[1 + nr + rest], paid))
            q_spot[o] = np.where(done_now[0], spot * cost_done, spot * k * u + _shift(spot_next[rest], paid))
        new = np.empty_like(value)
        j = end - n
        act = actions[j] if j < keep else None
        cache: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = {}
        for cls, od_o, spot_o in (
            [(0, d, d)]
            + [(1 + i, d, r) for i, r in enumerate(rests)]
            + [(1 + nr + i, r, d) for i, r in enumerate(rests)]
        ):
            for a in (0, 1):
                key = (a, od_o, spot_o if a else d)
                if key not in cache:
                    q = q_od[od_o][a]
                    best = np.minimum(idle[a], q)
                    choice = (q < idle[a]).astype(np.int8)
                    if a == 1:
                        qs = q_spot[spot_o]
                        choice = np.where(qs < best, np.int8(2), choice)
                        best = np.minimum(best, qs)
                    cache[key] = (best, choice)
                new[cls, a] = cache[key][0]
                if act is not None:
                    act[cls, a, :, off:] = cache[key][1]
        value = new
    return _padded(value, off, size), actions


def _joint_expect(pa: np.ndarray, pb: np.ndarray, n: int, x: np.ndarray) -> np.ndarray:
    """`x` (m, n, n, S) expected over the next joint state: pool a's transitions `pa`, then pool b's `pb`."""
    m, size = x.shape[0], x.shape[-1]
    y = np.matmul(pa, x.reshape(m, n, n * size)).reshape(m, n, n, size).transpose(0, 2, 1, 3)
    y = np.matmul(pb, y.reshape(m, n, n * size)).reshape(m, n, n, size)
    return y.transpose(0, 2, 1, 3)


def _joint_dp(
    hazards: Sequence[np.ndarray],
    ticks: tuple[int, int],
    lo: int,
    size: int,
    k: int,
    d: int,
    u: float,
    prices: _Prices,
    terminal: np.ndarray | None,
    keep: int,
    reach: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """`_single_dp` for two pools at once (see `JointPlan` for the classes and actions)."""
    rests = overhead_rests(d, k)
    nr = len(rests)
    index = {r: i for i, r in enumerate(rests)}
    n_classes, n = 1 + 3 * nr, 2 * NC
    sigma = lo + np.arange(size)
    f32 = np.float32
    pa, pb = (coarse_transitions(h).astype(f32) for h in hazards)
    value = np.full((n_classes, n, n, size), INF, dtype=f32) if terminal is None else terminal
    actions = np.zeros((keep, n_classes, n, n, size), dtype=np.int8)
    available = (np.zeros((n, 1, 1), bool), np.zeros((1, n, 1), bool))
    available[0][NC:] = True
    available[1][:, NC:] = True
    overheads = sorted(set(rests) | {d})
    v = prices.time_value
    od = prices.on_demand + v
    spot = [p + v for p in prices.spot]
    start, end = ticks
    off = 0
    for t in range(start + 1, end + 1):
        value, off = _tail(value, off, reach, end - t, k)
        work = t * k - sigma[off:]
        # What the next tick is worth from each class; on spot, a pool whose run ends leaves nothing.
        spot_values = [
            np.where(available[p], value[1 + nr + p * nr + i], value[0]) for p in (0, 1) for i in range(nr)
        ]
        ev = _joint_expect(pa, pb, n, np.concatenate([value[: 1 + nr], np.stack(spot_values)]))
        idle = v * k * u + _shift(ev[0], k)
        q_od: dict[int, np.ndarray] = {}
        q_spot: dict[tuple[int, int], np.ndarray] = {}
        for o in overheads:
            paid = min(o, k)
            rest = index.get(o - paid, 0)
            done_now = work <= k - paid
            cost_done = ((paid + np.maximum(work, 0)) * u).astype(np.float32)
            q_od[o] = np.where(done_now, od * cost_done, od * k * u + _shift(ev[1 + rest], paid))
            for p in (0, 1):
                q = np.where(
                    done_now, spot[p] * cost_done, spot[p] * k * u + _shift(ev[1 + nr + p * nr + rest], paid)
                )
                q_spot[p, o] = np.where(available[p], q, INF)
        new = np.empty_like(value)
        j = end - t
        for cls in range(n_classes):
            od_o, spot_o = d, [d, d]
            if 1 <= cls <= nr:
                od_o = rests[cls - 1]
            elif cls > nr:
                p, i = divmod(cls - 1 - nr, nr)
                spot_o[p] = rests[i]
            best = np.minimum(idle, q_od[od_o])
            act = (q_od[od_o] < idle).astype(np.int8) if j < keep else None
            for p in (0, 1):
                q = q_spot[p, spot_o[p]]
                if act is not None:
                    act[q < best] = 2 + p
                np.minimum(best, q, out=best)
            new[cls] = best
            if act is not None:
                actions[j, cls, ..., off:] = act
        value = new
    return _padded(value, off, size), actions


def _far_terminal(
    h: Horizon,
    dp: Callable[..., tuple[np.ndarray, np.ndarray]],
    hazards: Any,
    prices: _Prices,
    tick_hours: float,
    u: float,
    rests: Sequence[int],
    size: int,
    on_fine: Callable[[np.ndarray, list[int], int], np.ndarray],
) -> np.ndarray | None:
    """The fine grid's terminal value: the far grid's (`dp` on its steps, `hazards` per step) at the
    junction, on the fine grid's slack units (u hours, `size` from `h.lo`) and classes; None without a
    far grid. `on_fine(far, near, far_rests)` maps the far grid's classes and states to the fine grid's,
    `near[i]` being the far grid's overhead rest nearest the fine grid's rest i (`rests`)."""
    if not h.step:
        return None
    far_u = h.step * tick_hours / h.far_k
    far, _ = dp(hazards, (0, h.far_steps), 0, h.far_slack + 1, h.far_k, h.far_d, far_u, prices, None, 0)
    far_rests = overhead_rests(h.far_d, h.far_k)
    near = [_nearest(far_rests, r * u, far_u) for r in rests]
    return _on_slack(on_fine(far, near, len(far_rests)), h.lo, size, u, far_u, h.lost_ticks * tick_hours)


class _Planned:
    """What `Plan` and `JointPlan` share: the grids, the first tick, the kept actions and values."""

    horizon: Horizon
    first_tick: int
    actions: np.ndarray
    value: np.ndarray
    k: int
    slack: int
    cut: int  # ticks left out at the far end (`collapse`): the plan's slack is cut * k units less
    ceiling: float  # the most a plan that meets its deadline can cost (`meets_deadline`)

    def _set_ceiling(self, tick_hours: float, prices: _Prices) -> None:
        dearest = max(prices.on_demand, *prices.spot) + prices.time_value
        self.ceiling = 1.01 * self.planned_ticks * tick_hours * dearest + 1e-6  # float32's rounding

    def meets_deadline(self, value: float) -> bool:
        """False when a value of the plan (`expected_cost`) holds its sentinel for a missed deadline:
        `INF`, weighted by the chance of the miss. That is more than the job could spend running every
        tick to the plan's deadline at its dearest price (and the time value), which no plan that meets
        the deadline can cost. Such a value is no cost to show anyone: the plan only weighs misses by
        it, to take the action likeliest to meet the deadline."""
        return value <= self.ceiling

    @property
    def planned_ticks(self) -> int:
        """The ticks the plan's grids cover, from its first to its (collapsed) deadline."""
        return self.first_tick - self.cut

    def _slack_index(self, slack: int, j: int = 0) -> int:
        """The index of `slack` at the plan's tick `j` (0: the first), within what the job can reach
        by then (see `fine_values`)."""
        reach = self.actions.shape[-1] - 1
        return max(0, reach - j * self.k, min(slack - self.cut * self.k - self.horizon.lo, reach))

    def _tick_index(self, ticks: int) -> int:
        j = self.first_tick - ticks
        if not 0 <= j < self.actions.shape[0]:
            raise ValueError(f"this plan kept only its first {self.actions.shape[0]} ticks' actions")
        return j

    @property
    def kept_ticks(self) -> int:
        """How many ticks from the first the plan's actions cover (plan again after them)."""
        return int(self.actions.shape[0])

    @property
    def work(self) -> tuple[int, int]:
        """(fine values, far values) the plan computed: what bounds its time."""
        per_cell = int(np.prod(self.value.shape[:-1]))
        return self.horizon.values(self.slack, self.k, per_cell)


class Plan(_Planned):
    """The cheapest action for every (ticks left, slack, instance held, availability, run age) of one
    pool, by backward induction on the grids of `split_horizon`. Costs are in $ at the given prices, plus
    `time_value_per_hour` for every hour the job is unfinished."""

    def __init__(
        self,
        hazards: np.ndarray,
        ticks: int,
        slack_units: int,
        k: int,
        d: int,
        spot_price: float,
        on_demand_price: float,
        tick_hours: float,
        keep_all: bool = True,
        *,
        time_value_per_hour: float = 0.0,
        fine_budget: int = FINE_BUDGET,
        far_budget: int = FAR_BUDGET,
        max_fine_ticks: int = MAX_FINE_TICKS,
    ) -> None:
        """`keep_all`: keep the actions of every fine tick (a simulated run looks them up as it goes);
        without it only the first tick's, which is all a single decision needs."""
        self.k, self.d, self.first_tick = k, d, ticks
        self.cut = collapse(ticks, slack_units, k, d, tick_hours)
        ticks, slack_units = ticks - self.cut, slack_units - self.cut * k
        self.slack = slack_units
        self.rests = overhead_rests(d, k)
        nr = len(self.rests)
        self.spot_class = {r: 1 + i for i, r in enumerate(self.rests)}
        self.od_class = {r: 1 + nr + i for i, r in enumerate(self.rests)}
        per_cell = (1 + 2 * nr) * 2 * NB
        h = self.horizon = split_horizon(
            ticks, slack_units, k, d, tick_hours, per_cell, fine_budget, far_budget, max_fine_ticks
        )
        prices = _Prices((spot_price,), on_demand_price, time_value_per_hour)
        self._set_ceiling(tick_hours, prices)
        u, size = tick_hours / k, slack_units - h.lo + 1

        def on_fine(far: np.ndarray, near: list[int], fnr: int) -> np.ndarray:
            cmap = [0] + [1 + i for i in near] + [1 + fnr + i for i in near]
            return far[cmap][:, :, [step_bin(b, h.step) for b in range(NB)]]

        stretched = stretch_hazards(hazards, h.step) if h.step else hazards
        terminal = _far_terminal(h, _single_dp, stretched, prices, tick_hours, u, self.rests, size, on_fine)
        self.value, self.actions = _single_dp(
            hazards,
            (ticks - h.fine_ticks, ticks),
            h.lo,
            size,
            k,
            d,
            u,
            prices,
            terminal,
            h.fine_ticks if keep_all else 1,
            size - 1,
        )

    def holding(self, placement: Market, overhead_left_hours: float, unit_hours: float) -> int:
        """The plan's class for what the job holds now (on spot only while that spot is available)."""
        rest = round(overhead_left_hours / unit_hours)
        if placement is Market.SPOT:
            return self.spot_class.get(rest, self.spot_class[0])
        if placement is Market.ON_DEMAND:
            return self.od_class.get(rest, self.od_class[0])
        return 0

    def choose(self, ticks: int, cls: int, available: int, bin_: int, slack: int) -> int:
        """0 wait, 1 on-demand, 2 spot."""
        j = self._tick_index(ticks)
        return int(self.actions[j, cls, available, bin_, self._slack_index(slack, j)])

    def expected_cost(self, cls: int, available: int, bin_: int, slack: int) -> float:
        """The plan's expected cost (money and time value) from its first tick."""
        return float(self.value[cls, available, bin_, self._slack_index(slack)])


class JointPlan(_Planned):
    """`Plan` for two pools at once, pools independent. The state is both pools' (availability, coarse
    bin) and the slack; the classes are: nothing held (0), on-demand with overhead rest i (1 + i), spot in
    pool p with rest i (1 + nr + p * nr + i). Actions: 0 wait, 1 on-demand, 2 spot in pool 0, 3 spot in
    pool 1. Spot in a pool is lost when that pool's run ends: the job then holds nothing, whatever the
    other pool has. Only the first `keep_ticks` ticks' actions are kept (at most the fine grid's)."""

    def __init__(
        self,
        hazards: Sequence[np.ndarray],  # per pool, (2, NC)
        ticks: int,
        slack_units: int,
        k: int,
        d: int,
        spot_prices: Sequence[float],
        on_demand_price: float,
        tick_hours: float,
        keep_ticks: int,
        *,
        time_value_per_hour: float = 0.0,
        fine_budget: int = FINE_BUDGET,
        far_budget: int = FAR_BUDGET,
        max_fine_ticks: int = MAX_FINE_TICKS,
    ) -> None:
        if len(hazards) != 2 or len(spot_prices) != 2:
            raise ValueError("a joint plan is for two pools")
        self.rests = overhead_rests(d, k)
        nr = self.nr = len(self.rests)
        self.rest_index = {r: i for i, r in enumerate(self.rests)}
        self.k, self.first_tick = k, ticks
        self.cut = collapse(ticks, slack_units, k, d, tick_hours)
        ticks, slack_units = ticks - self.cut, slack_units - self.cut * k
        self.slack = slack_units
        n = 2 * NC
        per_cell = (1 + 3 * nr) * n * n
        h = self.horizon = split_horizon(
            ticks, slack_units, k, d, tick_hours, per_cell, fine_budget, far_budget, max_fine_ticks
        )
        prices = _Prices(tuple(spot_prices), on_demand_price, time_value_per_hour)
        self._set_ceiling(tick_hours, prices)
        u, size = tick_hours / k, slack_units - h.lo + 1

        def on_fine(far: np.ndarray, near: list[int], fnr: int) -> np.ndarray:
            cmap = [0] + [1 + i for i in near] + [1 + fnr + p * fnr + i for p in (0, 1) for i in near]
            smap = [a * NC + step_coarse_bin(b, h.step) for a in (0, 1) for b in range(NC)]
            return far[cmap][:, smap][:, :, smap]

        stretched = [stretch_coarse(x, h.step) for x in hazards] if h.step else hazards
        terminal = _far_terminal(h, _joint_dp, stretched, prices, tick_hours, u, self.rests, size, on_fine)
        keep = max(1, min(keep_ticks, h.fine_ticks))
        self.value, self.actions = _joint_dp(
            hazards, (ticks - h.fine_ticks, ticks), h.lo, size, k, d, u, prices, terminal, keep, size - 1
        )
        self.keep = keep

    def holding(
        self, placement: Market, pool: int | None, overhead_left_hours: float, unit_hours: float
    ) -> int:
        i = self.rest_index.get(round(overhead_left_hours / unit_hours), self.rest_index[0])
        if placement is Market.SPOT and pool is not None:
            return 1 + self.nr + pool * self.nr + i
        if placement is Market.ON_DEMAND:
            return 1 + i
        return 0

    def choose(self, ticks: int, cls: int, states: Sequence[int], slack: int) -> int:
        """`states`: each pool's available * NC + coarse bin. 0 wait, 1 on-demand, 2 + p spot in pool p."""
        j = self._tick_index(ticks)
        return int(self.actions[j, cls, states[0], states[1], self._slack_index(slack, j)])

    def expected_cost(self, cls: int, states: Sequence[int], slack: int) -> float:
        """The plan's expected cost (money and time value) from its first tick."""
        return float(self.value[cls, states[0], states[1], self._slack_index(slack)])
