"""SpotGuard's own capacity policy: plan the cheapest way to the deadline from what each pool has done.

Each pool's availability is modelled as alternating runs (spot available / not) whose chance of ending
depends on how long the run has lasted so far (a semi-Markov model: "hazard by age"). The hazards come
from the pool's own history, decayed so that old behaviour counts less, and smoothed towards a prior
while there is little history. Given the model, the job's work left, the time left and the restart
overhead, `Plan` solves exactly, by dynamic programming over (ticks left, slack left), which action
minimises the expected cost of finishing in time: wait, spot, or on-demand. That one computation weighs
everything the simpler rules cannot: a spot run that is likely to end before its restart overhead is
paid back, an outage that is likely to last (go on-demand now rather than later), how much slack the
rest of the job needs, and the prices. The shared safety net (`on_demand_needed`) still has the last word,
so a wrong model can cost money but never a deadline that on-demand could meet.

With several pools, `JointPlan` solves the same problem over two pools' states at once (each pool its
own runs, on coarser age bins to keep it fast): it knows that losing spot in one pool means a restart, in
the other pool if that one has spot then, and when moving pools is worth it. The two are picked by
`pick_two`: the pool the job holds (else the cheapest per hour of work that has spot now), and the
cheapest per hour of work of the rest. The simulator's policy and the Lambdas' `choose_capacity` use the
same rule.

numpy is needed here (and only here in the core package).

Longer than the layer's other modules (about 700 lines) on purpose: the history model, the two exact
plans and the policy share their grids and their bookkeeping, and the tests tie that bookkeeping to the
simulator's (tests/unit/test_planner_exact.py); split, the pieces could drift apart unseen. The capacity
issue reworks the plan, and splits it where the new shape shows its seams.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from spotguard.domain.capacity import EPS, Choice, Placement, Situation, on_demand_needed, slack_grid

# Run ages (ticks, the current one included) at which the hazard bins start. Bin b covers
# [AGE_BINS[b], AGE_BINS[b+1]); the last is open. Narrow at first, where runs end most often.
AGE_BINS = (1, 2, 3, 4, 5, 6, 8, 10, 13, 17, 22, 29, 38, 50, 66, 88)
NB = len(AGE_BINS)
_WIDTH = np.array([AGE_BINS[i + 1] - AGE_BINS[i] for i in range(NB - 1)] + [0], dtype=float)
ADVANCE = np.where(_WIDTH > 0, 1.0 / np.maximum(_WIDTH, 1.0), 0.0)  # chance per tick to reach the next bin
NEXT_BIN = np.minimum(np.arange(NB) + 1, NB - 1)
INF = 1e12


def age_bin(age: int) -> int:
    b = 0
    while b + 1 < NB and age >= AGE_BINS[b + 1]:
        b += 1
    return b


class AvailabilityHistory:
    """One pool's availability, tick by tick, as decayed counts of how long runs last.

    `exposure[s, b]` counts ticks spent in a run of state s (0 unavailable, 1 available) at age bin b;
    `ends[s, b]` counts runs that ended there. The hazard of bin b is ends / exposure, smoothed towards
    the prior (a run of state s ends with chance 1/prior_mean_ticks[s] per tick) with weight `prior_ticks`.
    """

    def __init__(
        self,
        tick_hours: float,
        half_life_hours: float = 168.0,
        prior_mean_hours: tuple[float, float] = (1.0, 2.0),
        prior_ticks: float = 3.0,
        heavy_tailed_prior: bool = True,
    ) -> None:
        if tick_hours <= 0 or half_life_hours <= 0:
            raise ValueError("tick and half-life must be positive")
        self.tick_hours = tick_hours
        self.decay = 0.5 ** (tick_hours / half_life_hours)
        # The prior: heavy-tailed runs (the longer a run has lasted, the longer it is likely to last), a
        # hazard of 1 / (age + scale) per tick, the scale set so that a fresh run has the prior mean.
        ages = np.array(AGE_BINS, dtype=float) + (_WIDTH - 1).clip(0) / 2
        self.prior = np.stack(
            [
                np.full(NB, tick_hours / max(h, tick_hours))
                if not heavy_tailed_prior
                else 1.0 / (ages + max(h / tick_hours, 1.0))
                for h in prior_mean_hours
            ]
        )
        self.prior_ticks = prior_ticks
        self.exposure = np.zeros((2, NB))
        self.ends = np.zeros((2, NB))
        self.state: int | None = None
        self.age = 0

    def observe(self, available: bool) -> None:
        a = int(bool(available))
        self.exposure *= self.decay
        self.ends *= self.decay
        if self.state is None:
            self.state, self.age = a, 1
        elif a == self.state:
            self.age += 1
        else:
            self.ends[self.state, age_bin(self.age)] += 1.0
            self.state, self.age = a, 1
        self.exposure[a, age_bin(self.age)] += 1.0

    def observe_all(self, ticks: Sequence[bool]) -> None:
        for a in ticks:
            self.observe(a)

    def bin_if(self, available: bool) -> int:
        """The age bin of the current run if it is in state `available`, else 0: a run just starting."""
        return age_bin(self.age) if self.state == int(available) else 0

    def gap(self) -> None:
        """Observation stopped for a while: the current run's age is no longer known."""
        self.state, self.age = None, 0

    def hazards(self) -> np.ndarray:
        k = self.prior_ticks
        seen = self.exposure + k
        prior = self.prior
        h = np.where(seen > 0, (self.ends + k * prior) / np.maximum(seen, 1e-12), prior)
        return np.clip(h, 1e-4, 0.98)

    def expected_spot_ticks(self) -> float:
        """Expected ticks spot lasts from now, this one included (from the hazards): the rest of the
        current run if it is an available one, else a whole fresh run."""
        h = self.hazards()[1]
        age = self.age if self.state == 1 else 1
        total, survive = 1.0, 1.0
        for _ in range(400):
            survive *= 1.0 - h[age_bin(age)]
            total += survive
            age += 1
            if survive < 1e-4:
                break
        return total


def overhead_rests(d: int, k: int) -> list[int]:
    """Overhead still to pay at a tick boundary after a launch (D units, K per tick): D - jK while
    positive, and 0."""
    return sorted({max(0, d - j * k) for j in range(1, d // k + 2)} | {0})


def _shift(x: np.ndarray, k: int) -> np.ndarray:
    """out[..., s] = x[..., s - k]: spending k units of slack; below zero is out of reach."""
    if k == 0:
        return x
    out = np.full_like(x, INF)
    out[..., k:] = x[..., :-k]
    return out


class Plan:
    """The optimal action for every (ticks left, slack, instance held, availability, run age), for one
    hazard model, by backward induction. Slack (time left minus work left) is counted in units of
    u = tick / K, chosen so that the restart overhead is a whole number D of units. An idle tick spends
    K units of slack; a launch spends D (at most K per tick). Costs are in $ at the given prices."""

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
    ) -> None:
        """`keep_all`: keep the actions of every tick (a simulated run looks them up as it goes); without
        it only the first tick's are kept, which is all a single decision needs, in a fraction of the
        memory."""
        self.k, self.d = k, d
        self.first_tick = ticks
        self.rests = overhead_rests(d, k)
        nr = len(self.rests)
        self.spot_class = {r: 1 + i for i, r in enumerate(self.rests)}
        self.od_class = {r: 1 + nr + i for i, r in enumerate(self.rests)}
        n_classes = 1 + 2 * nr
        size = slack_units + 1
        u = tick_hours / k
        sigma = np.arange(size)
        hazards = hazards.astype(np.float32)
        hh = hazards[None, :, :, None]  # (1, 2, NB, 1)
        adv = ADVANCE.astype(np.float32)[None, None, :, None]
        value = np.full((n_classes, 2, NB, size), INF, dtype=np.float32)
        self.actions = np.zeros((ticks if keep_all else 1, n_classes, 2, NB, size), dtype=np.int8)
        overheads = sorted(set(self.rests) | {d})
        for n in range(1, ticks + 1):
            work = n * k - sigma  # units of work left
            # Expected value of each (class, availability now) over next tick's availability.
            flip = value[:, ::-1, 0:1, :]
            ev = hh * flip + (1 - hh) * (adv * value[:, :, NEXT_BIN, :] + (1 - adv) * value)
            # On spot, losing availability loses the instance: the next tick starts with nothing held.
            h1 = hazards[1][:, None]
            a1 = adv[0, 0]
            spot_next = {
                r: h1 * value[0, 0, 0][None, :]
                + (1 - h1) * (a1 * value[c, 1][NEXT_BIN] + (1 - a1) * value[c, 1])
                for r, c in self.spot_class.items()
            }
            idle = _shift(ev[0], k)  # (2, NB, S)
            q_od: dict[int, np.ndarray] = {}
            q_spot: dict[int, np.ndarray] = {}
            for o in overheads:
                paid = min(o, k)
                rest = o - paid if (o - paid) in self.rests else 0
                done_now = (work <= k - paid)[None, None, :]
                cost_done = (paid + np.maximum(work, 0)) * u
                q_od[o] = np.where(
                    done_now,
                    on_demand_price * cost_done,
                    on_demand_price * k * u + _shift(ev[self.od_class[rest]], paid),
                )
                q_spot[o] = np.where(
                    done_now[0],
                    spot_price * cost_done,
                    spot_price * k * u + _shift(spot_next[rest], paid),
                )
            new = np.empty_like(value)
            act = self.actions[n - 1 if keep_all else 0]
            best_cache: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = {}
            for cls, od_o, spot_o in (
                [(0, d, d)]
                + [(c, d, r) for r, c in self.spot_class.items()]
                + [(c, r, d) for r, c in self.od_class.items()]
            ):
                for a in (0, 1):
                    key = (a, od_o, spot_o if a else d)
                    if key not in best_cache:
                        q = q_od[od_o][a]
                        best = np.minimum(idle[a], q)
                        choice = (q < idle[a]).astype(np.int8)
                        if a == 1:
                            qs = q_spot[spot_o]
                            choice = np.where(qs < best, np.int8(2), choice)
                            best = np.minimum(best, qs)
                        best_cache[key] = (best, choice)
                    new[cls, a], act[cls, a] = best_cache[key]
            value = new
        self.value = value

    def holding(self, placement: Placement, overhead_left_hours: float, unit_hours: float) -> int:
        """The plan's class for what the job holds now (on spot only while that spot is available)."""
        rest = round(overhead_left_hours / unit_hours)
        if placement is Placement.SPOT:
            return self.spot_class.get(rest, self.spot_class[0])
        if placement is Placement.ON_DEMAND:
            return self.od_class.get(rest, self.od_class[0])
        return 0

    def choose(self, ticks: int, cls: int, available: int, bin_: int, slack: int) -> int:
        """0 wait, 1 on-demand, 2 spot."""
        slack = max(0, min(slack, self.actions.shape[-1] - 1))
        if self.actions.shape[0] == 1:
            if ticks != self.first_tick:
                raise ValueError("this plan kept only its first tick's actions")
            return int(self.actions[0, cls, available, bin_, slack])
        ticks = max(1, min(ticks, self.actions.shape[0]))
        return int(self.actions[ticks - 1, cls, available, bin_, slack])


# The joint plan's coarse age bins: unions of the fine ones above (so the same counts serve both).
COARSE = ((0,), (1, 2), (3, 4, 5), (6, 7, 8), (9, 10, 11), (12, 13, 14, 15))
NC = len(COARSE)
_CWIDTH = [AGE_BINS[COARSE[i + 1][0]] - AGE_BINS[COARSE[i][0]] for i in range(NC - 1)] + [0]
COARSE_ADVANCE = np.array([1.0 / w if w else 0.0 for w in _CWIDTH])
COARSE_NEXT = np.minimum(np.arange(NC) + 1, NC - 1)
COARSE_OF = np.array([next(c for c, g in enumerate(COARSE) if f in g) for f in range(NB)])


def coarse_hazards(history: AvailabilityHistory) -> np.ndarray:
    """(2, NC): the history's hazards on the coarse bins, from the same decayed counts and prior."""
    k = history.prior_ticks
    out = np.zeros((2, NC))
    for c, group in enumerate(COARSE):
        g = list(group)
        ends = history.ends[:, g].sum(1) + k * history.prior[:, g].mean(1)
        out[:, c] = ends / (history.exposure[:, g].sum(1) + k)
    return np.clip(out, 1e-4, 0.98)


def coarse_transitions(hazards: np.ndarray) -> np.ndarray:
    """(2NC, 2NC): one pool's chance to go from (available, coarse bin) to the next tick's."""
    n = 2 * NC
    p = np.zeros((n, n))
    for a in (0, 1):
        for b in range(NC):
            s, h = a * NC + b, hazards[a, b]
            p[s, (1 - a) * NC] += h
            p[s, a * NC + COARSE_NEXT[b]] += (1 - h) * COARSE_ADVANCE[b]
            p[s, a * NC + b] += (1 - h) * (1 - COARSE_ADVANCE[b])
    return p


def joint_state(history: AvailabilityHistory, available: bool) -> int:
    """A pool's state in the joint plan: availability and the coarse bin of its current run."""
    return int(available) * NC + COARSE_OF[history.bin_if(available)]


def pick_two(costs: Sequence[float], available: Sequence[bool], held: int | None) -> list[int]:
    """The two pools (indices) a joint plan covers: the one the job holds, else the cheapest that has spot
    now, else the cheapest; then the cheapest of the rest. `costs`: spot $ per hour of work, by pool."""
    if len(costs) < 2 or len(available) != len(costs):
        raise ValueError("a joint plan needs two pools or more, each with its availability")
    order = sorted(range(len(costs)), key=lambda i: (costs[i], i))
    first = held if held is not None else next((i for i in order if available[i]), order[0])
    return [first, next(i for i in order if i != first)]


class JointPlan:
    """`Plan` for two pools at once, pools independent. The state is both pools' (availability, coarse
    bin) and the slack; the classes are: nothing held (0), on-demand with overhead rest i (1 + i), spot in
    pool p with rest i (1 + nr + p * nr + i). Actions: 0 wait, 1 on-demand, 2 spot in pool 0, 3 spot in
    pool 1. Spot in a pool is lost when that pool's run ends: the job then holds nothing, whatever the
    other pool has. Only the first `keep_ticks` ticks' actions are kept (until the next replan)."""

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
    ) -> None:
        if len(hazards) != 2 or len(spot_prices) != 2:
            raise ValueError("a joint plan is for two pools")
        self.rests = overhead_rests(d, k)
        nr = self.nr = len(self.rests)
        rest_index = {r: i for i, r in enumerate(self.rests)}
        self.rest_index = rest_index
        n_classes, n, size = 1 + 3 * nr, 2 * NC, slack_units + 1
        u = tick_hours / k
        sigma = np.arange(size)
        f32 = np.float32
        pa, pb = (coarse_transitions(h).astype(f32) for h in hazards)
        value = np.full((n_classes, n, n, size), INF, dtype=f32)
        self.first_tick = ticks
        self.keep = max(1, min(keep_ticks, ticks))
        self.actions = np.zeros((self.keep, n_classes, n, n, size), dtype=np.int8)
        available = (np.zeros((n, 1, 1), bool), np.zeros((1, n, 1), bool))
        available[0][NC:] = True
        available[1][:, NC:] = True
        overheads = sorted(set(self.rests) | {d})

        def expect(x: np.ndarray) -> np.ndarray:  # (m, n, n, S): expected over the next joint state
            m = x.shape[0]
            y = np.matmul(pa, x.reshape(m, n, n * size)).reshape(m, n, n, size).transpose(0, 2, 1, 3)
            y = np.matmul(pb, y.reshape(m, n, n * size)).reshape(m, n, n, size)
            return y.transpose(0, 2, 1, 3)

        for t in range(1, ticks + 1):
            work = t * k - sigma
            # What the next tick is worth from each class; on spot, a pool whose run ends leaves nothing.
            spot_values = [
                np.where(available[p], value[1 + nr + p * nr + i], value[0])
                for p in (0, 1)
                for i in range(nr)
            ]
            ev = expect(np.concatenate([value[: 1 + nr], np.stack(spot_values)]))
            idle = _shift(ev[0], k)
            q_od: dict[int, np.ndarray] = {}
            q_spot: dict[tuple[int, int], np.ndarray] = {}
            for o in overheads:
                paid = min(o, k)
                rest = rest_index.get(o - paid, 0)
                done_now = work <= k - paid
                cost_done = (paid + np.maximum(work, 0)) * u
                q_od[o] = np.where(
                    done_now,
                    on_demand_price * cost_done,
                    on_demand_price * k * u + _shift(ev[1 + rest], paid),
                )
                for p in (0, 1):
                    q = np.where(
                        done_now,
                        spot_prices[p] * cost_done,
                        spot_prices[p] * k * u + _shift(ev[1 + nr + p * nr + rest], paid),
                    )
                    q_spot[p, o] = np.where(available[p], q, INF)
            new = np.empty_like(value)
            keep = t > ticks - self.keep
            for cls in range(n_classes):
                od_o, spot_o = d, [d, d]
                if 1 <= cls <= nr:
                    od_o = self.rests[cls - 1]
                elif cls > nr:
                    p, i = divmod(cls - 1 - nr, nr)
                    spot_o[p] = self.rests[i]
                best = np.minimum(idle, q_od[od_o])
                act = (q_od[od_o] < idle).astype(np.int8) if keep else None
                for p in (0, 1):
                    q = q_spot[p, spot_o[p]]
                    if act is not None:
                        act[q < best] = 2 + p
                    np.minimum(best, q, out=best)
                new[cls] = best
                if act is not None:
                    self.actions[ticks - t, cls] = act
            value = new
        self.value = value  # the expected cost from the first tick, by (class, states, slack)

    def holding(
        self, placement: Placement, pool: int | None, overhead_left_hours: float, unit_hours: float
    ) -> int:
        i = self.rest_index.get(round(overhead_left_hours / unit_hours), self.rest_index[0])
        if placement is Placement.SPOT and pool is not None:
            return 1 + self.nr + pool * self.nr + i
        if placement is Placement.ON_DEMAND:
            return 1 + i
        return 0

    def choose(self, ticks: int, cls: int, states: Sequence[int], slack: int) -> int:
        """`states`: each pool's available * NC + coarse bin. 0 wait, 1 on-demand, 2 + p spot in pool p."""
        j = self.first_tick - ticks
        if not 0 <= j < self.keep:
            raise ValueError("this plan kept only its first ticks' actions")
        slack = max(0, min(slack, self.actions.shape[-1] - 1))
        return int(self.actions[j, cls, states[0], states[1], slack])


def expected_run_hours(
    history: AvailabilityHistory | None, tick_hours: float, placement_score: int | None = None
) -> float:
    """How long spot in a pool is expected to last from now: from its history, else from the prior,
    scaled by the placement score (5 is neutral) when there is one."""
    hours = (history or AvailabilityHistory(tick_hours)).expected_spot_ticks() * tick_hours
    if history is None and placement_score is not None:
        hours *= max(1, min(placement_score, 10)) / 5
    return hours


def spot_cost_per_work_hour(
    spot_price: float,
    history: AvailabilityHistory | None,
    restart_hours: float,
    tick_hours: float,
    placement_score: int | None = None,
) -> float:
    """The spot price per hour of progress: each run pays its restart overhead before it makes any."""
    run = expected_run_hours(history, tick_hours, placement_score)
    return spot_price * (run + restart_hours) / max(run, tick_hours)


class SpotGuardPolicy:
    """The planner above as a `CapacityPolicy`, for the simulator and for the Lambdas' decisions: `Plan`
    for one pool, `JointPlan` over the two pools `pick_two` picks for several."""

    name = "spotguard"

    def __init__(
        self,
        spot_price: float = 0.9731,
        on_demand_price: float = 3.06,
        half_life_hours: float = 168.0,
        replan_hours: float = 12.0,
    ) -> None:
        self.spot_price, self.on_demand_price = spot_price, on_demand_price
        self.half_life_hours, self.replan_hours = half_life_hours, replan_hours
        self.past: Sequence[Sequence[bool]] = ()
        self.past_is_recent = False

    def remember(self, past: Sequence[Sequence[bool]], recent: bool = True) -> None:
        """Each pool's availability before the job started (oldest first), if it was being watched.
        `recent`: the last tick given is the one just before the job's first, so the current run's age
        is known; otherwise the history only teaches how long runs last."""
        self.past, self.past_is_recent = past, recent

    def reset(self, job_hours: float, deadline_hours: float, restart_hours: float) -> None:
        self.committed = False
        self.pools: list[AvailabilityHistory] = []
        self.plan: Plan | None = None
        self.joint: JointPlan | None = None
        self.pair: list[int] = []  # the pools the joint plan covers
        self.planned_at = -math.inf

    def _start(self, s: Situation) -> None:
        n = len(s.spot_available)
        self.pools = [AvailabilityHistory(s.tick_hours, self.half_life_hours) for _ in range(n)]
        past = [list(p) for p in self.past]
        span = min((len(p) for p in past), default=0)
        if len(past) != n or span == 0:
            return
        for ticks, hist in zip(past, self.pools, strict=True):
            hist.observe_all(ticks[len(ticks) - span :])  # the same recent stretch for every pool
            if not self.past_is_recent:
                hist.gap()

    def decide(self, s: Situation) -> Choice:
        if not self.pools:
            self._start(s)
        for hist, a in zip(self.pools, s.spot_available, strict=True):
            hist.observe(a)
        if self.committed or on_demand_needed(s):
            self.committed = True
            return Choice(Placement.ON_DEMAND, None, "the deadline needs on-demand from here on")
        k = slack_grid(s.tick_hours, s.restart_hours)
        unit = s.tick_hours / k
        ticks = round(s.time_left_hours / s.tick_hours)
        slack = math.floor((s.time_left_hours - s.work_left_hours) / unit + 1e-6)
        due = s.elapsed_hours - self.planned_at >= self.replan_hours - EPS
        if len(self.pools) >= 2:
            return self._decide_joint(s, k, ticks, slack, due)
        if self.plan is None or due:
            self.plan = Plan(
                self.pools[0].hazards(),
                ticks,
                slack,
                k,
                round(s.restart_hours / unit),
                self.spot_price,
                self.on_demand_price,
                s.tick_hours,
            )
            self.planned_at = s.elapsed_hours
        cls = self.plan.holding(s.placement, s.overhead_left_hours, unit)
        available = s.spot_available[0]
        action = self.plan.choose(ticks, cls, int(available), self.pools[0].bin_if(available), slack)
        return self._choice(s, action, 0 if action == 2 else None)

    @staticmethod
    def _choice(s: Situation, action: int, pool: int | None) -> Choice:
        """A plan's action (0 wait, 1 on-demand, else spot in `pool`) as the policy's choice."""
        if action == 0:
            return Choice(Placement.NONE, None, "wait: spot is expected back in time")
        if action == 1:
            return Choice(
                Placement.ON_DEMAND, None, "on-demand: the plan expects spot too scarce for the deadline"
            )
        if s.placement is Placement.SPOT and s.pool == pool:
            return Choice(Placement.SPOT, pool, "keep spot: the plan expects it to pay")
        return Choice(Placement.SPOT, pool, "spot: expected to last long enough to pay its restart")

    def _decide_joint(self, s: Situation, k: int, ticks: int, slack: int, due: bool) -> Choice:
        unit = s.tick_hours / k
        held = s.pool if s.placement is Placement.SPOT and s.pool is not None else None
        # With more than two pools, a pool outside the pair that has spot while the pair has none (and
        # the job holds no spot) is worth a new plan now rather than at the next replan.
        idle_elsewhere = (
            held is None and not any(s.spot_available[i] for i in self.pair) and any(s.spot_available)
        )
        if self.joint is None or due or idle_elsewhere or (held is not None and held not in self.pair):
            costs = [
                spot_cost_per_work_hour(self.spot_price, h, s.restart_hours, s.tick_hours) for h in self.pools
            ]
            self.pair = sorted(pick_two(costs, s.spot_available, held))  # the plan is symmetric
            self.joint = JointPlan(
                [coarse_hazards(self.pools[i]) for i in self.pair],
                ticks,
                slack,
                k,
                round(s.restart_hours / unit),
                (self.spot_price, self.spot_price),
                self.on_demand_price,
                s.tick_hours,
                keep_ticks=math.ceil(self.replan_hours / s.tick_hours - EPS) + 1,
            )
            self.planned_at = s.elapsed_hours
        pool = self.pair.index(held) if held is not None else None
        cls = self.joint.holding(s.placement, pool, s.overhead_left_hours, unit)
        states = [joint_state(self.pools[i], s.spot_available[i]) for i in self.pair]
        action = self.joint.choose(ticks, cls, states, slack)
        return self._choice(s, action, self.pair[action - 2] if action >= 2 else None)


# ------------------------------------------------------------------------- one decision, for the Lambdas


@dataclass(frozen=True, slots=True)
class PoolOption:
    """A spot pool the job could run in: one instance type in one availability zone."""

    name: str
    gpus_per_instance: int
    spot_price: float  # $/h per instance
    on_demand_price: float  # $/h per instance of the same type
    available: bool  # spot can be had there now (the latest launch or capacity answer)
    history: AvailabilityHistory | None = None  # SpotGuard's own record of the pool
    placement_score: int | None = None  # EC2 spot placement score, 1 (unlikely) to 10 (likely)


@dataclass(frozen=True, slots=True)
class JobNeeds:
    gpus: int
    work_left_hours: float  # from the newest checkpoint's progress
    restart_hours: float  # measured: launch to the first step after a restore
    time_left_hours: float | None  # to the deadline; None: no deadline
    placement: Placement = Placement.NONE
    pool: str | None = None  # the spot pool it runs in, on spot
    overhead_left_hours: float = 0.0
    waited_hours: float = 0.0  # since it last ran
    max_wait_hours: float = 1.0  # without a deadline: how long to wait for spot before on-demand


@dataclass(frozen=True, slots=True)
class CapacityDecision:
    placement: Placement
    pool: str | None  # the spot pool, on spot
    instance_pool: str  # the pool whose instance type to use (for on-demand too)
    reason: str


def choose_capacity(
    job: JobNeeds, pools: Sequence[PoolOption], tick_hours: float = 1 / 6
) -> CapacityDecision:
    """Where the job should run now: spot in which pool, on-demand, or wait. With a deadline the plan
    decides (and the safety net keeps any deadline on-demand can meet): with several pools, the joint
    plan over the pool the job holds and the cheapest per hour of work (or the two cheapest); without a
    deadline, the cheapest spot now, else a bounded wait, then on-demand."""
    if job.gpus < 1 or job.work_left_hours <= 0 or job.restart_hours < 0 or tick_hours <= 0:
        raise ValueError("a job needs at least 1 GPU, work left > 0 and a restart overhead >= 0")
    fits = [p for p in pools if p.gpus_per_instance >= job.gpus]
    if not fits:
        raise ValueError(f"no candidate pool has {job.gpus} GPUs per instance")
    on_demand = min(fits, key=lambda p: (p.on_demand_price / p.gpus_per_instance, p.name))
    per_work_hour = {
        p: spot_cost_per_work_hour(p.spot_price, p.history, job.restart_hours, tick_hours, p.placement_score)
        for p in fits
    }

    spot = sorted(
        (p for p in fits if p.available),
        key=lambda p: (per_work_hour[p], -(p.placement_score or 0), p.name),
    )
    held = next((p for p in spot if job.placement is Placement.SPOT and p.name == job.pool), None)
    best = held or (spot[0] if spot else None)

    def run_spot(pool: PoolOption, reason: str) -> CapacityDecision:
        return CapacityDecision(Placement.SPOT, pool.name, pool.name, reason)

    def run_on_demand(reason: str) -> CapacityDecision:
        return CapacityDecision(Placement.ON_DEMAND, None, on_demand.name, reason)

    if job.time_left_hours is None:
        if best is not None and (
            job.placement is not Placement.ON_DEMAND or per_work_hour[best] < on_demand.on_demand_price
        ):
            return run_spot(best, f"no deadline: spot in {best.name} is the cheapest now")
        if job.placement is Placement.ON_DEMAND:
            return run_on_demand("no deadline: on-demand until spot is worth its restart")
        if job.waited_hours < job.max_wait_hours - EPS:
            return CapacityDecision(
                Placement.NONE,
                None,
                on_demand.name,
                f"no deadline: wait for spot ({job.waited_hours:g} of {job.max_wait_hours:g} h waited)",
            )
        return run_on_demand(f"no deadline: no spot after {job.max_wait_hours:g} h of waiting")

    situation = Situation(
        elapsed_hours=0.0,
        work_left_hours=job.work_left_hours,
        time_left_hours=job.time_left_hours,
        placement=job.placement,
        pool=0 if held is not None else None,
        overhead_left_hours=job.overhead_left_hours,
        spot_available=(best is not None,),
        tick_hours=tick_hours,
        restart_hours=job.restart_hours,
    )
    if job.time_left_hours < job.work_left_hours + job.restart_hours - EPS:
        return run_on_demand("the deadline cannot be met any more: on-demand, to finish as soon as possible")
    if on_demand_needed(situation):
        return run_on_demand("the deadline needs on-demand from here on")
    k = slack_grid(tick_hours, job.restart_hours)
    unit = tick_hours / k
    ticks = max(1, round(job.time_left_hours / tick_hours))
    slack = max(0, math.floor((job.time_left_hours - job.work_left_hours) / unit + 1e-6))
    holds = Placement.SPOT if held is not None else Placement.NONE
    if job.placement is Placement.ON_DEMAND:
        holds = Placement.ON_DEMAND
    d = round(job.restart_hours / unit)
    if len(fits) >= 2:
        # The joint plan over the two pools that matter most (the rule the simulated policy follows).
        ranked = sorted(fits, key=lambda p: p.name)
        two = [
            ranked[i]
            for i in pick_two(
                [per_work_hour[p] for p in ranked],
                [p.available for p in ranked],
                ranked.index(held) if held is not None else None,
            )
        ]
        histories = [p.history or AvailabilityHistory(tick_hours) for p in two]
        joint = JointPlan(
            [coarse_hazards(h) for h in histories],
            ticks,
            slack,
            k,
            d,
            [p.spot_price for p in two],
            on_demand.on_demand_price,
            tick_hours,
            keep_ticks=1,
        )
        cls = joint.holding(holds, 0 if held is not None else None, job.overhead_left_hours, unit)
        states = [joint_state(h, p.available) for p, h in zip(two, histories, strict=True)]
        action = joint.choose(ticks, cls, states, slack)
        chosen = two[action - 2] if action >= 2 else None
        spot_reason = f"the plan over {two[0].name} and {two[1].name} expects it to pay best"
    else:
        model = (best or fits[0]).history or AvailabilityHistory(tick_hours)
        spot_price = best.spot_price if best is not None else fits[0].spot_price
        plan = Plan(
            model.hazards(),
            ticks,
            slack,
            k,
            d,
            spot_price,
            on_demand.on_demand_price,
            tick_hours,
            keep_all=False,
        )
        cls = plan.holding(holds, job.overhead_left_hours, unit)
        action = plan.choose(ticks, cls, int(best is not None), model.bin_if(best is not None), slack)
        chosen = best if action == 2 else None
        spot_reason = "expected to last long enough to pay its restart"
    if chosen is not None:
        return run_spot(chosen, f"spot in {chosen.name}: {spot_reason}")
    if action == 1:
        return run_on_demand("on-demand: the plan expects spot too scarce for the deadline")
    return CapacityDecision(Placement.NONE, None, on_demand.name, "wait: spot is expected back in time")
