"""EBS mode's transitions: the stopped attempt's volume is snapshotted, the job is queued again from the
snapshot (or, if it failed, from the one before), and volumes no attempt will use again are deleted."""

from __future__ import annotations

from datetime import datetime

from spotguard.domain.jobs.effects import Cleanup, Effect, Notify, Step
from spotguard.domain.jobs.model import Job, JobState, bump, replace_attempt, revised
from spotguard.domain.jobs.submission import EbsOptions


def snapshot_started(
    job: Job, attempt: int, volume_id: str | None, snapshot_id: str | None, now: datetime
) -> Step:
    """EBS mode: the attempt's volume and its snapshot (None: the volume is gone, nothing to snapshot)."""
    if job.state is not JobState.SNAPSHOTTING:
        return Step(note=f"job is {job.state}, not snapshotting")
    a = next((x for x in job.attempts if x.number == attempt), None)
    if a is None or (snapshot_id is not None and (a.volume_id, a.snapshot_id) == (volume_id, snapshot_id)):
        return Step(note="nothing new about the snapshot")
    updated = revised(a, volume_id=volume_id, snapshot_id=snapshot_id)
    if snapshot_id is None:  # no volume to snapshot: go on from the newest snapshot there is
        return snapshot_finished(
            replace_attempt(job, updated, now), None, False, now, "its volume was not found"
        )
    return Step(job=replace_attempt(job, updated, now))


def snapshot_finished(job: Job, snapshot_id: str | None, ok: bool, now: datetime, why: str = "") -> Step:
    """EBS mode: the stopped attempt's snapshot completed (the next attempt starts from it) or failed
    (it starts from the newest snapshot before it, or from scratch). Either way the job is queued."""
    if job.state is not JobState.SNAPSHOTTING:
        return Step(note=f"job is {job.state}, not snapshotting")
    last = job.attempts[-1]
    if snapshot_id is not None and last.snapshot_id != snapshot_id:
        return Step(note=f"snapshot {snapshot_id} is not the one the job waits for")
    keep = (job.options.ebs or EbsOptions()).keep_snapshots
    snapshots = [*job.snapshots, snapshot_id] if ok and snapshot_id else list(job.snapshots)
    expired, kept = snapshots[:-keep], snapshots[-keep:]
    if not ok and snapshot_id:
        expired.append(snapshot_id)  # a failed snapshot is of no use
    volumes = [*job.doomed_volumes, *([last.volume_id] if ok and last.volume_id else [])]
    if ok:
        reason = f"attempt {last.number}'s volume is snapshotted ({snapshot_id})"
    else:
        start = kept[-1] if kept else "scratch"
        reason = (
            f"the snapshot of attempt {last.number} failed{': ' + why if why else ''}; resuming from {start}"
        )
    new = bump(job, now, state=JobState.QUEUED, snapshots=kept, doomed_volumes=volumes, last_reason=reason)
    effects: list[Effect] = []
    if volumes or expired:
        effects.append(Cleanup(volumes=tuple(volumes), snapshots=tuple(expired)))
    if not ok:
        effects.append(Notify(kind="waiting", message=reason))
    return Step(job=new, effects=effects)


def volumes_deleted(job: Job, deleted: list[str], now: datetime) -> Step:
    left = [v for v in job.doomed_volumes if v not in deleted]
    if left == job.doomed_volumes:
        return Step(note="no volume deleted")
    return Step(job=bump(job, now, doomed_volumes=left))
