"""SpotGuard's capacity policy as the simulator runs it (`SpotGuardPolicy`): the same plans and rules
as the Lambdas' `choose_capacity` (spotguard.domain.capacity.rules), planned again as the simulated job
goes on rather than at each decision.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from spotguard.domain.capacity.availability import AvailabilityHistory, joint_state
from spotguard.domain.capacity.model import EPS, Choice, Market, Situation, on_demand_needed
from spotguard.domain.capacity.plans import JointPlan, Plan
from spotguard.domain.capacity.rules import (
    BesideSpot,
    Grid,
    beside_spot,
    build_plan,
    default_time_value,
    pick_two,
    spot_cost_per_work_hour,
    spot_pays,
)


class SpotGuardPolicy:
    """The planner (spotguard.domain.capacity.planner) as a `CapacityPolicy`, for the simulator: `Plan` for
    one pool, `JointPlan` over the two pools `pick_two` picks for several. It plans again every
    `replan_hours`, or sooner when the plan's kept actions (its fine grid) run out."""

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
