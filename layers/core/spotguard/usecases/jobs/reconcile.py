"""Reconcile, on a schedule: nothing is lost even when an event is.

- a launch left half-done is repeated (the same client token returns the same task), and a due job whose
  retry message was lost is launched;
- EBS mode: a snapshot never taken is taken, one whose notification was lost is settled; volumes that
  were still attached at clean-up are deleted;
- a running job whose task stopped unseen (or vanished from ECS) gets its stop applied, as the event
  would have done; and a task that ECS runs but whose RUNNING event was lost (a gang's node, or a one-node
  attempt still pending) gets its start applied before it is judged (never given up for a lost event).

And capacity (docs/capacity.md, "Pools, decisions and moves"): the watched clusters' pools are discovered
again (prices and placement scores refreshed when stale); a task that waits for an instance past its job's
`provisioning_timeout_seconds` is stopped and launched elsewhere, its pool marked unavailable; a running
job with a deadline is decided again, and moved when the plan says so (to on-demand when spot can no
longer meet the deadline, back to spot when it pays), at most `max_moves` times and never within
`min_move_interval_seconds` of its launch; a move whose checkpoint is committed has its task stopped,
and one whose checkpoint does not come within `MOVE_COMMIT_SECONDS` is given up.

One job never stops the sweep for the others: a job that cannot be read is counted (`unreadable`) and
left out, and one whose handling fails is logged and counted (`failed`); the function turns both counts
into metrics, which are alarmed. Nor does discovery: a cluster whose discovery fails keeps its pools as
stored, a price that cannot be read keeps the one known; each such failure is logged with its reason and
counted (`discovery_errors`: the metric `ReconcileDiscoveryErrors`, see docs/observability.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from spotguard.domain.jobs import gangs
from spotguard.domain.jobs.effects import Cleanup
from spotguard.domain.jobs.model import (
    TERMINAL,
    Attempt,
    Job,
    JobState,
    NodeTask,
    revised,
    started_by,
)
from spotguard.domain.jobs.stops import VANISHED_REASON
from spotguard.domain.jobs.transitions import (
    abandon_provisioning,
    move_abandoned,
    move_checkpointed,
    move_stop_retried,
)
from spotguard.domain.tasks import TaskEvent
from spotguard.ports import PoolObservations
from spotguard.usecases.jobs.service import JobService
from spotguard.usecases.jobs.sweep import Sweep, SweepCounts

STUCK_SECONDS = 180  # a launch or a due retry untouched this long is taken up by reconcile
# Ended jobs looked at per state by each sweep (newest first), for a spare whose give-back did not finish
# and for notifications left in their outbox
RECENTLY_ENDED = 50
MOVE_COMMIT_SECONDS = 900  # a move's checkpoint not committed this long after SIGUSR1: the move is off
# A moving task asked to stop this long ago and still running is asked again (its StopTask may have
# failed): longer than ECS's longest stopTimeout (120 s) and a sweep, so one ask in two sweeps at most.
MOVE_STOP_RETRY_SECONDS = 420

log = logging.getLogger(__name__)


# A running task of a job as the sweep found it: the job, its attempt, the node's task.
_LiveTask = tuple[Job, Attempt, NodeTask]


class Reconciler:
    def __init__(self, jobs: JobService, pool_observations: PoolObservations | None = None) -> None:
        self.jobs = jobs
        self.engine = jobs.engine
        self.store = jobs.store
        # the pools' discovery and what the jobs taught of them (the capacity advisor)
        self.pool_observations = pool_observations or PoolObservations()

    def reconcile(self, limit: int = 500) -> SweepCounts:
        now = self.jobs.clock()
        sweep = Sweep(self.store, limit)
        self._refresh_pools(sweep.counts)
        waiting = sweep.each(JobState.LAUNCHING) + sweep.each(JobState.QUEUED)
        for job in waiting:
            stale = _age(job, now) > STUCK_SECONDS
            overdue = job.retry_at is None or (now - job.retry_at).total_seconds() > STUCK_SECONDS
            if stale and (job.state is JobState.LAUNCHING or overdue):
                sweep.isolated(job, lambda job=job: self.engine.drive(job.job_id, job))
                sweep.counts.relaunched += 1
        volumes = self.jobs.volumes
        snapshotting = sweep.each(JobState.SNAPSHOTTING)
        for job in snapshotting:
            if _age(job, now) > STUCK_SECONDS and volumes is not None:
                sweep.isolated(
                    job, lambda job=job: self.engine.run(job.job_id, *volumes.stuck(job), current=job)
                )
                sweep.counts.snapshots_settled += 1
        running = sweep.each(JobState.RUNNING)
        # and the jobs that ended lately: a spare whose give-back may not have finished, notifications
        # left in the outbox by the write that ended the job
        ended = [
            j for s in TERMINAL for j in self.store.list(s, RECENTLY_ENDED, on_unreadable=sweep.unreadable)
        ]
        if self.engine.spares is not None:
            self._spares(waiting + snapshotting + running + ended, sweep.isolated, sweep.counts)
        for job in waiting + snapshotting + running + ended:
            if job.outbox:
                # notifications whose sender died (or failed) before it sent them, and nobody handled
                # the job since: sent now, once (engine.flush claims those nobody holds; no call else)
                sweep.isolated(job, lambda job=job: self.engine.flush(job))
        live = self._running(running, now, sweep)
        for cluster, pairs in live.items():
            self._described(cluster, pairs, now, sweep)
        return sweep.counts

    def _refresh_pools(self, counts: SweepCounts) -> None:
        try:
            refreshed = self.pool_observations.refresh(self.jobs.config.settings.clusters)
            counts.pools = sum(len(r.pools) for r in refreshed)
            counts.discovery_errors = sum(len(r.errors) for r in refreshed)
        except Exception:  # discovery failing stops no sweep: jobs are placed on the pools known
            log.exception("reconcile could not refresh the pools; the sweep goes on")
            counts.discovery_errors += 1

    def _running(self, running: list[Job], now: datetime, sweep: Sweep) -> dict[str, list[_LiveTask]]:
        """The running jobs' own checks (volumes to delete, runs whose event was lost, capacity: moves,
        gangs, provisioning); the tasks still running, by cluster, for one DescribeTasks each."""
        live: dict[str, list[_LiveTask]] = {}
        counts, volumes = sweep.counts, self.jobs.volumes
        for listed in running:
            job = listed
            if job.doomed_volumes and volumes is not None:  # still attached last time: try again
                sweep.isolated(job, lambda job=job: self._delete_volumes(job))
            pending = job.live_attempt
            if pending is not None and _not_seen_running(pending):
                # ECS's word first: a task running whose RUNNING event was lost must not look like one that
                # never started (it would be given up at the provisioning bound; a gang's other nodes
                # would never be launched)
                seen = sweep.isolated(job, lambda job=job, a=pending: self._runs_seen(job, a, now, counts))
                job = seen if isinstance(seen, Job) else job
            attempt = job.live_attempt
            if attempt is not None:
                stopped = sweep.isolated(
                    job, lambda job=job, attempt=attempt: self._capacity(job, attempt, now, counts)
                )
                # a task this sweep just stopped is left to its STOPPED event: described now, it may
                # show the exit of a container not yet given its signal's time to checkpoint and exit
                if not stopped:  # every task of the attempt still running (a gang: each node's)
                    tasks = [t for t in attempt.tasks if not t.stopped]
                    live.setdefault(job.request.cluster, []).extend((job, attempt, t) for t in tasks)
        return live

    def _described(self, cluster: str, pairs: list[_LiveTask], now: datetime, sweep: Sweep) -> None:
        """ECS's word on the cluster's running tasks: still running (a fact of the pool), stopped (its
        event applied), or gone (vanished)."""
        try:
            found, missing = self.jobs.ecs.describe_many(cluster, [t.task_arn for _, _, t in pairs])
        except Exception:  # a cluster gone or no longer ours stops no sweep of the others
            log.exception("reconcile could not describe the tasks of cluster %s; the sweep goes on", cluster)
            sweep.counts.failed += len(pairs)
            return
        seen_running: set[str] = set()
        for job, attempt, node in pairs:
            task = found.get(node.task_arn)
            if task is not None and task.last_status == "RUNNING" and task.desired_status == "RUNNING":
                # ECS's word, now, that the attempt runs: a fact of its pool. Not the job as this sweep
                # listed it: its task may have been interrupted since, and a later "run" fact would
                # hide that interruption from the policy.
                if job.job_id not in seen_running:
                    seen_running.add(job.job_id)
                    sweep.isolated(job, lambda job=job: self.pool_observations.still_running(job))
            elif task is not None and task.last_status == "STOPPED":
                event = _as_event(task, now, node.ecs_version + 1)
                sweep.isolated(job, lambda event=event: self.jobs.on_task_event(event))
                sweep.counts.stops_applied += 1
            elif node.task_arn in missing:
                event = _vanished(job, attempt, node, now)
                sweep.isolated(job, lambda event=event: self.jobs.on_task_event(event))
                sweep.counts.vanished += 1

    def _runs_seen(self, job: Job, attempt: Attempt, now: datetime, counts: SweepCounts) -> Job:
        """The attempt's tasks (a gang's nodes) that ECS says run while the ledger has them not yet running
        (their RUNNING event lost): each one's description applied as its event (a gang's node 0's
        launches the other nodes). The job as it stands after; as listed when nothing was applied."""
        waiting = [t for t in attempt.tasks if not t.stopped and t.last_status != "RUNNING"]
        if not waiting:
            return job
        found, _ = self.jobs.ecs.describe_many(job.request.cluster, [t.task_arn for t in waiting])
        applied = 0
        for node in waiting:
            task = found.get(node.task_arn)
            if task is not None and task.last_status == "RUNNING" and task.desired_status == "RUNNING":
                self.jobs.on_task_event(_as_event(task, now, node.ecs_version + 1))
                applied += 1
        counts.runs_applied += applied
        return (self.store.get(job.job_id) or job) if applied else job

    def _spares(
        self, jobs: list[Job], isolated: Callable[[Job, Callable[[], object]], object], counts: SweepCounts
    ) -> None:
        """Give back the spares no event ended (usecases.jobs.spares: none of the job's attempts took it
        within its bound, or a give-back whose call failed)."""
        spares = self.engine.spares
        if spares is None:
            return
        for job in jobs:
            give_back = spares.unneeded(job)
            if give_back is not None:
                isolated(
                    job,
                    lambda job=job, t=give_back: self.engine.run(job.job_id, t, current=job, drive=False),
                )
                counts.spares_given_back += 1

    def _capacity(self, job: Job, attempt: Attempt, now: datetime, counts: SweepCounts) -> bool:
        """A running job's capacity: a task stuck waiting for an instance, a move under way, or a move
        its plan now asks for. True when it stopped the job's task."""
        options = job.options
        if attempt.gang_stopped_at is not None:
            # its tasks were asked to stop (a gang's stop, or a cancel): their STOPPED events end the
            # attempt, unless a StopTask was lost or failed: then asked again
            if not gangs.stop_again(job, now).effects:
                return False
            self.engine.run(job.job_id, lambda j: gangs.stop_again(j, now), current=job, drive=False)
            if attempt.gang:
                counts.gang_stops_retried += 1
            else:
                counts.cancel_stops_retried += 1
            return True
        if job.move is not None:
            if job.move.stop_requested_at is not None:
                # stopped before: the STOPPED event relaunches it (and a lost one is found by the
                # describe below, so this returns False but when it asks again). A StopTask that failed
                # after the job was written would leave the task running and the move stuck for good.
                since = (now - job.move.stop_requested_at).total_seconds()
                if since <= MOVE_STOP_RETRY_SECONDS:
                    return False
                self.engine.run(job.job_id, lambda j: move_stop_retried(j, now), current=job, drive=False)
                counts.moves_stop_retried += 1
                return True
            if self._committed_since(job, job.move.attempt, job.move.requested_at):
                self.engine.run(job.job_id, lambda j: move_checkpointed(j, now), current=job, drive=False)
                counts.moves_stopped += 1
                return True
            elif (now - job.move.requested_at).total_seconds() > MOVE_COMMIT_SECONDS:
                why = f"no checkpoint committed within {MOVE_COMMIT_SECONDS} s of the request"
                self.engine.run(job.job_id, lambda j: move_abandoned(j, now, why), current=job, drive=False)
                counts.moves_abandoned += 1
            return False
        if attempt.gang:
            gang = self._gang(job, attempt, now, counts)
            if gang is not None:
                return gang
        waited = (now - attempt.launched_at).total_seconds()
        if attempt.last_status in ("PROVISIONING", "PENDING"):
            if attempt.pool is not None and waited > options.provisioning_timeout_seconds:
                why = f"still {attempt.last_status.lower()} after {int(waited)} s"
                if self._abandon(job, attempt, why, now):
                    counts.provisioning_abandoned += 1
                    return True
            return False
        if self.jobs.consider_move(job, "reconcile"):
            counts.moves_started += 1
        return False

    def _gang(self, job: Job, attempt: Attempt, now: datetime, counts: SweepCounts) -> bool | None:
        """A gang's sweep (domain.jobs.gangs): one that did not form within the provisioning bound is
        given up, its pool marked unavailable; one whose other nodes were not all launched gets them;
        nodes still running well after another stopped on a checkpoint are stopped. True when it
        stopped tasks; None when the gang needs nothing of it (the single task's sweep goes on)."""
        waited = (now - attempt.launched_at).total_seconds()
        if not attempt.formed and waited > job.options.provisioning_timeout_seconds:
            ran = sum(t.last_status == "RUNNING" for t in attempt.tasks)
            why = f"{ran} of {attempt.nodes} nodes running after {int(waited)} s"
            if self._abandon(job, attempt, why, now):
                counts.gangs_abandoned += 1
                return True
            return False
        if gangs.peers_wanted(job) is not None:
            self.engine.run(job.job_id, gangs.launch_peers_again, current=job, drive=False)
            counts.gang_nodes_launched += 1
            return False
        if any(t.stopped for t in attempt.tasks):
            step = gangs.stragglers(job, now)
            if step.effects:
                self.engine.run(job.job_id, lambda j: gangs.stragglers(j, now), current=job, drive=False)
                counts.gang_stragglers_stopped += 1
                return True
            return False
        return None if attempt.formed else False

    def _abandon(self, job: Job, attempt: Attempt, why: str, now: datetime) -> bool:
        """Give up the attempt that waited too long for its instances (`abandon_provisioning`), on the
        job as it stands now rather than as this sweep listed it; then mark its pool unavailable. False
        when it had started, ended or been replaced meanwhile: nothing stopped, no fact kept."""
        n = attempt.number
        _, note = self.engine.run(job.job_id, lambda j: abandon_provisioning(j, n, why, now), drive=False)
        if note == gangs.NOTHING_TO_ABANDON:
            return False
        if attempt.pool is not None:
            self.pool_observations.provisioning_timed_out(job)
        return True

    def _committed_since(self, job: Job, attempt: int, since: datetime) -> bool:
        return any(
            r.attempt == attempt and r.created_at is not None and r.created_at > since
            for r in self.store.checkpoints(job.checkpoint_uri)
        )

    def _delete_volumes(self, job: Job) -> None:
        assert self.jobs.volumes is not None
        deleted = self.jobs.volumes.cleanup(job, Cleanup(volumes=tuple(job.doomed_volumes)))
        if deleted:
            self.engine.run(job.job_id, *deleted, current=job, drive=False)


def _not_seen_running(attempt: Attempt) -> bool:
    """A live attempt with a task the ledger has not seen running, and whose stop nobody asked: a gang
    that has not formed, or a one-node attempt still PROVISIONING or PENDING."""
    if attempt.gang_stopped_at is not None or attempt.stopped_reason:
        return False
    if attempt.gang:
        return not attempt.formed
    return attempt.last_status in ("PROVISIONING", "PENDING") and attempt.task_arn != ""


def _age(job: Job, now: datetime) -> float:
    return (now - job.updated_at).total_seconds()


def _as_event(task: TaskEvent, now: datetime, at_least: int) -> TaskEvent:
    """A task's description (stopped, or running when its event was lost) as the event ECS would have
    sent for it. Its `version` when it has one, and never older than what was seen: what ECS says now is
    no older than any event applied."""
    return revised(task, version=max(task.version, at_least), time=now)


def _vanished(job: Job, attempt: Attempt, task: NodeTask, now: datetime) -> TaskEvent:
    return TaskEvent(
        task_arn=task.task_arn,
        cluster_arn=job.request.cluster,
        version=task.ecs_version + 1,
        last_status="STOPPED",
        desired_status="STOPPED",
        started_by=started_by(job.job_id, attempt.number, task.node)
        if job.origin == "submitted" or attempt.number > 1
        else "",
        stopped_reason=VANISHED_REASON,
        stopped_at=now,
        time=now,
    )
