"""The job's state machine for its tasks: task events, cancel and resubmit, moves to other capacity, and
the stop of an attempt that waits for an instance. Each function takes a job and returns a `Step` (the new
job, or None when nothing changes, and the effects to carry out). The launches are in launches.py, the end
of an attempt in endings.py, EBS mode's transitions in ebs.py."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from spotguard.domain.capacity.decision import PlacementDecision
from spotguard.domain.jobs import gangs
from spotguard.domain.jobs.effects import Checkpoint, Effect, Notify, Step, Stop
from spotguard.domain.jobs.endings import attempt_ended, fold_old
from spotguard.domain.jobs.launches import decision_notice, launch_succeeded, stray_reason
from spotguard.domain.jobs.model import (
    ENV_RESUME_FROM,
    EXIT_CODE_NAME,
    MAX_EXIT_CODES,
    SPOTGUARD_ENV,
    Attempt,
    Job,
    JobError,
    JobState,
    NodeTask,
    bump,
    cancel_reason,
    client_token,
    replace_attempt,
    revised,
)
from spotguard.domain.jobs.placement import Move, remember
from spotguard.domain.jobs.stops import OwnRecord, classify_stop
from spotguard.domain.tasks import TaskEvent


# ------------------------------------------------------------------------------------ transitions
def on_task_event(job: Job, ev: TaskEvent, own_stop_notice: str | None, now: datetime) -> Step:
    """Apply one task event. Stale and repeated events (version not above the last applied) change
    nothing; a task that is not one of the job's attempts and still runs is stopped. A gang's task
    (`options.nodes` > 1) is one node of its attempt (domain.jobs.gangs)."""
    attempt = job.attempt_for(ev.task_arn)
    if attempt is None:
        bound = _bind(job, ev, now)
        if bound is not None:
            assert bound.job is not None
            step = on_task_event(bound.job, ev, own_stop_notice, now)
            return Step(job=step.job or bound.job, effects=[*bound.effects, *step.effects], note=step.note)
    if attempt is None:
        if ev.last_status == "STOPPED" or ev.desired_status == "STOPPED":
            return Step(note="a task that is not one of the job's attempts, already stopping")
        return Step(
            effects=[Stop(cluster=ev.cluster_arn, task_arn=ev.task_arn, reason=stray_reason(job))],
            note="a task that is not the job's live attempt: stopped so the job never runs twice",
        )
    task = attempt.node_task(ev.task_arn)
    assert task is not None
    if ev.version <= task.ecs_version:
        return Step(note=f"stale or repeated event (version {ev.version} <= {task.ecs_version})")

    updated = attempt.with_node(_observe(task, ev, own_stop_notice, job.checkpoint_container))
    if own_stop_notice and updated.interrupted_by is None:
        updated = revised(updated, interrupted_by=own_stop_notice)
    effects: list[Effect] = []
    if ev.last_status != "STOPPED":
        if job.cancel_requested or job.state.terminal:
            effects.append(Stop(cluster=ev.cluster_arn, task_arn=ev.task_arn, reason=cancel_reason(job)))
        elif (
            ev.desired_status == "STOPPED"
            and ev.stop_code == "SpotInterruption"
            and attempt.interrupted_by is None
        ):
            updated = revised(updated, interrupted_by="SpotInterruption")
            effects.append(
                Notify(kind="interrupted", message=f"attempt {attempt.number}: Fargate Spot interruption")
            )
        elif updated.gang and job.is_newest(attempt) and job.state is JobState.RUNNING:
            node = updated.node_task(ev.task_arn)
            assert node is not None
            stopping = ev.desired_status == "STOPPED" and node.stopped_reason
            others = (
                gangs.node_stopping(job, updated, node, node.stopped_reason or "", now) if stopping else []
            )
            if others:  # one node's instance is going: every node checkpoints and stops now
                updated = revised(updated, gang_stopped_at=now)
                return Step(job=replace_attempt(job, updated, now), effects=list(others))
            being_stopped = ev.desired_status == "STOPPED"  # its peers would start on a dying node 0
            updated, launches = (
                gangs.progress(job, attempt, updated, now) if not being_stopped else (updated, [])
            )
            effects.extend(launches)
            if updated.formed and not attempt.formed:
                changes = {"last_reason": f"attempt {attempt.number} started on all {updated.nodes} nodes"}
                return Step(job=replace_attempt(job, updated, now, **changes), effects=effects)
        return Step(job=replace_attempt(job, updated, now), effects=effects)

    # ------------------------------------------------------------------------------ the task stopped
    if not (job.state is JobState.RUNNING and job.is_newest(attempt)):
        # An older attempt, or a job that already moved on: record what happened, nothing more.
        return Step(job=replace_attempt(job, updated, now))
    verdict = classify_stop(
        ev.detail,
        OwnRecord(stopped_for_notice=own_stop_notice, cancelled=job.cancel_requested),
        job.checkpoint_container,
    )
    if updated.gang:
        node = updated.node_task(ev.task_arn)
        assert node is not None
        updated, stops = gangs.node_stopped(job, updated, node, verdict, now)
        if gangs.live_tasks(updated):  # the others stop next (asked now, or by themselves)
            running = len(gangs.live_tasks(updated))
            note = f"node {node.node} of attempt {updated.number} stopped; {running} still running"
            return Step(job=replace_attempt(job, updated, now), effects=list(stops), note=note)
        return attempt_ended(job, updated, gangs.gang_outcome(updated, job.cancel_requested), now)
    return attempt_ended(job, updated, verdict, now)


def _bind(job: Job, ev: TaskEvent, now: datetime) -> Step | None:
    """A task of the job's own launch seen before RunTask's answer was written (or after the Lambda that
    called it died): node 0 of the launch in flight, or another node of the running gang. None: not one."""
    ref = ev.job_ref
    if ref is None or ref[0] != job.job_id:
        return None
    if ev.node == 0 and job.state is JobState.LAUNCHING and ref[1] == job.next_attempt:
        return launch_succeeded(
            job,
            ev.task_arn,
            client_token(job.job_id, job.next_attempt, job.launch_tries),
            _env_of(ev.overrides).get(ENV_RESUME_FROM, ""),
            now,
            resubmitted=job.next_attempt > 1,
        )
    live = job.attempts[-1] if job.attempts else None
    if ev.node > 0 and live is not None and live.number == ref[1] and ev.node < live.nodes:
        step = gangs.peer_launched(
            job, ref[1], ev.node, ev.task_arn, client_token(job.job_id, ref[1], 0, ev.node), now
        )
        return step if step.job is not None else None
    return None


def _env_of(overrides: Mapping[str, Any] | None) -> dict[str, str]:
    env: dict[str, str] = {}
    for c in (overrides or {}).get("containerOverrides") or []:
        for e in c.get("environment") or []:
            if isinstance(e, Mapping) and e.get("name") in SPOTGUARD_ENV:
                env[str(e["name"])] = str(e.get("value", ""))
    return env


def _observe(task: NodeTask, ev: TaskEvent, own_stop_notice: str | None, first: str | None) -> NodeTask:
    """One task of an attempt (node 0's: the attempt itself) as the event says it now is. Its exit codes:
    at most MAX_EXIT_CODES, the checkpoint container's (`first`) first, names clipped (the ledger item's
    bound)."""
    changes: dict[str, Any] = {"ecs_version": ev.version, "last_status": ev.last_status}
    for field, value in (
        ("container_instance_arn", ev.container_instance_arn),
        ("availability_zone", ev.availability_zone),
        ("capacity_provider", ev.capacity_provider),
        ("launch_type", ev.launch_type),
        ("started_at", ev.started_at),
        ("stopped_at", ev.stopped_at),
        ("stop_code", ev.stop_code),
        ("stopped_reason", ev.stopped_reason),
        ("private_ip", ev.private_ip),
    ):
        if value is not None:
            changes[field] = value
    if ev.containers:
        codes = [(str(c.get("name", "")), c.get("exitCode")) for c in ev.containers]
        codes.sort(key=lambda nc: nc[0] != first)  # stable: the checkpoint container first, then ECS's order
        changes["exit_codes"] = {name[:EXIT_CODE_NAME]: code for name, code in codes[:MAX_EXIT_CODES]}
    if own_stop_notice and task.notice is None:
        changes["notice"] = own_stop_notice
    if ev.last_status == "STOPPED" and ev.stopped_at is None:
        changes["stopped_at"] = ev.time or ev.stopping_at
    return revised(task, **changes)


def request_cancel(job: Job, now: datetime, reason: str) -> Step:
    if job.state.terminal:
        raise JobError(f"job {job.job_id} is already {job.state}")
    live = job.live_attempt
    idle = job.state in (JobState.QUEUED, JobState.SNAPSHOTTING)
    if idle or (job.state is JobState.LAUNCHING and live is None):
        # Launching: the RunTask in flight, if it succeeds, finds the job cancelled and stops the task.
        return Step(
            job=bump(job, now, state=JobState.CANCELLED, cancel_requested=True, last_reason=reason),
            effects=[Notify(kind="cancelled", message=reason)],
        )
    if live is None:
        return Step(job=bump(job, now, cancel_requested=True, last_reason=reason))
    # The attempt's stop is under way from now (`gang_stopped_at`, a one-node attempt's too): reconcile
    # asks again (gangs.stop_again) while a task still runs, so a StopTask that failed after this write
    # does not leave the job running, cancelled, for good.
    stopping = revised(live, gang_stopped_at=live.gang_stopped_at or now)
    new = replace_attempt(job, stopping, now, cancel_requested=True, last_reason=reason)
    return Step(job=new, effects=list(gangs.stops(job, live, cancel_reason(job))))


def request_resubmit(job: Job, now: datetime, checkpoint: str | None) -> Step:
    """A manual resubmit: a job that is not running starts again (a fresh attempt budget and error
    retries), from `checkpoint` if given, else from its newest committed checkpoint."""
    if job.state is JobState.SNAPSHOTTING:
        raise JobError(f"job {job.job_id} is snapshotting its volume; it starts again by itself after that")
    if job.state in (JobState.RUNNING, JobState.LAUNCHING):
        live = job.live_attempt
        task = f" (task {live.task_arn})" if live else ""
        raise JobError(f"job {job.job_id} is {job.state}{task}: cancel it first, it never runs twice")
    attempts, folded = fold_old(gangs.compact(job.attempts, keep=1), job.folded, job.gpus, now)  # the bound
    new = bump(
        job,
        now,
        attempts=attempts,
        folded=folded,
        state=JobState.QUEUED,
        retry_at=None,
        launch_tries=0,
        budget_base=job.attempt_count,
        error_retries_used=0,
        cancel_requested=False,
        resume_override=checkpoint,
        last_reason="resubmitted by hand",
    )
    return Step(job=new)


# ------------------------------------------------------------------------------------------ moves
NO_MOVE = "no move: the job is not running that attempt, or a move is under way"


def request_move(job: Job, number: int, decision: PlacementDecision, now: datetime) -> Step:
    """Move the running job's attempt `number` to other capacity: ask its checkpoint container to commit
    now (SIGUSR1); once that checkpoint is committed (`move_checkpointed`) the task is stopped and the job
    relaunched as `decision` says. Refused (no change) when a move is under way, the job is not running,
    or the decision was made for another attempt, or one being stopped since (the job as the caller
    read it is older than this write's: a relaunch, or a notice, came in between)."""
    live = job.live_attempt
    if (
        job.state is not JobState.RUNNING
        or live is None
        or live.number != number
        or not live.formed
        or live.stopped_reason is not None
        or live.interrupted_by is not None
        or job.move is not None
        or job.cancel_requested
    ):
        return Step(note=NO_MOVE)
    move = Move(attempt=live.number, to=decision, requested_at=now)
    new = bump(
        job,
        now,
        move=move,
        decisions=remember(job.decisions, decision),
        last_reason=f"moving: {decision.summary()}"[:500],
    )
    return Step(job=new, effects=[decision_notice(decision), Checkpoint(attempt=live.number)])


def move_checkpointed(job: Job, now: datetime) -> Step:
    """The checkpoint the move asked for is committed: stop the task (a SpotGuard stop, so it is
    resubmitted), saying why. Safe to repeat: StopTask on a stopping task changes nothing."""
    move, live = job.move, job.live_attempt
    if move is None or live is None or live.number != move.attempt:
        return Step(note="no move under way for the live attempt")
    new = job if move.stop_requested_at else bump(job, now, move=revised(move, stop_requested_at=now))
    return Step(job=None if new is job else new, effects=_move_stops(job, move, live))


def move_stop_retried(job: Job, now: datetime) -> Step:
    """The move's task was asked to stop at `stop_requested_at` and still runs: the StopTask may have
    failed after the job was written (throttled, an error). Ask again, noting when, so that the next ask
    waits as long again; StopTask on a task that is stopping already changes nothing."""
    move, live = job.move, job.live_attempt
    if move is None or live is None or live.number != move.attempt or move.stop_requested_at is None:
        return Step(note="no stopped move under way for the live attempt")
    new = bump(job, now, move=revised(move, stop_requested_at=now))
    return Step(job=new, effects=_move_stops(job, move, live))


def _move_stops(job: Job, move: Move, live: Attempt) -> list[Effect]:
    """StopTask for the moving attempt's tasks (a gang's every node: it moves whole)."""
    where = "on-demand" if move.to.placement == "on-demand" else f"spot in {move.to.pool}"
    # the policy's reason may say where already ("spot in gpu-spot-b/...: the plan ..."): once is enough
    why = move.to.reason if move.to.reason.startswith(where) else f"{where}: {move.to.reason}"
    reason = f"SpotGuard: moving job {job.job_id} to {why}"[:255]
    return list(gangs.stops(job, live, reason))


def move_abandoned(job: Job, now: datetime, why: str) -> Step:
    """The move is given up (no checkpoint came in time, or the task stopped first): the job goes on
    where it is; the move does not count against `max_moves`."""
    if job.move is None or job.move.stop_requested_at is not None:
        return Step(note="no move to abandon")
    return Step(job=bump(job, now, move=None, last_reason=f"move abandoned: {why}"[:500]))


def abandon_provisioning(job: Job, number: int, why: str, now: datetime) -> Step:
    """The live attempt, `number`, waits for an instance its pool cannot give (`why`: the provisioning
    bound passed, or Auto Scaling said it could not launch): stop it, a SpotGuard stop, so that the job
    is launched again where the policy now says. Its note is `gangs.NOTHING_TO_ABANDON` when there is
    nothing to stop: the attempt started, ended, or is another one. A single task's stop writes nothing,
    so the caller hands it the job as it stands now (engine.run without `current`), not as a sweep
    listed it a while ago: a task that has just started must not be stopped."""
    live = job.live_attempt
    if live is not None and live.number == number and live.gang and not live.formed:
        return gangs.abandon_gang(job, number, why, now)
    waiting = live is not None and live.last_status in ("PROVISIONING", "PENDING")
    if job.state is not JobState.RUNNING or live is None or live.number != number or not waiting:
        return Step(note=gangs.NOTHING_TO_ABANDON)
    reason = f"SpotGuard: no instance in {live.pool or 'its capacity'} ({why}); launching elsewhere"
    return Step(effects=[Stop(cluster=job.request.cluster, task_arn=live.task_arn, reason=reason[:255])])
