"""The capacity advisor: where each launch of a job goes, decided by the capacity policy on the pools of
its cluster, and the pool facts the jobs path learns on the way.

`decide` is asked before every launch (first attempt, resubmission, each retry) and, for jobs with a
deadline, on every reconcile tick: it reads the cluster's pools (one ledger Query), tells the policy what
the job needs (`domain.jobs.placement.job_needs`: GPUs, work left at its measured rate, its measured
restart overhead, the deadline, what it holds now) and completes the policy's answer, a
`PlacementDecision` with the policy's fields, into the one the job records: spot in a pool, on-demand
in the cluster's on-demand pool of that instance type, or a wait of the policy's length. Jobs without
pools (a cluster with no capacity providers, Fargate, `options.capacity: fixed`, CPU jobs) get None:
the request as submitted, as before.

What the jobs path learns is written on the pools as observations (`domain.pools.Observation`): a task
that starts running (spot was there), an interruption, RunTask's capacity failures, ECS refusing the
pool's capacity provider (detached from the cluster since the sweep: all its pools), a task that waited
for an instance past its bound, Auto Scaling's launch failures and successful launches. A failure backs
the pool off at once, so the decision that follows goes elsewhere.

A move needs evidence. A launch may go to a spot pool whose backoff has merely expired (the job waits
anyway; a failure marks the pool again), but a decision asked for a running job (any trigger but
"launch": reconcile's) may lead to a move, which stops a healthy task: there a spot pool counts as
available only when `PoolRecord.confirmed_at` says so (its newest fact is available, e.g. Auto Scaling's
"EC2 Instance Launch Successful", or it has no fact yet). The pool the job runs in is its own evidence.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from spotguard.domain.capacity.decision import PlacementDecision
from spotguard.domain.capacity.model import Market
from spotguard.domain.jobs.endings import avoidance
from spotguard.domain.jobs.model import Attempt, Job, JobState, revised
from spotguard.domain.jobs.placement import job_needs
from spotguard.domain.jobs.task_events import PoolEvent
from spotguard.domain.pools import (
    Observation,
    PoolRecord,
    Refreshed,
    Source,
    by_name,
    on_demand_pool,
    pool_options,
)
from spotguard.ports import JobStore, LaunchPlacement, PoolMarks, PoolObservations
from spotguard.usecases.pools import PoolService, failure_reason

if TYPE_CHECKING:  # the planner needs numpy: loaded at the first decision, not at a cold start
    from spotguard.domain.capacity.planner import PoolOption

TICK_HOURS = 1 / 6  # the policy's tick: 10 minutes, the resolution of the traces it was built on
MOVE_DECISION_SECONDS = 1800  # a move's decision is followed by the launch after it this long at most
NO_POOL_RECHECK_SECONDS = 900  # a job no pool can serve asks again this often (pools may be added)
log = logging.getLogger(__name__)


class PlacementAdvisor(LaunchPlacement, PoolObservations):
    """Both capacity ports over the cluster's pools: where each launch goes (the engine's
    `LaunchPlacement`), and what the jobs path learns of the pools and their discovery
    (`PoolObservations`, for JobService and Reconciler)."""

    def __init__(
        self,
        book: PoolService,
        store: JobStore,
        clock: Callable[[], datetime],
        clusters: Sequence[str] = (),
    ) -> None:
        self.book, self.store, self.clock = book, store, clock
        self.clusters = tuple(clusters)

    # ------------------------------------------------------------------------------------ decisions
    def decide(self, job: Job, trigger: str) -> PlacementDecision | None:
        if not _policy_places(job):
            return None
        return self._decide(job, trigger, self.book.pools(job.request.cluster_name))

    def _decide(self, job: Job, trigger: str, pools: Sequence[PoolRecord]) -> PlacementDecision | None:
        if not pools:
            return None
        now = self.clock()
        carried = job.placement
        if (
            trigger == "launch"
            and carried is not None
            and carried.trigger in ("move", "warning")
            and (now - carried.at).total_seconds() < MOVE_DECISION_SECONDS
        ):
            pool = by_name(pools).get(carried.pool or "")
            if pool is not None and pool.available_at(now):
                return carried  # the move's own decision, for the launch it stopped the task for
        from spotguard.domain.capacity.planner import choose_capacity  # numpy, at the first decision

        live = job.live_attempt if trigger != "launch" else None
        needs = job_needs(
            job.gpus,
            self.store.checkpoints(job.checkpoint_uri),
            [(a.number, a.launched_at) for a in job.attempts],
            job.options.work_hours,
            job.created_at,
            job.options.deadline,
            now,
        )
        held = _held(live)
        named = by_name(pools)
        here = live.pool if live is not None and held is Market.SPOT else None
        options = [
            replace(o, available=False)
            if _avoided(job, named[o.name], now)
            or _unconfirmed(trigger, named[o.name], here, now)
            or not holds(named[o.name], job.options.nodes)
            else o
            for o in pool_options(pools, now, TICK_HOURS)
        ]
        asked = replace(
            needs,
            placement=held,
            pool=here,
            overhead_left_hours=_overhead_left(live, needs.restart_hours, now),
            waited_hours=_waited_hours(job, now),
        )
        answer = choose_capacity(asked, options, TICK_HOURS)
        asked_about: dict[str, Any] = {
            "at": now,
            "trigger": trigger,
            "work_left_hours": round(needs.work_left_hours, 4),
            "time_left_hours": round(needs.time_left_hours, 4) if needs.time_left_hours is not None else None,
            "restart_hours": round(needs.restart_hours, 4),
        }
        if job.options.nodes > 1 and answer.expected_cost is not None:
            # the plan prices one instance; a gang holds one an node
            asked_about["expected_cost"] = round(answer.expected_cost * job.options.nodes, 4)
        placed = self._placed(job, answer.model_copy(update=asked_about), pools, options, now)
        # model_copy does not validate: the completed decision is checked once, as a new one would be
        return PlacementDecision.model_validate(placed.model_dump())

    def replacement(self, job: Job) -> tuple[PlacementDecision, str] | None:
        """The next attempt's decision, made at a warning on the live attempt's host: on the job as the
        stop will leave it (the instance and its pool avoided, no placement carried), as a launch."""
        live = job.live_attempt
        if live is None:
            return None
        if not _policy_places(job):
            return None
        pools = self.book.pools(job.request.cluster_name)  # read once: the decision and its pool's group
        after_stop = revised(job, placement=None, move=None, **avoidance(job, live, self.clock()))
        decision = self._decide(after_stop, "launch", pools)
        if decision is None:
            return None
        pool = by_name(pools).get(decision.pool or "")
        return decision, (pool.auto_scaling_group if pool is not None else "")

    def _placed(
        self,
        job: Job,
        answer: PlacementDecision,
        pools: Sequence[PoolRecord],
        options: Sequence[PoolOption],
        now: datetime,
    ) -> PlacementDecision:
        """The policy's answer completed into a decision the launch can carry out: the pool's capacity
        provider, type and zone."""
        named = by_name(pools)
        if answer.placement is Market.SPOT and answer.pool in named:
            return _in_pool(answer, named[answer.pool], Market.SPOT, answer.reason)
        if answer.placement is Market.ON_DEMAND:
            spot_twin = named.get(answer.instance_pool or "")
            zone = spot_twin.availability_zone if spot_twin else None
            wanted = spot_twin.instance_type if spot_twin else None
            room = [p for p in pools if holds(p, job.options.nodes)]  # a gang: groups that hold it
            pool = (on_demand_pool(room, wanted, now, zone) if wanted else None) or _any_on_demand(
                room, job.gpus, now
            )
            if pool is not None:
                return _in_pool(answer, pool, Market.ON_DEMAND, answer.reason)
            spot = [o for o in options if o.available and o.gpus_per_instance >= job.gpus]
            missing = f"{answer.reason}, but the cluster has no on-demand pool for {job.gpus} GPU(s)"
            if spot:
                best = min(spot, key=lambda o: (o.spot_price / o.gpus_per_instance, o.name))
                return _in_pool(answer, named[best.name], Market.SPOT, f"{missing}: spot instead")
            why = f"{missing} and no spot now"
            return answer.model_copy(
                update={"placement": Market.NONE, "pool": None, "reason": why[:500], "recheck_seconds": 300}
            )
        return answer.model_copy(
            update={
                "placement": Market.NONE,
                "pool": None,
                "recheck_seconds": answer.recheck_seconds if answer.servable else NO_POOL_RECHECK_SECONDS,
            }
        )

    # ---------------------------------------------------------------------------- what is learnt
    def launch_failed(self, job: Job, reason: str) -> None:
        if job.placement is not None and job.placement.pool:
            self._record(job.request.cluster_name, job.placement.pool, False, "runtask", reason)

    def provider_refused(self, job: Job, reason: str) -> None:
        """ECS refused the decision's capacity provider (not associated with the cluster, not ACTIVE):
        every pool of that provider is marked unavailable (it backs off as a failure does, until
        discovery, which no longer finds a detached provider, marks its pools gone)."""
        placed = job.placement
        if placed is None or not placed.capacity_provider:
            return
        cluster = job.request.cluster_name
        names = {p.name for p in self.book.pools(cluster) if p.capacity_provider == placed.capacity_provider}
        for name in sorted(names | ({placed.pool} if placed.pool else set())):
            self._record(cluster, name, False, "provider-refused", reason)

    def provisioning_timed_out(self, job: Job) -> None:
        live = job.live_attempt
        if live is not None and live.pool:
            why = f"task {live.task_arn.rsplit('/', 1)[-1]} got no instance"
            self._record(job.request.cluster_name, live.pool, False, "provisioning-timeout", why)

    def task_seen(self, before: Job | None, after: Job) -> None:
        """What a write of the job taught about its pool (`before`: the job the write was computed on,
        `after`: the job written; JobEngine.on_written): spot was there (the task started), or was
        taken away (the attempt was interrupted)."""
        old = {a.number: a for a in (before.attempts if before else [])}
        for a in after.attempts:
            was = old.get(a.number)
            if a.pool is None or a.market != "spot":
                continue
            if a.started_at is not None and (was is None or was.started_at is None):
                self._record(
                    after.request.cluster_name, a.pool, True, "launch", a.task_arn.rsplit("/", 1)[-1]
                )
            if a.interrupted_by and (was is None or not was.interrupted_by) and a.outcome == "resubmit":
                self._record(after.request.cluster_name, a.pool, False, "interruption", a.interrupted_by)

    def still_running(self, job: Job) -> None:
        """A fact per reconcile tick while a spot attempt runs: a run longer than a fact holds in the
        pool's history (domain.pools.HOLD_HOURS) is then a long run, not a gap. The caller has ECS's
        word that the attempt's task runs now (reconcile's DescribeTasks): the job record's status may
        lag behind its events."""
        live = job.live_attempt
        if live is not None and live.pool and live.market == "spot":
            now = self.clock()
            self._record(job.request.cluster_name, live.pool, True, "run", f"{now:%Y-%m-%dT%H:%M}", at=now)

    def pool_event(self, ev: PoolEvent) -> PoolMarks:
        """Auto Scaling's launch failure (the pools are backed off) or successful launch (capacity was
        there: the backoff ends, and a move may go there) for a group's pools in a zone, weighed by its
        time: the fact is kept at the event's time, and it holds now only where the pool, with all its
        facts in time order, says so (a failure older than a launch seen after it, or whose backoff is
        over, backs nothing off; a launch older than a failure after it is no evidence)."""
        source: Source = "launch-success" if ev.available else "launch-failure"
        fact = Observation(at=ev.at, available=ev.available, source=source, detail=ev.message)
        now = self.clock()
        kept: list[tuple[str, str]] = []
        in_effect: list[tuple[str, str]] = []
        for cluster in self.clusters:
            for pool in self.book.record_group_fact(cluster, ev.group, fact, availability_zone=ev.zone):
                kept.append((cluster, pool.name))
                if pool.confirmed_at(now) if ev.available else not pool.available_at(now):
                    in_effect.append((cluster, pool.name))
        return PoolMarks(kept=tuple(kept), in_effect=tuple(in_effect))

    def refresh(self, clusters: Sequence[str]) -> list[Refreshed]:
        """Discover each cluster's pools again. One cluster's discovery failing stops no other's, and
        loses none of what is known of it (its pools stay as stored); every failure, whole or in part
        (a spot price), is logged with its reason and comes back in its cluster's `errors`, which
        reconcile counts."""
        now = self.clock()
        out: list[Refreshed] = []
        for cluster in clusters or self.clusters:
            try:
                out.append(self.book.refresh(cluster, now))
            except Exception as exc:
                line = f"cluster {cluster}: discovery failed: {failure_reason(exc)}"
                log.exception("%s; its pools stay as they were", line)
                out.append(Refreshed(cluster=cluster, errors=(line,)))
        return out

    def _record(
        self,
        cluster: str,
        pool: str,
        available: bool,
        source: Source,
        detail: str,
        at: datetime | None = None,
    ) -> None:
        fact = Observation(at=at or self.clock(), available=available, source=source, detail=detail)
        self.book.record_fact(cluster, pool, fact)


# -------------------------------------------------------------------------------------------- helpers
def _in_pool(answer: PlacementDecision, pool: PoolRecord, market: Market, reason: str) -> PlacementDecision:
    """The answer placed in `pool`: its capacity provider, and its type and zone to pin where the
    provider spans several. On spot, the pool is also the one whose instance type is used."""
    return answer.model_copy(
        update={
            "placement": market,
            "pool": pool.name,
            "instance_pool": pool.name if market is Market.SPOT else answer.instance_pool,
            "capacity_provider": pool.capacity_provider,
            "instance_type": pool.instance_type,
            "availability_zone": pool.availability_zone,
            "constrain_type": pool.constrain_type,
            "constrain_zone": pool.constrain_zone,
            "reason": reason[:500],
        }
    )


def holds(pool: PoolRecord, nodes: int) -> bool:
    """The pool's group can hold a gang of `nodes` instances (its MaxSize; unknown: assumed so)."""
    return nodes <= 1 or pool.max_instances is None or pool.max_instances >= nodes


def _any_on_demand(pools: Sequence[PoolRecord], gpus: int, now: datetime) -> PoolRecord | None:
    """The cheapest on-demand pool per GPU with room for the job, when none has the type the plan chose."""
    fits = [
        p for p in pools if p.market == "on-demand" and p.gpus_per_instance >= gpus and p.available_at(now)
    ]
    return min(
        fits,
        key=lambda p: ((p.on_demand_price or float("inf")) / max(p.gpus_per_instance, 1), p.name),
        default=None,
    )


def _held(live: Attempt | None) -> Market:
    if live is None or live.last_status != "RUNNING":
        return Market.NONE
    return {"spot": Market.SPOT, "on-demand": Market.ON_DEMAND}.get(live.market or "", Market.NONE)


def _overhead_left(live: Attempt | None, restart_hours: float, now: datetime) -> float:
    """Restart overhead the running attempt has still to pay (it is paid from its launch on)."""
    if live is None or live.last_status != "RUNNING":
        return 0.0
    return max(0.0, restart_hours - (now - live.launched_at).total_seconds() / 3600)


def _waited_hours(job: Job, now: datetime) -> float:
    """Hours since the job last ran (since it was submitted, if it never did)."""
    if job.state is JobState.RUNNING:
        return 0.0
    ends = [a.stopped_at for a in job.attempts if a.stopped_at is not None]
    since = max(ends) if ends else job.created_at
    return max(0.0, (now - since).total_seconds() / 3600)


def _unconfirmed(trigger: str, pool: PoolRecord, held: str | None, now: datetime) -> bool:
    """A spot pool a decision that may move a running job (any trigger but "launch") stays off: one
    without evidence of capacity since its last failure (`PoolRecord.confirmed_at`). The pool the job
    holds is exempt (its own task is there); a launch takes any pool not backed off, as before."""
    return trigger != "launch" and pool.name != held and not pool.confirmed_at(now)


def _avoided(job: Job, pool: PoolRecord, now: datetime) -> bool:
    """A pool the job stays off for now (interrupted there lately: `options.avoid_pool_seconds`)."""
    where = (pool.instance_type, pool.availability_zone)
    return any(p.until > now and (p.instance_type, p.availability_zone) == where for p in job.avoid_pools)


def _policy_places(job: Job) -> bool:
    """The policy places the job's launches: capacity auto, not Fargate, GPUs (others run as submitted)."""
    return job.options.capacity == "auto" and not job.request.fargate and job.gpus >= 1
