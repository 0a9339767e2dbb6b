"""The end of a job's running attempt: what its task's stop (a gang's: its last node's) makes of the job,
which succeeds, fails, is cancelled, or is queued to be launched again; and what is kept of it: the
instances and pools to avoid after an interruption, the oldest attempts folded into what they spent."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from spotguard.domain.jobs import gangs
from spotguard.domain.jobs.effects import Effect, LaunchLater, Notify, Snapshot, Step
from spotguard.domain.jobs.launches import retry_delay
from spotguard.domain.jobs.model import (
    KEEP_ATTEMPTS,
    Attempt,
    AvoidedPool,
    FoldedAttempts,
    Job,
    JobState,
    NodeTask,
    replace_attempt,
    revised,
)
from spotguard.domain.jobs.spares import carried_spare
from spotguard.domain.jobs.spend import attempt_spend
from spotguard.domain.jobs.stops import StopVerdict


def attempt_ended(job: Job, updated: Attempt, verdict: StopVerdict, now: datetime) -> Step:
    """The job's running attempt ended (its task stopped; a gang: its last node), `verdict` what that
    means: the job succeeds, fails, is cancelled, or is queued to be launched again."""
    updated = revised(updated, outcome=verdict.outcome, outcome_reason=verdict.reason)
    n = updated.number
    effects: list[Effect] = []
    changes: dict[str, Any] = {}
    if verdict.outcome == "succeeded":
        return Step(
            job=replace_attempt(job, updated, now, state=JobState.SUCCEEDED, last_reason=verdict.reason),
            effects=[Notify(kind="succeeded", message=f"attempt {n}: {verdict.reason}")],
        )
    if verdict.outcome == "cancelled":
        return Step(
            job=replace_attempt(job, updated, now, state=JobState.CANCELLED, last_reason=verdict.reason),
            effects=[Notify(kind="cancelled", message=f"attempt {n}: {verdict.reason}")],
        )
    moved = job.move is not None and job.move.attempt == n and job.move.stop_requested_at is not None
    if updated.abandoned:
        # A gang that did not form: launched again after a wait that grows with each gang in a row that
        # did not form (30 s up to 15 min), where the policy then says (its pool was marked), an attempt
        # that does not count against max_attempts.
        in_a_row = gangs.unformed_in_a_row([*job.attempts[:-1], updated], job.folded.unformed_tail)
        if in_a_row >= job.options.max_attempts:  # bounded, as attempts are: its ledger item too
            why = f"the gang of {updated.nodes} nodes did not form in {in_a_row} tries in a row"
            why += f"; last: {verdict.reason}"
            return Step(
                job=replace_attempt(job, updated, now, state=JobState.GAVE_UP, last_reason=why[:500]),
                effects=[Notify(kind="gave-up", message=why[:500])],
            )
        delay = retry_delay(in_a_row)
        changes = {"move": None, "placement": None, "budget_base": job.budget_base + 1}
        changes |= {
            "retry_at": now + timedelta(seconds=delay),
            "avoid_pools": gangs.unformed_pool(job, updated, now),
        }
        effects = [LaunchLater(launch_try=0, delay_seconds=delay)]
    elif verdict.outcome == "resubmit" and moved and job.move is not None:
        # SpotGuard's own move: not an interruption; the next launch follows the move's decision, marked
        # as the move's (trigger "move") so that the capacity advisor carries it out rather than decide
        # again: a fresh decision a few minutes on, with the stop's minutes spent, could send the job
        # back where it came from, two restarts for nothing.
        updated = revised(updated, outcome_reason=f"moved: {job.move.to.summary()}"[:500])
        carried = job.move.to.model_copy(update={"trigger": "move"})
        changes = {"moves_made": job.moves_made + 1, "move": None, "placement": carried}
    elif verdict.outcome == "resubmit":
        updated = revised(updated, interrupted_by=updated.interrupted_by or verdict.reason)
        effects = [Notify(kind="interrupted", message=f"attempt {n}: {verdict.reason}")]
        # The early replacement decided at the warning where the next attempt goes, and asked an
        # instance of that pool for it: the launch carries that decision out (domain.jobs.spares).
        changes = {**avoidance(job, updated, now), "move": None, "placement": carried_spare(job, n)}
    else:  # failed
        if job.error_retries_used >= job.options.max_error_retries:
            return Step(
                job=replace_attempt(job, updated, now, state=JobState.FAILED, last_reason=verdict.reason),
                effects=[Notify(kind="failed", message=f"attempt {n}: {verdict.reason}")],
            )
        changes = {"error_retries_used": job.error_retries_used + 1, "move": None, "placement": None}
    if job.attempts_used >= job.options.max_attempts and not updated.abandoned:
        used, most = job.attempts_used, job.options.max_attempts
        why = f"{used} attempts used (max_attempts {most}); last: {verdict.reason}"
        return Step(
            job=replace_attempt(job, updated, now, state=JobState.GAVE_UP, last_reason=why),
            effects=[*effects, Notify(kind="gave-up", message=why)],
        )
    return _requeued(job, updated, verdict, changes, effects, now)


def _requeued(
    job: Job,
    updated: Attempt,
    verdict: StopVerdict,
    changes: dict[str, Any],
    effects: list[Effect],
    now: datetime,
) -> Step:
    """The job queued again after its attempt `updated` ended (`verdict`), with the `changes` and
    `effects` its end asks for; EBS mode: snapshotting the attempt's volume first."""
    n = updated.number
    next_state = JobState.SNAPSHOTTING if job.ebs_volume else JobState.QUEUED
    # the ledger item stays small however many times the job (a big gang) comes back
    attempts = [updated if a.number == n else a for a in job.attempts]
    changes["attempts"], changes["folded"] = fold_old(
        gangs.compact(attempts, keep=1), job.folded, job.gpus, now
    )
    updated = next(a for a in changes["attempts"] if a.number == n)  # as compacted (the newest is kept)
    requeued = replace_attempt(
        job,
        updated,
        now,
        state=next_state,
        launch_tries=0,
        last_reason=verdict.reason,
        **{"retry_at": None, **changes},
    )
    if job.ebs_volume:
        effects.append(Snapshot(attempt=n))
    return Step(job=requeued, effects=effects)


def avoidance(job: Job, attempt: Attempt, now: datetime) -> dict[str, Any]:
    """Remember the interrupted instance for good and its spot pool for `avoid_pool_seconds` (the job's
    changes; the early replacement decides at the warning with them, as the launch after the stop will).
    A gang: the instances of the nodes that were lost (domain.jobs.gangs.lost_nodes), and their pool."""
    lost: list[NodeTask] = gangs.lost_nodes(attempt) if attempt.gang else [attempt]
    instances = list(job.avoid_instances)
    for task in lost:
        if task.instance_id and task.instance_id not in instances:
            instances = [*instances, task.instance_id][-20:]
    pools = [p for p in job.avoid_pools if p.until > now]
    for task in lost:
        if task.instance_type and task.availability_zone and job.options.avoid_pool_seconds > 0:
            key = (task.instance_type, task.availability_zone)
            pools = [p for p in pools if (p.instance_type, p.availability_zone) != key]
            pools.append(
                AvoidedPool(
                    instance_type=task.instance_type,
                    availability_zone=task.availability_zone,
                    until=now + timedelta(seconds=job.options.avoid_pool_seconds),
                )
            )
    return {"avoid_instances": instances, "avoid_pools": pools}


def fold_old(
    attempts: list[Attempt], folded: FoldedAttempts, gpus: int, now: datetime
) -> tuple[list[Attempt], FoldedAttempts]:
    """The newest KEEP_ATTEMPTS attempts, and the older ones folded into what they spent (the ledger
    item's bound; domain.jobs.model). Only ended attempts are folded."""
    old = [a for a in attempts[: max(0, len(attempts) - KEEP_ATTEMPTS)] if a.outcome is not None]
    if not old:
        return attempts, folded
    hours, dollars, tail = folded.gpu_hours, folded.dollars, folded.unformed_tail
    for a in old:
        tail = tail + 1 if a.abandoned else 0
        spent = attempt_spend(a, gpus, {}, now)
        hours += spent.gpu_hours
        dollars = None if dollars is None or spent.dollars is None else dollars + spent.dollars
    gone = {a.number for a in old}
    kept = [a for a in attempts if a.number not in gone]
    count = folded.count + len(old)
    return kept, FoldedAttempts(count=count, gpu_hours=round(hours, 4), dollars=dollars, unformed_tail=tail)
