"""The capacity policy: where a job runs (spot in which pool, on-demand, or wait), decided from its needs
and the pools' availability. Pure (numpy in the plans).

- `model`: the policy's model: a job's needs (`JobNeeds`), markets, choices and the rules every policy
  shares (the on-demand safety net, the slack grid); no numpy;
- `availability`: a pool's availability as the plans see it (`AvailabilityHistory`, hazards, joint states);
- `plans`: the dynamic programmes over time and slack, for one pool and for two at once;
- `rules`: the rules both of SpotGuard's policies follow: the plan's grid and its making, the two pools a
  joint plan covers, the wait beside spot, spot's cost per hour of work;
- `planner`: SpotGuard's policy, `choose_capacity`: the plan's answer, the safety net, the waits;
- `simulated`: the same policy as the simulator runs it (`SpotGuardPolicy`);
- `decision`: the answer (`PlacementDecision`), which the job records.

This file imports nothing, so that the model loads without numpy.
"""
