"""SpotGuard's own capacity policy: plan the cheapest way to the deadline from what each pool has done.
The Lambdas' one decision (`choose_capacity`) is here, the simulator's policy (`SpotGuardPolicy`) in
spotguard.domain.capacity.simulated, and the rules they share (`pick_two`, `build_plan`, `beside_spot`) in
spotguard.domain.capacity.rules, so that they cannot drift between them.

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

from collections.abc import Sequence
from dataclasses import dataclass

from spotguard.domain.capacity.availability import AvailabilityHistory, joint_state
from spotguard.domain.capacity.decision import PlacementDecision
from spotguard.domain.capacity.model import EPS, JobNeeds, Market, Situation, on_demand_needed
from spotguard.domain.capacity.plans import JointPlan, Plan
from spotguard.domain.capacity.rules import (
    Grid,
    beside_spot,
    build_plan,
    default_time_value,
    expected_run_hours,
    pick_two,
    spot_cost_per_work_hour,
    spot_pays,
)

RECHECK_MIN_SECONDS, RECHECK_MAX_SECONDS = 60, 900


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
    c = _candidates(job, fits, tick_hours)
    if job.time_left_hours is None:
        return _without_deadline(job, c)
    net = _safety_net(job, c, tick_hours)
    if net is not None:
        return net
    grid = Grid.of(job.time_left_hours, job.work_left_hours, tick_hours, job.restart_hours)
    holds = Market.SPOT if c.held is not None else Market.NONE
    if job.placement is Market.ON_DEMAND:
        holds = Market.ON_DEMAND
    if len(fits) >= 2:
        planned = _joint_plan(job, c, grid, holds, tick_hours)
    else:
        planned = _single_plan(job, c, grid, holds, tick_hours)
    if not planned.certain:
        return _uncertain(c, planned)
    chosen, action, cost = planned.chosen, planned.action, planned.cost
    if chosen is not None:
        return _run_spot(chosen, f"spot in {chosen.name}: {planned.spot_reason}", cost)
    if action == 1:
        return c.run_on_demand("on-demand: the plan expects spot too scarce for the deadline", cost)
    return _wait(job, c, cost, tick_hours)


@dataclass(frozen=True, slots=True)
class _Candidates:
    """The pools with the job's GPUs (`fits`) as one decision sees them: the on-demand pool (the cheapest
    per GPU), each pool's spot $ per hour of work, the pool whose spot the job holds (None unless it still
    has spot), the best with spot now (the held one, else the cheapest per hour of work), the time value
    per hour, and the tick in seconds."""

    fits: list[PoolOption]
    on_demand: PoolOption
    per_work_hour: dict[PoolOption, float]
    held: PoolOption | None
    best: PoolOption | None
    time_value: float
    tick: float

    def run_on_demand(
        self, reason: str, cost: float | None = None, recheck: float | None = None
    ) -> PlacementDecision:
        """On-demand in the cheapest pool per GPU, asked again after `recheck` seconds (a tick if None)."""
        seconds = self.tick if recheck is None else recheck
        return _decision(Market.ON_DEMAND, None, self.on_demand.name, reason, cost, _recheck(seconds))


def _run_spot(pool: PoolOption, reason: str, cost: float | None = None) -> PlacementDecision:
    return _decision(Market.SPOT, pool.name, pool.name, reason, cost, RECHECK_MAX_SECONDS)


def _candidates(job: JobNeeds, fits: list[PoolOption], tick_hours: float) -> _Candidates:
    tick = tick_hours * 3600
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
    return _Candidates(fits, on_demand, per_work_hour, held, best, time_value, tick)


def _without_deadline(job: JobNeeds, c: _Candidates) -> PlacementDecision:
    """No deadline: the cheapest spot now, else a bounded wait, then on-demand."""
    best = c.best
    if best is not None and (
        job.placement is not Market.ON_DEMAND or c.per_work_hour[best] < c.on_demand.on_demand_price
    ):
        return _run_spot(best, f"no deadline: spot in {best.name} is the cheapest now")
    if job.placement is Market.ON_DEMAND:
        return c.run_on_demand("no deadline: on-demand until spot is worth its restart")
    if job.waited_hours < job.max_wait_hours - EPS:
        return _decision(
            Market.NONE,
            None,
            c.on_demand.name,
            f"no deadline: wait for spot ({job.waited_hours:g} of {job.max_wait_hours:g} h waited)",
            recheck_seconds=_recheck(min(c.tick, (job.max_wait_hours - job.waited_hours) * 3600)),
        )
    return c.run_on_demand(f"no deadline: no spot after {job.max_wait_hours:g} h of waiting")


def _safety_net(job: JobNeeds, c: _Candidates, tick_hours: float) -> PlacementDecision | None:
    """What a job with a deadline does before any plan: stay on the spot it holds when only that can
    still meet the deadline, finish as soon as possible when none can, go on-demand when the deadline
    needs it (`on_demand_needed`); None when the plan decides."""
    held = c.held
    situation = Situation(
        elapsed_hours=0.0,
        work_left_hours=job.work_left_hours,
        time_left_hours=job.time_left_hours,
        placement=job.placement,
        pool=0 if held is not None else None,
        overhead_left_hours=job.overhead_left_hours,
        spot_available=(c.best is not None,),
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
        return _run_spot(
            held, "only the spot instance it holds can still meet the deadline: a move costs a restart"
        )
    if job.time_left_hours < job.work_left_hours + job.restart_hours - EPS:
        if held is not None:
            # running on spot, it finishes soonest where it is: a move to on-demand first pays a restart
            return _run_spot(
                held, "the deadline cannot be met any more: the spot instance it holds finishes soonest"
            )
        return c.run_on_demand(
            "the deadline cannot be met any more: on-demand, to finish as soon as possible",
            recheck=RECHECK_MAX_SECONDS,
        )
    if on_demand_needed(situation):
        return c.run_on_demand("the deadline needs on-demand from here on", recheck=RECHECK_MAX_SECONDS)
    return None


@dataclass(frozen=True, slots=True)
class _Planned:
    """A plan's answer: its action (0 wait, 1 on-demand, else spot), the expected cost, whether it meets
    the deadline for certain, the spot pool it chose (None unless spot), and why spot pays there."""

    action: int
    cost: float
    certain: bool
    chosen: PoolOption | None
    spot_reason: str


def _joint_plan(job: JobNeeds, c: _Candidates, grid: Grid, holds: Market, tick_hours: float) -> _Planned:
    # The joint plan over the two pools that matter most (the rule the simulated policy follows).
    ticks, slack, unit = grid.ticks, grid.slack, grid.unit_hours
    held = c.held
    ranked = sorted(c.fits, key=lambda p: p.name)
    two = [
        ranked[i]
        for i in pick_two(
            [c.per_work_hour[p] for p in ranked],
            [p.available for p in ranked],
            ranked.index(held) if held is not None else None,
        )
    ]
    histories = [p.history or AvailabilityHistory(tick_hours) for p in two]
    joint = build_plan(
        histories, grid, [p.spot_price for p in two], c.on_demand.on_demand_price, tick_hours, c.time_value, 1
    )
    assert isinstance(joint, JointPlan)
    cls = joint.holding(holds, 0 if held is not None else None, job.overhead_left_hours, unit)
    states = [joint_state(h, p.available) for p, h in zip(two, histories, strict=True)]
    action = joint.choose(ticks, cls, states, slack)
    cost = joint.expected_cost(cls, states, slack)
    certain = joint.meets_deadline(cost)
    chosen = two[action - 2] if action >= 2 else None
    spot_reason = f"the plan over {two[0].name} and {two[1].name} expects it to pay best"
    return _Planned(action, cost, certain, chosen, spot_reason)


def _single_plan(job: JobNeeds, c: _Candidates, grid: Grid, holds: Market, tick_hours: float) -> _Planned:
    ticks, slack, unit = grid.ticks, grid.slack, grid.unit_hours
    best, fits = c.best, c.fits
    model = (best or fits[0]).history or AvailabilityHistory(tick_hours)
    spot_price = best.spot_price if best is not None else fits[0].spot_price
    plan = build_plan([model], grid, [spot_price], c.on_demand.on_demand_price, tick_hours, c.time_value, 1)
    assert isinstance(plan, Plan)
    cls = plan.holding(holds, job.overhead_left_hours, unit)
    available, bin_ = int(best is not None), model.bin_if(best is not None)
    action = plan.choose(ticks, cls, available, bin_, slack)
    cost = plan.expected_cost(cls, available, bin_, slack)
    certain = plan.meets_deadline(cost)
    chosen = best if action == 2 else None
    spot_reason = "expected to last long enough to pay its restart"
    return _Planned(action, cost, certain, chosen, spot_reason)


def _uncertain(c: _Candidates, planned: _Planned) -> PlacementDecision:
    # Every action risks the deadline (as the plan's grid counts it: a restart now or after losing
    # spot no longer fits): its value is the sentinel for a miss, weighted by its chance, not a cost.
    # The action is the likeliest to meet the deadline; say so, with no cost.
    missed = "the deadline cannot be met for certain any more"
    chosen = planned.chosen
    if chosen is not None:
        keep = "keep spot" if chosen is c.held else "spot"
        return _run_spot(chosen, f"{missed}: {keep} in {chosen.name}, the likeliest way to meet it")
    if planned.action == 1:
        return c.run_on_demand(f"{missed}: on-demand, the likeliest way to meet it")
    return _decision(
        Market.NONE,
        None,
        c.on_demand.name,
        f"{missed}: wait for spot, the likeliest way to meet it",
        recheck_seconds=_recheck(c.tick),
    )


def _wait(job: JobNeeds, c: _Candidates, cost: float, tick_hours: float) -> PlacementDecision:
    """The plan's wait, where it meets the deadline for certain: as `beside_spot` has it while some pool
    has spot (run there instead, or wait with the figures); on on-demand, the job stays where it is."""
    fits, held = c.fits, c.held
    runs = [expected_run_hours(p.history, tick_hours, p.placement_score) for p in fits]
    # on on-demand the job is not idle: its plan's wait keeps it where it is
    rule = (
        None
        if job.placement is Market.ON_DEMAND
        else beside_spot(
            [p.name for p in fits],
            [c.per_work_hour[p] for p in fits],
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
        return _run_spot(fits[rule.run], rule.reason)
    why = rule.reason if rule is not None else "wait: spot is expected back in time"
    return _decision(Market.NONE, None, c.on_demand.name, why, cost, _recheck(c.tick))
