"""The launch transitions: a queued job launched where the capacity policy decides (or kept waiting as
it says), and RunTask's answer: the attempt started, no capacity for now (queued again, after a growing
delay), or the request refused. Each function takes a job and returns a `Step`."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from spotguard.domain.capacity.decision import PlacementDecision
from spotguard.domain.jobs import gangs
from spotguard.domain.jobs.effects import CapacityWanted, Effect, Launch, Notify, Step, Stop
from spotguard.domain.jobs.model import (
    RETRY_BASE_SECONDS,
    RETRY_MAX_SECONDS,
    Attempt,
    Job,
    JobState,
    bump,
    client_token,
)
from spotguard.domain.jobs.placement import remember


def due(job: Job, now: datetime) -> bool:
    """A queued job whose wait (retry or capacity) is over."""
    return job.state is JobState.QUEUED and (job.retry_at is None or now >= job.retry_at)


def begin_launch(job: Job, now: datetime, decision: PlacementDecision | None = None) -> Step:
    """queued (and due) -> launching, placed as `decision` says (None: the request as submitted). A
    decision to wait keeps the job queued until its recheck instead. A job already launching gets its
    launch again (the Lambda that began it may have died before RunTask answered; the same client token
    returns the same task)."""
    if job.state is JobState.LAUNCHING:
        return Step(job=None, effects=[_launch_effect(job)], note="launch in progress: repeat it")
    if job.state is not JobState.QUEUED:
        return Step(note=f"job is {job.state}, not queued")
    if job.cancel_requested:
        return Step(
            job=bump(job, now, state=JobState.CANCELLED, last_reason="cancelled before it started"),
            effects=[Notify(kind="cancelled", message="cancelled before it started")],
        )
    if job.retry_at is not None and now < job.retry_at:
        return Step(note=f"not due until {job.retry_at.isoformat()}")
    if decision is not None and decision.placement == "none":
        return capacity_wait(job, decision, now)
    changes: dict[str, Any] = {}
    effects: list[Effect] = []
    if decision is not None:
        changes = {"placement": decision, "decisions": remember(job.decisions, decision)}
        effects.append(decision_notice(decision))
    new = bump(
        job, now, state=JobState.LAUNCHING, launch_tries=job.launch_tries + 1, retry_at=None, **changes
    )
    return Step(job=new, effects=[*effects, _launch_effect(new)])


def capacity_wait(job: Job, decision: PlacementDecision, now: datetime) -> Step:
    """The policy says wait (spot is expected back in time, or no pool can serve the job): queued until
    the recheck it asked for, when the retry message the use case scheduled (try `launch_tries + 1`)
    brings it back. Said once per reason, not at every recheck."""
    seconds = max(1, decision.recheck_seconds)
    last = job.decisions[-1] if job.decisions else None
    repeated = last is not None and last.placement == "none" and last.reason == decision.reason
    new = bump(
        job,
        now,
        launch_tries=job.launch_tries + 1,  # a retry message of an earlier wait is now stale
        retry_at=now + timedelta(seconds=seconds),
        placement=None,
        decisions=remember(job.decisions, decision) if not repeated else job.decisions,
        last_reason=f"waiting: {decision.reason}; next decision in {seconds} s",
    )
    effects: list[Effect] = []
    if not repeated:
        effects = [decision_notice(decision), Notify(kind="waiting", message=decision.reason)]
    return Step(job=new, effects=effects)


def decision_notice(decision: PlacementDecision) -> Notify:
    """The decision on the bus (`SpotGuard Job Capacity PlacementDecision`)."""
    return Notify(
        kind="decision",
        message=decision.summary(),
        detail=decision.model_dump(mode="json", exclude={"at"}),
    )


def _launch_effect(job: Job) -> Launch:
    return Launch(
        attempt=job.next_attempt,
        client_token=client_token(job.job_id, job.next_attempt, job.launch_tries),
        resume_from_hint=job.resume_override,
    )


def launch_succeeded(
    job: Job, task_arn: str, token: str, resume_from: str, now: datetime, resubmitted: bool
) -> Step:
    if job.attempt_for(task_arn) is not None:
        return Step(note="this task is already the job's attempt")
    if job.state is not JobState.LAUNCHING:
        # The job moved on (cancelled meanwhile): the task must not run.
        return Step(
            effects=[Stop(cluster=job.request.cluster, task_arn=task_arn, reason=stray_reason(job))],
            note=f"job is {job.state}: stopping the task just started",
        )
    placed = job.placement
    attempt = Attempt(
        number=job.next_attempt,
        task_arn=task_arn,
        client_token=token,
        resume_from=resume_from,
        launched_at=now,
        pool=placed.pool if placed else None,
        market=placed.placement if placed and placed.placement != "none" else None,
        nodes=job.options.nodes,
    )
    new = bump(
        job,
        now,
        state=JobState.RUNNING,
        # the ended gangs' other nodes but the newest's are folded (gangs.compact): two gangs whole at most
        attempts=[*gangs.compact(job.attempts, keep=1), attempt],
        launch_tries=0,
        resume_override=None,
        last_reason=f"attempt {attempt.number} started"
        + (f" (node 0 of {attempt.nodes}; the others once it runs)" if attempt.gang else ""),
    )
    effects: list[Effect] = []
    if resubmitted:
        where = f" from {resume_from}" if resume_from else " from scratch"
        effects.append(Notify(kind="resubmitted", message=f"attempt {attempt.number} started{where}"))
    return Step(job=new, effects=effects)


def retry_delay(launch_tries: int, base: int = RETRY_BASE_SECONDS) -> int:
    """30 s, 60 s, 120 s ... up to 15 min (SQS's longest delay) between RunTask tries."""
    return int(min(RETRY_MAX_SECONDS, base * 2 ** max(0, launch_tries - 1)))


def launch_failed(
    job: Job, reason: str, now: datetime, delay_seconds: int | None = None, capacity: bool = True
) -> Step:
    """RunTask placed nothing: back to queued, due again after `delay_seconds` (the retry message the
    use case scheduled; by default `retry_delay`'s growing delay). When the reason is capacity (not a
    throttled or conflicting call), SpotGuard also asks for capacity."""
    if job.state is not JobState.LAUNCHING:
        return Step(note=f"job is {job.state}, not launching")
    delay = retry_delay(job.launch_tries) if delay_seconds is None else delay_seconds
    what = "RunTask placed no task" if capacity else "RunTask failed for now"
    new = bump(
        job,
        now,
        state=JobState.QUEUED,
        retry_at=now + timedelta(seconds=delay),
        last_reason=f"{what}: {reason}; next try in {delay} s",
    )
    effects: list[Effect] = []
    if capacity:
        pools = tuple((p.instance_type, p.availability_zone) for p in job.avoid_pools if p.until > now)
        effects.append(
            CapacityWanted(
                gpus=job.gpus, reason=reason, avoid_instances=tuple(job.avoid_instances), avoid_pools=pools
            )
        )
    waiting = f"no capacity ({reason})" if capacity else f"RunTask failed for now ({reason})"
    effects.append(Notify(kind="waiting", message=f"{waiting}; next try in {delay} s"))
    return Step(job=new, effects=effects)


def launch_refused(job: Job, reason: str, now: datetime) -> Step:
    """RunTask said the request itself is wrong (a deregistered task definition, a bad subnet): no
    retry can help, so the job fails and says why."""
    if job.state is not JobState.LAUNCHING:
        return Step(note=f"job is {job.state}, not launching")
    why = f"RunTask refused the request: {reason}"
    return Step(
        job=bump(job, now, state=JobState.FAILED, last_reason=why),
        effects=[Notify(kind="failed", message=why)],
    )


def stray_reason(job: Job) -> str:
    return f"SpotGuard: job {job.job_id} has another live attempt (or none)"[:255]
