"""Reconcile, on a schedule: nothing is lost even when an event is.

- a launch left half-done is repeated (the same client token returns the same task), and a due job whose
  retry message was lost is launched;
- EBS mode: a snapshot never taken is taken, one whose notification was lost is settled; volumes that
  were still attached at clean-up are deleted;
- a running job whose task stopped unseen (or vanished from ECS) gets its stop applied, as the event
  would have done.
"""

from __future__ import annotations

from datetime import datetime

from spotguard.domain.jobs.effects import Cleanup
from spotguard.domain.jobs.model import Attempt, Job, JobState, started_by
from spotguard.domain.stops import VANISHED_REASON
from spotguard.domain.tasks import TaskEvent
from spotguard.usecases.jobs.service import JobService

STUCK_SECONDS = 180  # a launch or a due retry untouched this long is taken up by reconcile


class Reconciler:
    def __init__(self, jobs: JobService) -> None:
        self.jobs = jobs
        self.engine = jobs.engine
        self.store = jobs.store

    def reconcile(self, limit: int = 500) -> dict[str, int]:
        now = self.jobs.clock()
        counts = {"checked": 0, "relaunched": 0, "stops_applied": 0, "vanished": 0, "snapshots_settled": 0}
        for job in self.store.list(JobState.LAUNCHING, limit) + self.store.list(JobState.QUEUED, limit):
            counts["checked"] += 1
            stale = _age(job, now) > STUCK_SECONDS
            overdue = job.retry_at is None or (now - job.retry_at).total_seconds() > STUCK_SECONDS
            if stale and (job.state is JobState.LAUNCHING or overdue):
                self.engine.drive(job.job_id, job)
                counts["relaunched"] += 1
        volumes = self.jobs.volumes
        for job in self.store.list(JobState.SNAPSHOTTING, limit):
            counts["checked"] += 1
            if _age(job, now) > STUCK_SECONDS and volumes is not None:
                self.engine.run(job.job_id, *volumes.stuck(job), current=job)
                counts["snapshots_settled"] += 1
        live: dict[str, list[tuple[Job, Attempt]]] = {}
        for job in self.store.list(JobState.RUNNING, limit):
            counts["checked"] += 1
            if job.doomed_volumes and volumes is not None:  # still attached last time: try again
                deleted = volumes.cleanup(job, Cleanup(volumes=tuple(job.doomed_volumes)))
                if deleted:
                    self.engine.run(job.job_id, *deleted, current=job, drive=False)
            attempt = job.live_attempt
            if attempt is not None:
                live.setdefault(job.request.cluster, []).append((job, attempt))
        for cluster, pairs in live.items():
            found, missing = self.jobs.ecs.describe_many(cluster, [a.task_arn for _, a in pairs])
            for job, attempt in pairs:
                task = found.get(attempt.task_arn)
                if task is not None and task.last_status == "STOPPED":
                    self.jobs.on_task_event(_as_event(task, now, attempt.ecs_version + 1))
                    counts["stops_applied"] += 1
                elif attempt.task_arn in missing:
                    self.jobs.on_task_event(_vanished(job, attempt, now))
                    counts["vanished"] += 1
        return counts


def _age(job: Job, now: datetime) -> float:
    return (now - job.updated_at).total_seconds()


def _as_event(task: TaskEvent, now: datetime, at_least: int) -> TaskEvent:
    """A stopped task's description as the event ECS would have sent for it. Its `version` when it has
    one; STOPPED is final, so it is never older than what was seen."""
    return task.model_copy(update={"version": max(task.version, at_least), "time": now})


def _vanished(job: Job, attempt: Attempt, now: datetime) -> TaskEvent:
    return TaskEvent(
        task_arn=attempt.task_arn,
        cluster_arn=job.request.cluster,
        version=attempt.ecs_version + 1,
        last_status="STOPPED",
        desired_status="STOPPED",
        started_by=started_by(job.job_id, attempt.number)
        if job.origin == "submitted" or attempt.number > 1
        else "",
        stopped_reason=VANISHED_REASON,
        stopped_at=now,
        time=now,
    )
