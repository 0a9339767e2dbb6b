"""EBS mode: checkpoints on the task's managed EBS volume, which SpotGuard snapshots when the task stops
and gives (as a new volume from the snapshot) to the next attempt.

- at submit: whether a job runs in EBS mode, and on which volume (`ebs_checkpointing`);
- the engine's effects: snapshot the stopped attempt's volume (once: found by its tags when repeated),
  delete volumes and snapshots no attempt will use again; each hands back the transitions that follow;
- the snapshot's outcome (its EBS notification event, or reconcile's look at it) queues the job again.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from spotguard.domain.jobs.commands import CommandError, Submit
from spotguard.domain.jobs.ebs import snapshot_finished, snapshot_started, volumes_deleted
from spotguard.domain.jobs.effects import Cleanup, Transition
from spotguard.domain.jobs.model import Job
from spotguard.domain.jobs.replies import TaskDefinitionInfo
from spotguard.ports import VolumeEffects, Volumes


def ebs_checkpointing(
    cmd: Submit, td: TaskDefinitionInfo, default_role: str | None
) -> tuple[str, str] | None:
    """EBS mode's volume (configured at launch, mounted by the checkpoint container) and the file://
    checkpoint URI of its mount point; None for S3 mode. Explicit `checkpoint_mode: ebs` or, when the
    mode is not given, a volume configured at launch that the checkpoint container mounts and the
    request does not configure itself."""
    container = cmd.options.checkpoint_container or (td.containers[0] if td.containers else "")
    mounts = td.mounts.get(container, {})
    mounted = any(v in mounts for v in td.volumes_at_launch)
    if cmd.options.checkpoint_mode == "s3" or (
        cmd.options.checkpoint_mode is None and (not mounted or cmd.request.volumeConfigurations)
    ):
        return None
    if not td.volumes_at_launch:
        raise CommandError(
            "BadRequest",
            f"options.checkpoint_mode: ebs needs a volume configuredAtLaunch in {td.arn}; it has none",
        )
    if cmd.request.volumeConfigurations:
        raise CommandError("BadRequest", "request.volumeConfigurations: SpotGuard sets them in EBS mode")
    if not ((cmd.options.ebs and cmd.options.ebs.role_arn) or default_role):
        raise CommandError("BadRequest", "options.ebs.role_arn: needed (the stack has no default role)")
    volume = next((v for v in td.volumes_at_launch if v in mounts), None)
    if volume is None:
        raise CommandError(
            "BadRequest",
            f"options.checkpoint_mode: container {container!r} mounts none of the volumes configured "
            f"at launch ({', '.join(td.volumes_at_launch)})",
        )
    return volume, f"file://{mounts[volume].rstrip('/')}/"


class EbsVolumes(VolumeEffects):
    def __init__(self, volumes: Volumes, clock: Callable[[], datetime]) -> None:
        self.volumes = volumes
        self.clock = clock

    def snapshot(self, job: Job, attempt: int) -> list[Transition]:
        """Snapshot the stopped attempt's volume (found again by its tags when repeated). A snapshot that
        is already over settles the job at once; otherwise its EBS notification event will."""
        volume = self.volumes.find(job.job_id, attempt)
        snap = self.volumes.snapshot(volume, job.job_id, attempt) if volume else None
        out: list[Transition] = [lambda j: snapshot_started(j, attempt, volume, snap, self.clock())]
        if snap is not None:
            state = self.volumes.snapshot_state(snap)
            if state in ("completed", "error", None):
                out.append(self.settled(snap, state == "completed"))
        return out

    def settled(self, snapshot_id: str, ok: bool) -> Transition:
        return lambda j: snapshot_finished(j, snapshot_id, ok, self.clock())

    def cleanup(self, job: Job, cleanup: Cleanup) -> list[Transition]:
        """Delete the snapshots beyond the job's keep and the volumes no attempt will use again (a volume
        still attached stays on the job's list, for the next try)."""
        for snap in cleanup.snapshots:
            self.volumes.delete_snapshot(snap)
        deleted = [v for v in cleanup.volumes if self.volumes.delete_volume(v)]
        return [lambda j: volumes_deleted(j, deleted, self.clock())] if deleted else []

    def stuck(self, job: Job) -> list[Transition]:
        """Reconcile's look at a job snapshotting for too long: take the snapshot that was never taken,
        or settle one whose notification was lost."""
        last = job.attempts[-1]
        if last.snapshot_id is None:
            return self.snapshot(job, last.number)
        state = self.volumes.snapshot_state(last.snapshot_id)
        return [] if state == "pending" else [self.settled(last.snapshot_id, state == "completed")]

    def owner(self, snapshot_id: str) -> str | None:
        """The job a snapshot belongs to (by its tags), if it is SpotGuard's."""
        found = self.volumes.snapshot_owner(snapshot_id)
        return found[0] if found else None
