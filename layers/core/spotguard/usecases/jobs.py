"""Jobs: submit, follow their tasks, resubmit from the newest checkpoint, and the manual controls.

Every change goes through `_apply`: load the job, compute the pure transition (domain.jobs), write it
with compare-and-set on `rev` (reload and recompute when another writer got there first), then carry
out its effects. Notifications ride in the job's outbox and are sent after the write, so a Lambda that
dies in between leaves them for the next one. After any change `_drive` moves the job on as far as it
can: a queued job that is due is launched, a launch in flight is repeated (same client token, same task).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from spotguard.domain.adoption import checkpoint_uri_of, rebuild_request
from spotguard.domain.commands import Cancel, CommandError, ListJobs, Resubmit, Status, Submit
from spotguard.domain.facts import Notification, TaskDefinitionInfo
from spotguard.domain.jobs import (
    TERMINAL,
    Attempt,
    CapacityWanted,
    Cleanup,
    Job,
    JobError,
    JobOptions,
    JobState,
    Launch,
    Notify,
    OutboxItem,
    Snapshot,
    Step,
    Stop,
    TaskEvent,
    adopted_job_id,
    begin_launch,
    launch_failed,
    launch_refused,
    launch_succeeded,
    on_task_event,
    request_cancel,
    request_resubmit,
    run_task_params,
    snapshot_finished,
    snapshot_started,
    spend,
    started_by,
    volumes_deleted,
)
from spotguard.domain.notices import Settings
from spotguard.domain.prices import task_share
from spotguard.domain.stops import VANISHED_REASON, classify_stop
from spotguard.domain.task_events import indexed_info, task_event_from
from spotguard.domain.tasks import CHECKPOINT_CONTAINER_TAG, ManageMode, TaskInfo
from spotguard.ports import (
    Hosts,
    JobEcs,
    JobStore,
    LaunchRetries,
    NewestCheckpoint,
    Notifications,
    StopClaims,
    TaskIndex,
    Volumes,
)

STUCK_SECONDS = 180  # a launch or a due retry untouched this long is taken up by reconcile
MAX_WRITE_TRIES = 8  # compare-and-set conflicts (concurrent events for one job) before giving up
MAX_DRIVE_STEPS = 6


class JobsConfig(BaseModel):
    model_config = ConfigDict(frozen=True)
    settings: Settings = Settings()
    manage: ManageMode = ManageMode.TAGGED
    checkpoint_bucket: str
    checkpoint_prefix: str = "jobs/"
    default_subnets: tuple[str, ...] = ()
    default_security_groups: tuple[str, ...] = ()
    retry_base_seconds: int = 30  # the first wait for capacity; it doubles per try, up to 15 minutes
    ebs_role_arn: str | None = None  # the role ECS manages EBS-mode volumes with (the stack's)


class Conflict(RuntimeError):
    """The job kept changing under us: the record is retried (SQS) or the caller is told."""


class JobService:
    def __init__(
        self,
        config: JobsConfig,
        store: JobStore,
        ecs: JobEcs,
        hosts: Hosts,
        checkpoints: NewestCheckpoint,
        claims: StopClaims,
        notifier: Notifications,
        retries: LaunchRetries,
        clock: Callable[[], datetime],
        index: TaskIndex | None = None,
        volumes: Volumes | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.ecs = ecs
        self.hosts = hosts
        self.checkpoints = checkpoints
        self.claims = claims
        self.notifier = notifier
        self.retries = retries
        self.clock = clock
        self.index = index
        self.volumes = volumes

    # ================================================================================ manual actions
    def submit(self, cmd: Submit) -> Job:
        if not self.config.settings.watches(cmd.request.cluster):
            watched = ", ".join(self.config.settings.clusters) or "none"
            raise CommandError(
                "BadRequest", f"request.cluster: {cmd.request.cluster} is not a watched cluster ({watched})"
            )
        job_id = cmd.job_id or f"job-{self.clock():%Y%m%d}-{secrets.token_hex(4)}"
        existing = self.store.get(job_id)
        if existing is not None:
            return self._same_submit(existing, cmd)
        try:
            td = self.ecs.task_definition(cmd.request.taskDefinition, cmd.request.overrides)
        except Exception as exc:  # the ECS error says what is wrong with the name
            raise CommandError("BadRequest", f"request.taskDefinition: {_aws_message(exc)}") from None
        if cmd.options.checkpoint_container and cmd.options.checkpoint_container not in td.containers:
            raise CommandError(
                "BadRequest",
                f"options.checkpoint_container: {cmd.options.checkpoint_container!r} is not a container of "
                f"{td.arn} ({', '.join(td.containers)})",
            )
        ebs_volume, checkpoint_uri = None, self._default_uri(job_id)
        if cmd.options.checkpoint_mode == "ebs" or (
            cmd.options.checkpoint_mode is None
            and _mounted_at_launch(cmd, td)
            and not cmd.request.volumeConfigurations
        ):
            ebs_volume, checkpoint_uri = self._ebs_volume(cmd, td)
        now = self.clock()
        job = Job(
            job_id=job_id,
            state=JobState.QUEUED,
            request=cmd.request,
            options=cmd.options,
            checkpoint_uri=checkpoint_uri,
            gpus=td.gpus,
            containers=td.containers,
            created_at=now,
            updated_at=now,
            ebs_volume=ebs_volume,
        )
        if not self.store.create(job):  # the same id, submitted at the same moment
            again = self.store.get(job_id)
            assert again is not None
            return self._same_submit(again, cmd)
        return self._drive(job_id)

    def _ebs_volume(self, cmd: Submit, td: TaskDefinitionInfo) -> tuple[str, str]:
        """EBS mode: the volume configured at launch that the checkpoint container mounts, and the
        file:// checkpoint URI of its mount point."""
        if not td.volumes_at_launch:
            raise CommandError(
                "BadRequest",
                f"options.checkpoint_mode: ebs needs a volume configuredAtLaunch in {td.arn}; it has none",
            )
        if cmd.request.volumeConfigurations:
            raise CommandError("BadRequest", "request.volumeConfigurations: SpotGuard sets them in EBS mode")
        if not ((cmd.options.ebs and cmd.options.ebs.role_arn) or self.config.ebs_role_arn):
            raise CommandError("BadRequest", "options.ebs.role_arn: needed (the stack has no default role)")
        container = cmd.options.checkpoint_container or td.containers[0]
        mounts = td.mounts.get(container, {})
        volume = next((v for v in td.volumes_at_launch if v in mounts), None)
        if volume is None:
            raise CommandError(
                "BadRequest",
                f"options.checkpoint_mode: container {container!r} mounts none of the volumes configured "
                f"at launch ({', '.join(td.volumes_at_launch)})",
            )
        return volume, f"file://{mounts[volume].rstrip('/')}/"

    def _same_submit(self, job: Job, cmd: Submit) -> Job:
        if job.request == cmd.request and job.options == cmd.options:
            return job  # a repeated submit: the job it made the first time
        raise CommandError("Conflict", f"job {job.job_id} exists already with another request or options")

    def resubmit(self, cmd: Resubmit) -> Job:
        if cmd.task_arn is not None:
            job_id = self._adopt_stopped(cmd.task_arn)
        else:
            assert cmd.job_id is not None
            job_id = cmd.job_id
        job = self._get(job_id)
        if cmd.checkpoint and not cmd.checkpoint.startswith(job.checkpoint_uri):
            raise CommandError(
                "BadRequest",
                f"checkpoint: not one of job {job_id}'s checkpoints (under {job.checkpoint_uri})",
            )
        job, _ = self._apply(job_id, lambda j: request_resubmit(j, self.clock(), cmd.checkpoint), current=job)
        return self._drive(job_id, job)

    def cancel(self, cmd: Cancel) -> Job:
        job = self._get(cmd.job_id)
        return self._apply(cmd.job_id, lambda j: request_cancel(j, self.clock(), cmd.reason), current=job)[0]

    def status(self, cmd: Status) -> dict[str, Any]:
        job = self._flush(self._get(cmd.job_id))
        refs = self.store.checkpoints(job.checkpoint_uri)
        by_attempt: dict[int, list[datetime]] = {}
        for r in refs:
            if r.created_at is not None:
                by_attempt.setdefault(r.attempt, []).append(r.created_at)
        return {
            **summary(job),
            "request": job.request.model_dump(mode="json", exclude_none=True),
            "options": job.options.model_dump(mode="json"),
            "attempts": [a.model_dump(mode="json", exclude_none=True) for a in job.attempts],
            "checkpoints": [r.model_dump(mode="json", exclude_none=True) for r in refs],
            "snapshots": job.snapshots,  # EBS mode: the volumes' snapshots, oldest first
            "spend": spend(job, by_attempt, self.clock()).model_dump(mode="json"),
            "avoiding": {
                "instances": job.avoid_instances,
                "pools": [p.model_dump(mode="json") for p in job.avoid_pools if p.until > self.clock()],
            },
        }

    def list(self, cmd: ListJobs) -> list[dict[str, Any]]:
        return [summary(j) for j in self.store.list(cmd.state, cmd.limit)]

    # =============================================================================== event handling
    def on_task_event(self, ev: TaskEvent) -> str:
        """Apply one ECS task event to its job (adopting the task if it is managed and new)."""
        ref = ev.job_ref
        job_id = ref[0] if ref else adopted_job_id(ev.task_arn)
        job = self.store.get(job_id)
        if job is None and ref is None:
            job = self._adopt_running(ev)
        self._index(ev, job)
        if job is None:
            return (
                "not a managed task" if ref is None else f"job {job_id} is not in the ledger: event ignored"
            )
        facts_cache: dict[str, Any] = {}

        def step(j: Job) -> Step:
            attempt = j.attempt_for(ev.task_arn)
            notice = None
            if ev.last_status == "STOPPED" and attempt is not None and attempt.instance_id:
                notice = self.claims.stop_claim(attempt.instance_id)
            result = on_task_event(j, ev, notice, self.clock())
            if result.job is not None:
                result = result.model_copy(update={"job": self._with_host(result.job, ev, facts_cache)})
            return result

        job, note = self._apply(job_id, step, current=job)
        self._drive(job_id, job)
        return note

    def _index(self, ev: TaskEvent, job: Job | None) -> None:
        """Keep the host's task index, so a notice for the host needs no DescribeTasks."""
        if self.index is None or not ev.container_instance_arn:
            return
        container = (
            (job.options.checkpoint_container or (job.containers[0] if job.containers else None))
            if job
            else None
        )
        info = indexed_info(
            ev, managed=job is not None, gpu=bool(job and job.gpus), checkpoint_container=container
        )
        self.index.index_task(info, ev.version, self.clock())

    # ====================================================================================== reconcile
    def reconcile(self, limit: int = 500) -> dict[str, int]:
        """The scheduled sweep that makes sure nothing is lost even when events are: a launch left
        half-done is repeated (same client token), a due job whose retry message was lost is launched,
        and a running job whose task stopped unseen (or vanished from ECS) gets its stop applied."""
        now = self.clock()
        counts = {"checked": 0, "relaunched": 0, "stops_applied": 0, "vanished": 0, "snapshots_settled": 0}
        for job in self.store.list(JobState.LAUNCHING, limit) + self.store.list(JobState.QUEUED, limit):
            counts["checked"] += 1
            stale = (now - job.updated_at).total_seconds() > STUCK_SECONDS
            overdue = job.retry_at is None or (now - job.retry_at).total_seconds() > STUCK_SECONDS
            if stale and (job.state is JobState.LAUNCHING or overdue):
                self._drive(job.job_id, job)
                counts["relaunched"] += 1
        for job in self.store.list(JobState.SNAPSHOTTING, limit):
            counts["checked"] += 1
            if (now - job.updated_at).total_seconds() > STUCK_SECONDS and self.volumes is not None:
                last = job.attempts[-1]
                state = self.volumes.snapshot_state(last.snapshot_id) if last.snapshot_id else None
                if last.snapshot_id is None:
                    self._snapshot(job, last.number)  # the snapshot was never taken
                elif state != "pending":
                    self._settle_snapshot(job.job_id, last.snapshot_id, state == "completed")
                counts["snapshots_settled"] += 1
        live: dict[str, list[tuple[Job, Attempt]]] = {}
        for job in self.store.list(JobState.RUNNING, limit):
            counts["checked"] += 1
            if job.doomed_volumes and self.volumes is not None:  # still attached last time: try again
                self._cleanup(job.job_id, Cleanup(volumes=tuple(job.doomed_volumes)))
            attempt = job.live_attempt
            if attempt is not None:
                live.setdefault(job.request.cluster, []).append((job, attempt))
        for cluster, pairs in live.items():
            found, missing = self.ecs.describe_many(cluster, [a.task_arn for _, a in pairs])
            for job, attempt in pairs:
                task = found.get(attempt.task_arn)
                if task is not None and task.get("lastStatus") == "STOPPED":
                    self.on_task_event(_event_of(task, now, attempt.ecs_version + 1))
                    counts["stops_applied"] += 1
                elif attempt.task_arn in missing:
                    self.on_task_event(_vanished(job, attempt, now))
                    counts["vanished"] += 1
        return counts

    def on_launch_due(self, job_id: str, launch_try: int) -> str:
        job = self.store.get(job_id)
        if job is None:
            return f"job {job_id} is not in the ledger"
        if job.state is not JobState.QUEUED or job.launch_tries != launch_try:
            return f"stale retry (job is {job.state}, try {job.launch_tries})"
        now = self.clock()
        if job.retry_at is not None and now < job.retry_at:
            wait = max(1, int((job.retry_at - now).total_seconds() + 0.999))
            self.retries.schedule(job_id, launch_try, wait)
            return f"not due yet: checking again in {wait} s"
        self._drive(job_id, job)
        return "launched"

    # ====================================================================================== internals
    def _get(self, job_id: str) -> Job:
        job = self.store.get(job_id)
        if job is None:
            raise CommandError("NotFound", f"job {job_id} does not exist")
        return job

    def _default_uri(self, job_id: str) -> str:
        return f"s3://{self.config.checkpoint_bucket}/{self.config.checkpoint_prefix}{job_id}/"

    def _apply(self, job_id: str, fn: Callable[[Job], Step], current: Job | None = None) -> tuple[Job, str]:
        """Transition, compare-and-set, then carry out the step's effects. Starts from `current` when the
        caller has the job in hand (reloading only when someone else wrote it meanwhile); returns the job
        as it now stands and the step's note."""
        for _ in range(MAX_WRITE_TRIES):
            job = current if current is not None else self._get(job_id)
            current = None
            try:
                step = fn(job)
            except JobError as exc:
                raise CommandError("Conflict", str(exc)) from None
            if step.job is not None:
                written = self._commit(job, step)
                if written is None:
                    continue
                job = written
            self._stops(step)
            return job, step.note
        raise Conflict(f"job {job_id} changed {MAX_WRITE_TRIES} times while being updated")

    def _commit(self, old: Job, step: Step) -> Job | None:
        """Write the step's job (with its notifications in the outbox) if `old` is still current;
        then send them. The job as written and flushed, or None when another writer got there first."""
        assert step.job is not None
        new = step.job
        items = [
            _outbox_item(new, i, e)
            for i, e in enumerate(step.effects)
            if isinstance(e, Notify | CapacityWanted)
        ]
        if items:
            new = new.model_copy(update={"outbox": [*new.outbox, *items]})
        if not self.store.replace(new, old.rev):
            return None
        return self._flush(new)

    def _stops(self, step: Step) -> None:
        """The effects that are not notifications: stops, and in EBS mode snapshots and clean-up."""
        for e in step.effects:
            if isinstance(e, Stop):
                self.ecs.stop(e.cluster, e.task_arn, e.reason)
            elif isinstance(e, Snapshot) and step.job is not None:
                self._snapshot(step.job, e.attempt)
            elif isinstance(e, Cleanup) and step.job is not None:
                self._cleanup(step.job.job_id, e)

    # ------------------------------------------------------------------------------------- EBS mode
    def _snapshot(self, job: Job, attempt: int) -> None:
        """Snapshot the stopped attempt's volume (once: found by its tags when repeated); a snapshot
        already completed moves the job on at once, otherwise its EBS notification event will."""
        if self.volumes is None:
            raise RuntimeError("EBS mode without an EBS adapter")
        volume = self.volumes.find(job.job_id, attempt)
        snap = self.volumes.snapshot(volume, job.job_id, attempt) if volume else None
        job, _ = self._apply(job.job_id, lambda j: snapshot_started(j, attempt, volume, snap, self.clock()))
        if snap is not None:
            state = self.volumes.snapshot_state(snap)
            if state in ("completed", "error", None):
                self._settle_snapshot(job.job_id, snap, state == "completed")

    def on_snapshot(self, snapshot_id: str, ok: bool) -> str:
        """An EBS Snapshot Notification (or reconcile's look at the snapshot): the job waiting for
        it is queued, from this snapshot or, if it failed, the one before."""
        assert self.volumes is not None
        owner = self.volumes.snapshot_owner(snapshot_id)
        if owner is None:
            return "not a SpotGuard snapshot"
        return self._settle_snapshot(owner[0], snapshot_id, ok)

    def _settle_snapshot(self, job_id: str, snapshot_id: str, ok: bool) -> str:
        job = self.store.get(job_id)
        if job is None:
            return f"job {job_id} is not in the ledger"
        job, note = self._apply(
            job.job_id, lambda j: snapshot_finished(j, snapshot_id, ok, self.clock()), current=job
        )
        self._drive(job.job_id, job)
        return note or f"snapshot {'completed' if ok else 'failed'}"

    def _cleanup(self, job_id: str, cleanup: Cleanup) -> None:
        assert self.volumes is not None
        for snap in cleanup.snapshots:
            self.volumes.delete_snapshot(snap)
        deleted = [v for v in cleanup.volumes if self.volumes.delete_volume(v)]
        if deleted:
            self._apply(job_id, lambda j: volumes_deleted(j, deleted, self.clock()))

    def _flush(self, job: Job) -> Job:
        """Send the job's pending notifications, then take them out of the outbox. Returns the job as
        it stands after (reloaded only if someone wrote it meanwhile)."""
        if not job.outbox:
            return job
        self.notifier.send_all(
            [
                Notification(
                    id=item.id, kind=item.kind, job_id=job.job_id, message=item.message, detail=item.detail
                )
                for item in job.outbox
            ]
        )
        sent = {i.id for i in job.outbox}
        current: Job | None = job
        for _ in range(MAX_WRITE_TRIES):
            if current is None:
                return job
            if not any(i.id in sent for i in current.outbox):
                return current
            cleared = current.model_copy(
                update={"outbox": [i for i in current.outbox if i.id not in sent], "rev": current.rev + 1}
            )
            if self.store.replace(cleared, current.rev):
                return cleared
            current = self.store.get(job.job_id)
        return job

    def _drive(self, job_id: str, current: Job | None = None) -> Job:
        """Move the job on while it can: launch when queued and due, repeat a launch in flight."""
        for _ in range(MAX_DRIVE_STEPS):
            job = self._flush(current if current is not None else self._get(job_id))
            current = None
            if job.state not in (JobState.QUEUED, JobState.LAUNCHING):
                return job
            step = begin_launch(job, self.clock())
            if step.job is not None:
                written = self._commit(job, step)
                if written is None:
                    continue
                job = written
            launch = next((e for e in step.effects if isinstance(e, Launch)), None)
            if launch is None:
                return job  # not due yet, or cancelled before it started
            current = self._launch(job, launch)
        return self._get(job_id)

    def _launch(self, job: Job, launch: Launch) -> Job:
        now = self.clock()
        # EBS mode: the agent restores the newest checkpoint on the volume made from the snapshot
        resume_from = "" if job.ebs_volume else (launch.resume_from_hint or self._newest(job))
        result = self.ecs.run_task(run_task_params(job, launch, resume_from, now, self.config.ebs_role_arn))
        if result.task_arn is not None:
            arn = result.task_arn
            step: Callable[[Job], Step] = lambda j: launch_succeeded(  # noqa: E731
                j, arn, launch.client_token, resume_from, self.clock(), resubmitted=launch.attempt > 1
            )
        elif result.refused is not None:
            refused = result.refused
            step = lambda j: launch_refused(j, refused, self.clock())  # noqa: E731
        else:
            reason = result.no_capacity or "no task was placed"
            base = self.config.retry_base_seconds
            waiting = launch_failed(job, reason, now, base)
            if waiting.job is not None and waiting.job.retry_at is not None:
                # The retry is scheduled before the job says it waits, so a crash between the two can
                # leave a spare message (dropped as stale) but never a job nobody will launch again.
                delay = int((waiting.job.retry_at - now).total_seconds())
                self.retries.schedule(job.job_id, waiting.job.launch_tries, delay)
            step = lambda j: launch_failed(j, reason, self.clock(), base)  # noqa: E731
        return self._apply(job.job_id, step, current=job)[0]

    def _newest(self, job: Job) -> str:
        ref = self.checkpoints.newest(job.checkpoint_uri)
        return ref.manifest_uri if ref is not None else ""

    def _with_host(self, job: Job, ev: TaskEvent, cache: dict[str, Any]) -> Job:
        """Fill in what the attempt runs on (once per attempt): instance, type, zone, price."""
        attempt = job.attempt_for(ev.task_arn)
        if attempt is None or attempt.instance_id or not ev.container_instance_arn:
            return job
        if "facts" not in cache:
            cache["facts"] = self.hosts.facts(ev.cluster_arn, ev.container_instance_arn)
        facts = cache["facts"]
        if facts is None:
            return job
        price = (
            task_share(facts.instance_price, job.gpus, facts.instance_gpus)
            if facts.instance_price is not None
            else None
        )
        updated = attempt.model_copy(
            update={
                "instance_id": facts.instance_id,
                "instance_type": facts.instance_type,
                "availability_zone": facts.availability_zone or attempt.availability_zone,
                "lifecycle": facts.lifecycle,
                "price_per_hour": price,
            }
        )
        return job.model_copy(
            update={"attempts": [updated if a.number == attempt.number else a for a in job.attempts]}
        )

    # ------------------------------------------------------------------------------------- adoption
    def _managed(self, task: dict[str, Any], gpus: int) -> bool:
        info = TaskInfo(
            task_arn=task["taskArn"],
            cluster_arn=task["clusterArn"],
            task_definition_arn=task.get("taskDefinitionArn", ""),
            started_by=task.get("startedBy", "") or "",
            tags={t["key"]: t.get("value", "") for t in task.get("tags") or [] if "key" in t},
        )
        return info.tagged_managed or (self.config.manage is ManageMode.ALL_GPU and gpus > 0)

    def _adopt_running(self, ev: TaskEvent) -> Job | None:
        """A task SpotGuard did not start: read it (with tags) once; a managed one becomes a job."""
        if self.store.known_unmanaged(ev.task_arn):
            return None
        task = self.ecs.describe_task(ev.cluster_arn, ev.task_arn)
        if task is None:
            return None
        job = self._adopted(task)
        if job is None:
            self.store.remember_unmanaged(ev.task_arn, self.clock())
            return None
        if not self.store.create(job):
            return self.store.get(job.job_id)
        return job

    def _adopt_stopped(self, task_arn: str) -> str:
        """`resubmit` of a stopped task: its job, or a new one adopted from it."""
        cluster = task_arn.split(":task/", 1)[1].split("/", 1)[0]
        if not self.config.settings.watches(cluster):
            raise CommandError("BadRequest", f"task_arn: cluster {cluster} is not a watched cluster")
        task = self.ecs.describe_task(cluster, task_arn)
        if task is None:
            raise CommandError(
                "NotFound", f"task {task_arn} does not exist (ECS keeps stopped tasks about an hour)"
            )
        ev_ref = TaskEvent(
            task_arn=task_arn,
            cluster_arn=task["clusterArn"],
            last_status="X",
            started_by=task.get("startedBy", ""),
        ).job_ref
        if ev_ref is not None:
            return ev_ref[0]
        job_id = adopted_job_id(task_arn)
        if self.store.get(job_id) is not None:
            return job_id
        if task.get("lastStatus") != "STOPPED":
            raise CommandError(
                "Conflict", f"task {task_arn} is {task.get('lastStatus')}: only a stopped task is resubmitted"
            )
        job = self._adopted(task, force=True)
        assert job is not None
        self.store.create(job)
        return job_id

    def _adopted(self, task: dict[str, Any], force: bool = False) -> Job | None:
        td = self.ecs.task_definition(task["taskDefinitionArn"], task.get("overrides"))
        if not force and not self._managed(task, td.gpus):
            return None
        now = self.clock()
        job_id = adopted_job_id(task["taskArn"])
        uri = checkpoint_uri_of(task, td.environment)
        if uri is None or not uri.startswith(f"s3://{self.config.checkpoint_bucket}/"):
            uri = self._default_uri(job_id)
        stopped = task.get("lastStatus") == "STOPPED"
        attempt = Attempt(
            number=1,
            task_arn=task["taskArn"],
            launched_at=task.get("createdAt") or now,
            last_status=task.get("lastStatus", "PROVISIONING"),
            started_at=task.get("startedAt"),
            stopped_at=task.get("stoppedAt"),
            stop_code=task.get("stopCode"),
            stopped_reason=task.get("stoppedReason"),
            container_instance_arn=task.get("containerInstanceArn"),
            availability_zone=task.get("availabilityZone"),
        )
        if stopped:
            verdict = classify_stop(task, None, td.containers[0] if td.containers else None)
            attempt = attempt.model_copy(
                update={"outcome": verdict.outcome, "outcome_reason": verdict.reason}
            )
        state = JobState.RUNNING
        if stopped:
            state = JobState.SUCCEEDED if attempt.outcome == "succeeded" else JobState.FAILED
        return Job(
            job_id=job_id,
            state=state,
            request=rebuild_request(task, self.config.default_subnets, self.config.default_security_groups),
            options=JobOptions(checkpoint_container=_tag(task, CHECKPOINT_CONTAINER_TAG)),
            checkpoint_uri=uri,
            gpus=td.gpus,
            containers=td.containers,
            created_at=now,
            updated_at=now,
            origin="adopted",
            attempts=[attempt],
            last_reason="adopted" + (f"; its task had stopped: {attempt.outcome_reason}" if stopped else ""),
        )


def summary(job: Job) -> dict[str, Any]:
    live = job.live_attempt
    last = job.attempts[-1] if job.attempts else None
    return {
        "job_id": job.job_id,
        "state": str(job.state),
        "origin": job.origin,
        "gpus": job.gpus,
        "attempts": len(job.attempts),
        "task_arn": (live or last).task_arn if (live or last) else None,
        "instance_type": (live or last).instance_type if (live or last) else None,
        "checkpoint_uri": job.checkpoint_uri,
        "created_at": job.created_at.isoformat(),
        "updated_at": job.updated_at.isoformat(),
        "retry_at": job.retry_at.isoformat() if job.retry_at else None,
        "finished": job.state in TERMINAL,
        "last_reason": job.last_reason,
    }


def _outbox_item(job: Job, index: int, effect: Notify | CapacityWanted) -> OutboxItem:
    now = job.updated_at
    if isinstance(effect, Notify):
        live = job.live_attempt or (job.attempts[-1] if job.attempts else None)
        detail: dict[str, Any] = {
            "state": str(job.state),
            "attempt": live.number if live else 0,
            "task-arn": live.task_arn if live else None,
            "gpus": job.gpus,
        }
        return OutboxItem(
            id=f"{job.job_id}:{job.rev}:{index}",
            kind=effect.kind,
            message=effect.message,
            at=now,
            detail=detail,
        )
    return OutboxItem(
        id=f"{job.job_id}:{job.rev}:{index}",
        kind="capacity-wanted",
        message=effect.reason,
        at=now,
        detail={
            "gpus": effect.gpus,
            "avoid-instances": list(effect.avoid_instances),
            "avoid-pools": [{"instance-type": t, "availability-zone": z} for t, z in effect.avoid_pools],
            "deadline": job.options.deadline.isoformat() if job.options.deadline else None,
        },
    )


def _aws_message(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        err = response.get("Error", {})
        return f"{err.get('Code', 'Error')}: {err.get('Message', '')}".strip()
    return str(exc)


def _event_of(task: dict[str, Any], now: datetime, at_least: int) -> TaskEvent:
    """A stopped task's description as the event ECS would have sent for it. Its `version` when it has
    one; STOPPED is final, so it is never older than what was seen."""
    return task_event_from({**task, "version": max(int(task.get("version") or 0), at_least)}, now)


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


def _mounted_at_launch(cmd: Submit, td: TaskDefinitionInfo) -> bool:
    container = cmd.options.checkpoint_container or (td.containers[0] if td.containers else "")
    return any(v in td.mounts.get(container, {}) for v in td.volumes_at_launch)


def _tag(task: dict[str, Any], key: str) -> str | None:
    return next((t.get("value") for t in task.get("tags") or [] if t.get("key") == key), None) or None
