"""SpotGuard's own capacity policy: plan the cheapest way to the deadline from what each pool has done.
About 600 lines: the simulator's policy and the Lambdas' one decision side by side, so that the rule they
share (`pick_two`, `build_plan`) cannot drift between them.

Each pool's availability is modelled as alternating runs whose chance of ending depends on how long the
run has lasted (spotguard.domain.capacity.availability). Given the model, the job's work left, the time left
and the restart overhead, a plan (spotguard.domain.capacity.plans) solves by dynamic programming which action
minimises the expected cost of finishing in time: wait, spot, or on-demand. That one computation weighs
everything the simpler rules cannot: a spot run that is likely to end before its restart overhead is
paid back, an outage that is likely to last (go on-demand now rather than later), how much slack the
rest of the job needs, and the prices. The shared safety net (`on_demand_needed`) still has the last word,
so a wrong model can cost money but never a deadline that on-demand could meet.

The cost is money plus a value of time: `time_value_per_hour` $ for every hour the job is still
unfinished. Its default, `TIME_VALUE_SHARE` = 5% of the on-demand price per hour, is small: the plan
still waits for spot rather than pay on-demand's premium (about two thirds of the on-demand price) unless
the wait is expected to be long (an hour of on-demand work is worth waiting about 13 hours, at 5%), but
it no longer waits while spot is there: without it idle time is free, and with a loose deadline waiting
for an older (likelier to last) spot run looked as good as running now, which no one who submits a job
wants. The share was chosen on that principle, not on the traces; it costs a little money on them
(docs/capacity.md, "Capacity policies on spot traces").

With several pools, `JointPlan` solves the same problem over two pools' states at once: it knows that
losing spot in one pool means a restart, in the other pool if that one has spot then, and when moving
pools is worth it. The two are picked by `pick_two`: the pool the job holds (else the cheapest per hour
of work that has spot now), and the cheapest per hour of work of the rest. The simulator's policy
(`SpotGuardPolicy`) and the Lambdas' `choose_capacity` use the same rule and the same plans, whose work
is bounded whatever the deadline (spotguard.domain.capacity.plans).

numpy is needed here (and only in the planner's modules in the core package).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from spotguard.domain.capacity.availability import AvailabilityHistory, coarse_hazards, joint_state
from spotguard.domain.capacity.decision import PlacementDecision
from spotguard.domain.capacity.model import EPS, Choice, JobNeeds, Market, Situation, on_demand_needed
from spotguard.domain.capacity.plans import JointPlan, Plan, plan_grid

TIME_VALUE_SHARE = 0.05  # the default time value: this share of the on-demand price, per hour unfinished
RECHECK_MIN_SECONDS, RECHECK_MAX_SECONDS = 60, 900
# A plan may wait beside spot only for a pool more than this share cheaper per hour of work (`beside_spot`)
WAIT_MARGIN = 0.25


def default_time_value(on_demand_price: float) -> float:
    return TIME_VALUE_SHARE * on_demand_price


@dataclass(frozen=True, slots=True)
class Grid:
    """A plan's time grid for one decision: `k` units per tick (the restart overhead is `d` units of
    `unit_hours`), the ticks left to the deadline, and the slack (time left beyond the work) in units."""

    k: int
    d: int
    unit_hours: float
    ticks: int
    slack: int

    @classmethod
    def of(
        cls, time_left_hours: float, work_left_hours: float, tick_hours: float, restart_hours: float
    ) -> Grid:
        k, d = plan_grid(tick_hours, restart_hours)
        unit = tick_hours / k
        ticks = max(1, round(time_left_hours / tick_hours))
        slack = max(0, math.floor((time_left_hours - work_left_hours) / unit + 1e-6))
        return cls(k, d, unit, ticks, slack)


def build_plan(
    histories: Sequence[AvailabilityHistory],
    grid: Grid,
    spot_prices: Sequence[float],
    on_demand_price: float,
    tick_hours: float,
    time_value_per_hour: float,
    keep_ticks: int | None,
) -> Plan | JointPlan:
    """The plan over one pool (`Plan`) or two (`JointPlan`), the one way both the Lambdas'
    `choose_capacity` and the simulator's `SpotGuardPolicy` make them. `keep_ticks`: how many ticks'
    actions to keep (a simulated run looks them up as it goes; a single decision needs the first); None:
    every fine tick's."""
    if len(histories) == 1:
        return Plan(
            histories[0].hazards(),
            grid.ticks,
            grid.slack,
            grid.k,
            grid.d,
            spot_prices[0],
            on_demand_price,
            tick_hours,
            keep_all=keep_ticks is None or keep_ticks > 1,
            time_value_per_hour=time_value_per_hour,
        )
    return JointPlan(
        [coarse_hazards(h) for h in histories],
        grid.ticks,
        grid.slack,
        grid.k,
        grid.d,
        spot_prices,
        on_demand_price,
        tick_hours,
        keep_ticks=keep_ticks if keep_ticks is not None else grid.ticks,
        time_value_per_hour=time_value_per_hour,
    )


def pick_two(costs: Sequence[float], available: Sequence[bool], held: int | None) -> list[int]:
    """The two pools (indices) a joint plan covers: the one the job holds, else the cheapest that has spot
    now, else the cheapest; then the cheapest of the rest. `costs`: spot $ per hour of work, by pool."""
    if len(costs) < 2 or len(available) != len(costs):
        raise ValueError("a joint plan needs two pools or more, each with its availability")
    order = sorted(range(len(costs)), key=lambda i: (costs[i], i))
    first = held if held is not None else next((i for i in order if available[i]), order[0])
    return [first, next(i for i in order if i != first)]


@dataclass(frozen=True, slots=True)
class BesideSpot:
    """What becomes of a plan's wait while some pool has spot (`beside_spot`): `run` the pool to run in
    instead, or None when the wait stands; `reason` says why, with the figures."""

    run: int | None
    reason: str


def beside_spot(
    names: Sequence[str],
    costs: Sequence[float],
    available: Sequence[bool],
    pays: Sequence[bool],
    run_hours: Sequence[float],
    back_hours: Sequence[float],
    held: int | None = None,
) -> BesideSpot | None:
    """The rule for a plan's wait, when the job holds nothing or spot (`held`: the pool it holds), while
    a pool it may use has spot now (None when none has). A job is never left idle beside spot for a
    small saving: the wait stands only for a pool more than `WAIT_MARGIN` cheaper per hour of work
    (`costs`) than the best pool with spot (the one it holds, if that pays), or when no pool with spot
    pays back a restart by its own history (`pays`: False only where the pool's record says its spot
    runs are too short, `run_hours` from now). Otherwise the job runs in that best pool. The plan still
    decides when waiting for a much cheaper pool is worth it (`back_hours`: when each pool without spot
    is expected to have it again), and its wait is said with the figures. A pool whose cost is not a
    number is left out. Not for a job on on-demand: it is not idle, and a plan's wait there keeps it
    where it is.

    Why a rule and not the plan alone: the plan prices an idle hour at the time value (5% of on-demand),
    so for a long job a saving of a few percent outweighs hours of waiting, which nobody who submits a
    job wants. Below the margin, price differences between spot pools are within what their prices move
    in a day."""
    priced = [i for i, c in enumerate(costs) if math.isfinite(c)]
    with_spot = [i for i in priced if available[i]]
    if not with_spot:
        return None
    paying = [i for i in with_spot if pays[i]]
    if not paying:
        i = min(with_spot, key=lambda j: (costs[j], j))
        return BesideSpot(
            None,
            f"wait: spot in {names[i]} is expected to last about {run_hours[i]:.1f} h by its record, too "
            "short to pay back a restart",
        )
    best = held if held in paying else min(paying, key=lambda j: (costs[j], j))
    cheaper = [i for i in priced if not available[i] and costs[i] < (1 - WAIT_MARGIN) * costs[best]]
    if cheaper:
        c = min(cheaper, key=lambda j: (costs[j], j))
        share = 1 - costs[c] / costs[best]
        return BesideSpot(
            None,
            f"wait for spot in {names[c]}: ${costs[c]:.3f} per hour of work, {share:.0%} cheaper than "
            f"{names[best]} (${costs[best]:.3f}), which has spot now; expected back in about "
            f"{back_hours[c]:.1f} h",
        )
    return BesideSpot(
        best,
        f"spot in {names[best]} (${costs[best]:.3f} per hour of work): no pool is more than "
        f"{WAIT_MARGIN:.0%} cheaper, so no wait beside spot",
    )


def spot_pays(spot_price: float, on_demand_price: float, run_hours: float, restart_hours: float) -> bool:
    """Whether a spot run of `run_hours` pays back its restart: the run at spot (restart included) costs
    less than the progress it makes (the run less the restart) would on-demand."""
    return spot_price * run_hours < on_demand_price * (run_hours - restart_hours)


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
    """The planner above as a `CapacityPolicy`, for the simulator: `Plan` for one pool, `JointPlan` over
    the two pools `pick_two` picks for several. It plans again every `replan_hours`, or sooner when the
    plan's kept actions (its fine grid) run out."""

    name = "spotguard"

    def __init__(
        self,
        spot_price: float = 0.9731,
        on_demand_price: float = 3.06,
        half_life_hours: float = 168.0,
        replan_hours: float = 12.0,
        time_value_per_hour: float | None = None,
    ) -> None:
        self.spot_price, self.on_demand_price = spot_price, on_demand_price
        self.half_life_hours, self.replan_hours = half_life_hours, replan_hours
        self.time_value = (
            default_time_value(on_demand_price) if time_value_per_hour is None else time_value_per_hour
        )
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

    def _due(self, s: Situation, kept_ticks: int) -> bool:
        since = s.elapsed_hours - self.planned_at
        return since >= self.replan_hours - EPS or round(since / s.tick_hours) >= kept_ticks

    def decide(self, s: Situation) -> Choice:
        if not self.pools:
            self._start(s)
        for hist, a in zip(self.pools, s.spot_available, strict=True):
            hist.observe(a)
        if self.committed or on_demand_needed(s):
            self.committed = True
            return Choice(Market.ON_DEMAND, None, "the deadline needs on-demand from here on")
        grid = Grid.of(s.time_left_hours, s.work_left_hours, s.tick_hours, s.restart_hours)
        if len(self.pools) >= 2:
            return self._decide_joint(s, grid)
        if self.plan is None or self._due(s, self.plan.kept_ticks):
            plan = build_plan(
                self.pools[:1],
                grid,
                (self.spot_price,),
                self.on_demand_price,
                s.tick_hours,
                self.time_value,
                None,
            )
            assert isinstance(plan, Plan)
            self.plan = plan
            self.planned_at = s.elapsed_hours
        cls = self.plan.holding(s.placement, s.overhead_left_hours, grid.unit_hours)
        available = s.spot_available[0]
        bin_ = self.pools[0].bin_if(available)
        action = self.plan.choose(grid.ticks, cls, int(available), bin_, grid.slack)
        certain = self.plan.meets_deadline(self.plan.expected_cost(cls, int(available), bin_, grid.slack))
        return self._choice(s, action, 0 if action == 2 else None, certain)

    def _beside_spot(self, s: Situation) -> BesideSpot | None:
        """`beside_spot` over the simulated pools, all at the policy's one spot price (None on on-demand)."""
        if s.placement is Market.ON_DEMAND:
            return None
        costs = [
            spot_cost_per_work_hour(self.spot_price, h, s.restart_hours, s.tick_hours) for h in self.pools
        ]
        runs = [h.expected_run_ticks(True) * s.tick_hours for h in self.pools]
        return beside_spot(
            [f"pool {i}" for i in range(len(self.pools))],
            costs,
            s.spot_available,
            [spot_pays(self.spot_price, self.on_demand_price, r, s.restart_hours) for r in runs],
            runs,
            [h.expected_run_ticks(False) * s.tick_hours for h in self.pools],
            s.pool if s.placement is Market.SPOT else None,
        )

    def _choice(self, s: Situation, action: int, pool: int | None, certain: bool) -> Choice:
        """A plan's action (0 wait, 1 on-demand, else spot in `pool`) as the policy's choice; a wait
        beside spot as `beside_spot` has it, where the plan meets the deadline for certain (`certain`),
        as `choose_capacity` does."""
        if action == 0:
            rule = self._beside_spot(s) if certain else None
            if rule is not None and rule.run is not None:
                return Choice(Market.SPOT, rule.run, rule.reason)
            return Choice(Market.NONE, None, rule.reason if rule else "wait: spot is expected back in time")
        if action == 1:
            return Choice(
                Market.ON_DEMAND, None, "on-demand: the plan expects spot too scarce for the deadline"
            )
        if s.placement is Market.SPOT and s.pool == pool:
            return Choice(Market.SPOT, pool, "keep spot: the plan expects it to pay")
        return Choice(Market.SPOT, pool, "spot: expected to last long enough to pay its restart")

    def _decide_joint(self, s: Situation, grid: Grid) -> Choice:
        held = s.pool if s.placement is Market.SPOT and s.pool is not None else None
        # With more than two pools, a pool outside the pair that has spot while the pair has none (and
        # the job holds no spot) is worth a new plan now rather than at the next replan.
        idle_elsewhere = (
            held is None and not any(s.spot_available[i] for i in self.pair) and any(s.spot_available)
        )
        if (
            self.joint is None
            or self._due(s, self.joint.kept_ticks)
            or idle_elsewhere
            or (held is not None and held not in self.pair)
        ):
            costs = [
                spot_cost_per_work_hour(self.spot_price, h, s.restart_hours, s.tick_hours) for h in self.pools
            ]
            self.pair = sorted(pick_two(costs, s.spot_available, held))  # the plan is symmetric
            joint = build_plan(
                [self.pools[i] for i in self.pair],
                grid,
                (self.spot_price, self.spot_price),
                self.on_demand_price,
                s.tick_hours,
                self.time_value,
                keep_ticks=math.ceil(self.replan_hours / s.tick_hours - EPS) + 1,
            )
            assert isinstance(joint, JointPlan)
            self.joint = joint
            self.planned_at = s.elapsed_hours
        pool = self.pair.index(held) if held is not None else None
        cls = self.joint.holding(s.placement, pool, s.overhead_left_hours, grid.unit_hours)
        states = [joint_state(self.pools[i], s.spot_available[i]) for i in self.pair]
        action = self.joint.choose(grid.ticks, cls, states, grid.slack)
        certain = self.joint.meets_deadline(self.joint.expected_cost(cls, states, grid.slack))
        return self._choice(s, action, self.pair[action - 2] if action >= 2 else None, certain)


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


def _recheck(seconds: float) -> int:
    return int(min(RECHECK_MAX_SECONDS, max(RECHECK_MIN_SECONDS, round(seconds))))


def _decision(
    placement: Market,
    pool: str | None,
    instance_pool: str | None,
    reason: str,
    expected_cost: float | None = None,
    recheck_seconds: int = RECHECK_MAX_SECONDS,
    servable: bool = True,
) -> PlacementDecision:
    """The policy's answer: a decision with the policy's fields, for the capacity advisor to complete."""
    return PlacementDecision(
        placement=placement,
        pool=pool,
        instance_pool=instance_pool,
        reason=reason[:500],
        expected_cost=expected_cost,
        recheck_seconds=recheck_seconds,
        servable=servable,
    )


def choose_capacity(
    job: JobNeeds, pools: Sequence[PoolOption], tick_hours: float = 1 / 6
) -> PlacementDecision:
    """Where the job should run now: spot in which pool, on-demand, or wait. With a deadline the plan
    decides (and the safety net keeps any deadline on-demand can meet): with several pools, the joint
    plan over the pool the job holds and the cheapest per hour of work (or the two cheapest); without a
    deadline, the cheapest spot now, else a bounded wait, then on-demand. No pool with the job's GPUs:
    NONE, not servable. The answer is a `PlacementDecision` with the policy's fields (its docstring says
    what they mean), made now; the capacity advisor completes it into the decision the job records.

    A job whose work is not known yet (`work_assumed`: no estimate, no measured rate) is planned as half
    the time from submit to its deadline, and its reason says so: the user sees what the decision
    rested on, and that the first commits replace it."""
    decision = _choose(job, pools, tick_hours)
    if not job.work_assumed:
        return decision
    note = (
        f"its work is not known yet (no --work-hours, no rate measured): {job.work_left_hours:.1f} h left "
        "as planned from half the time between submit and the deadline, until its commits measure it"
    )
    said = f"{decision.reason[: 500 - len(note) - 2]}; {note}"
    return decision.model_copy(update={"reason": said})


def _choose(job: JobNeeds, pools: Sequence[PoolOption], tick_hours: float) -> PlacementDecision:
    if job.gpus < 1 or job.work_left_hours <= 0 or job.restart_hours < 0 or tick_hours <= 0:
        raise ValueError("a job needs at least 1 GPU, work left > 0 and a restart overhead >= 0")
    tick = tick_hours * 3600
    fits = [p for p in pools if p.gpus_per_instance >= job.gpus]
    if not fits:
        return _decision(
            Market.NONE,
            None,
            None,
            f"no pool has {job.gpus} GPUs per instance",
            recheck_seconds=RECHECK_MAX_SECONDS,
            servable=False,
        )
    on_demand = min(fits, key=lambda p: (p.on_demand_price / p.gpus_per_instance, p.name))
    time_value = (
        default_time_value(on_demand.on_demand_price)
        if job.time_value_per_hour is None
        else job.time_value_per_hour
    )
    per_work_hour = {
        p: spot_cost_per_work_hour(p.spot_price, p.history, job.restart_hours, tick_hours, p.placement_score)
        for p in fits
    }

    spot = sorted(
        (p for p in fits if p.available),
        key=lambda p: (per_work_hour[p], -(p.placement_score or 0), p.name),
    )
    held = next((p for p in spot if job.placement is Market.SPOT and p.name == job.pool), None)
    best = held or (spot[0] if spot else None)

    def run_spot(pool: PoolOption, reason: str, cost: float | None = None) -> PlacementDecision:
        return _decision(Market.SPOT, pool.name, pool.name, reason, cost, RECHECK_MAX_SECONDS)

    def run_on_demand(reason: str, cost: float | None = None, recheck: float = tick) -> PlacementDecision:
        return _decision(Market.ON_DEMAND, None, on_demand.name, reason, cost, _recheck(recheck))

    if job.time_left_hours is None:
        if best is not None and (
            job.placement is not Market.ON_DEMAND or per_work_hour[best] < on_demand.on_demand_price
        ):
            return run_spot(best, f"no deadline: spot in {best.name} is the cheapest now")
        if job.placement is Market.ON_DEMAND:
            return run_on_demand("no deadline: on-demand until spot is worth its restart")
        if job.waited_hours < job.max_wait_hours - EPS:
            return _decision(
                Market.NONE,
                None,
                on_demand.name,
                f"no deadline: wait for spot ({job.waited_hours:g} of {job.max_wait_hours:g} h waited)",
                recheck_seconds=_recheck(min(tick, (job.max_wait_hours - job.waited_hours) * 3600)),
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
    if held is not None and (
        job.work_left_hours + job.overhead_left_hours - EPS
        <= job.time_left_hours
        < job.work_left_hours + job.restart_hours - EPS
    ):
        # Slower progress than expected took the slack below a restart: any move misses the deadline,
        # the spot instance it holds may still meet it (the simulator never gets here: its slack only
        # shrinks while the job does not run, and its safety net acts the tick before)
        return run_spot(
            held, "only the spot instance it holds can still meet the deadline: a move costs a restart"
        )
    if job.time_left_hours < job.work_left_hours + job.restart_hours - EPS:
        if held is not None:
            # running on spot, it finishes soonest where it is: a move to on-demand first pays a restart
            return run_spot(
                held, "the deadline cannot be met any more: the spot instance it holds finishes soonest"
            )
        return run_on_demand(
            "the deadline cannot be met any more: on-demand, to finish as soon as possible",
            recheck=RECHECK_MAX_SECONDS,
        )
    if on_demand_needed(situation):
        return run_on_demand("the deadline needs on-demand from here on", recheck=RECHECK_MAX_SECONDS)
    grid = Grid.of(job.time_left_hours, job.work_left_hours, tick_hours, job.restart_hours)
    ticks, slack, unit = grid.ticks, grid.slack, grid.unit_hours
    holds = Market.SPOT if held is not None else Market.NONE
    if job.placement is Market.ON_DEMAND:
        holds = Market.ON_DEMAND
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
        joint = build_plan(
            histories, grid, [p.spot_price for p in two], on_demand.on_demand_price, tick_hours, time_value, 1
        )
        assert isinstance(joint, JointPlan)
        cls = joint.holding(holds, 0 if held is not None else None, job.overhead_left_hours, unit)
        states = [joint_state(h, p.available) for p, h in zip(two, histories, strict=True)]
        action = joint.choose(ticks, cls, states, slack)
        cost = joint.expected_cost(cls, states, slack)
        certain = joint.meets_deadline(cost)
        chosen = two[action - 2] if action >= 2 else None
        spot_reason = f"the plan over {two[0].name} and {two[1].name} expects it to pay best"
    else:
        model = (best or fits[0]).history or AvailabilityHistory(tick_hours)
        spot_price = best.spot_price if best is not None else fits[0].spot_price
        plan = build_plan([model], grid, [spot_price], on_demand.on_demand_price, tick_hours, time_value, 1)
        assert isinstance(plan, Plan)
        cls = plan.holding(holds, job.overhead_left_hours, unit)
        available, bin_ = int(best is not None), model.bin_if(best is not None)
        action = plan.choose(ticks, cls, available, bin_, slack)
        cost = plan.expected_cost(cls, available, bin_, slack)
        certain = plan.meets_deadline(cost)
        chosen = best if action == 2 else None
        spot_reason = "expected to last long enough to pay its restart"
    if not certain:
        # Every action risks the deadline (as the plan's grid counts it: a restart now or after losing
        # spot no longer fits): its value is the sentinel for a miss, weighted by its chance, not a cost.
        # The action is the likeliest to meet the deadline; say so, with no cost.
        missed = "the deadline cannot be met for certain any more"
        if chosen is not None:
            keep = "keep spot" if chosen is held else "spot"
            return run_spot(chosen, f"{missed}: {keep} in {chosen.name}, the likeliest way to meet it")
        if action == 1:
            return run_on_demand(f"{missed}: on-demand, the likeliest way to meet it")
        return _decision(
            Market.NONE,
            None,
            on_demand.name,
            f"{missed}: wait for spot, the likeliest way to meet it",
            recheck_seconds=_recheck(tick),
        )
    if chosen is not None:
        return run_spot(chosen, f"spot in {chosen.name}: {spot_reason}", cost)
    if action == 1:
        return run_on_demand("on-demand: the plan expects spot too scarce for the deadline", cost)
    runs = [expected_run_hours(p.history, tick_hours, p.placement_score) for p in fits]
    # on on-demand the job is not idle: its plan's wait keeps it where it is
    rule = (
        None
        if job.placement is Market.ON_DEMAND
        else beside_spot(
            [p.name for p in fits],
            [per_work_hour[p] for p in fits],
            [p.available for p in fits],
            [
                p.history is None or spot_pays(p.spot_price, p.on_demand_price, r, job.restart_hours)
                for p, r in zip(fits, runs, strict=True)
            ],
            runs,
            [
                (p.history or AvailabilityHistory(tick_hours)).expected_run_ticks(False) * tick_hours
                for p in fits
            ],
            fits.index(held) if held is not None else None,
        )
    )
    if rule is not None and rule.run is not None:
        return run_spot(fits[rule.run], rule.reason)
    why = rule.reason if rule is not None else "wait: spot is expected back in time"
    return _decision(Market.NONE, None, on_demand.name, why, cost, _recheck(tick))
