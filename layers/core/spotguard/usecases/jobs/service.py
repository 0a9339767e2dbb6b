"""Jobs: submit, follow their tasks, resubmit from the newest checkpoint, and the manual controls.

Each entry point here turns one request or event into a transition of domain.jobs and hands it to the
engine (engine.py), which writes it and carries out what follows, down to the next RunTask. Adoption,
EBS mode, reconcile and the submit's own checks (submit_checks.py) have modules of their own beside this
one: here, one short method per entry point of the jobs function, each a door to the engine.

A STOPPED task event, for instance: `on_task_event` -> engine.run(transitions.on_task_event) ->
compare-and-set write -> engine.drive -> launches.begin_launch -> RunTask (request.run_task_params).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from datetime import datetime
from typing import Any

from spotguard.domain.interruption.notices import Notice
from spotguard.domain.jobs.answers import JobStatus, JobSummary
from spotguard.domain.jobs.commands import Cancel, CommandError, ListJobs, Resubmit, Status, Submit
from spotguard.domain.jobs.effects import Launch, Step, Transition
from spotguard.domain.jobs.gangs import NOTHING_TO_ABANDON
from spotguard.domain.jobs.model import (
    Job,
    JobState,
    adopted_job_id,
    client_token,
    revised,
)
from spotguard.domain.jobs.request import deadline_refused, not_permitted, run_task_params
from spotguard.domain.jobs.task_events import PoolEvent, indexed_info, pool_event_refused
from spotguard.domain.jobs.transitions import (
    NO_MOVE,
    abandon_provisioning,
    on_task_event,
    request_cancel,
    request_move,
    request_resubmit,
)
from spotguard.domain.prices import task_share
from spotguard.domain.tasks import TaskEvent
from spotguard.ports import (
    Hosts,
    JobEcs,
    JobStore,
    LaunchPlacement,
    LaunchRetries,
    PoolObservations,
    StopClaims,
    TaskIndex,
)
from spotguard.usecases.jobs.adoption import Adoption
from spotguard.usecases.jobs.ebs import EbsVolumes, ebs_checkpointing
from spotguard.usecases.jobs.engine import JobEngine, JobsConfig
from spotguard.usecases.jobs.submit_checks import aws_message, aws_refused, gang_refusal, same_submit

log = logging.getLogger(__name__)


class JobService:
    def __init__(
        self,
        engine: JobEngine,
        hosts: Hosts,
        claims: StopClaims,
        index: TaskIndex | None = None,
        volumes: EbsVolumes | None = None,
        placement: LaunchPlacement | None = None,
        pool_observations: PoolObservations | None = None,
        *,
        retries: LaunchRetries,
    ) -> None:
        self.engine = engine
        # the capacity ports, given to the service directly (the composition root passes the advisor
        # for both): where a move would go, and what the pools taught
        self.placement = placement or LaunchPlacement()
        self.pool_observations = pool_observations or PoolObservations()
        self.retries = retries
        self.config: JobsConfig = engine.config
        self.store: JobStore = engine.store
        self.ecs: JobEcs = engine.ecs
        self.clock: Callable[[], datetime] = engine.clock
        self.hosts = hosts
        self.claims = claims
        self.index = index
        self.volumes = volumes
        self.adoption = Adoption(self.config, self.store, self.ecs, self.clock)

    # ================================================================================ manual actions
    def submit(self, cmd: Submit) -> Job:
        elsewhere = self.config.settings.elsewhere(cmd.request.cluster)
        if elsewhere is not None:
            raise CommandError("BadRequest", f"request.cluster: {elsewhere}")
        if not self.config.settings.watches(cmd.request.cluster):
            watched = ", ".join(self.config.settings.clusters) or "none"
            raise CommandError(
                "BadRequest", f"request.cluster: {cmd.request.cluster} is not a watched cluster ({watched})"
            )
        job_id = cmd.job_id or f"job-{self.clock():%Y%m%d}-{secrets.token_hex(4)}"
        existing = self.store.get(job_id)
        if existing is not None:
            return same_submit(existing, cmd)
        # The request's own shape, by ECS's API model, before anything reads it: overrides that are not
        # ECS's TaskOverride must be refused as such, not break the reading of the task definition.
        wrong = self.ecs.check_run_task(cmd.request.model_dump(exclude_none=True))
        if wrong:
            raise CommandError("BadRequest", f"request: {wrong}")
        try:
            td = self.ecs.task_definition(cmd.request.taskDefinition, cmd.request.overrides)
        except Exception as exc:
            if not aws_refused(exc):  # throttled, a server error, a timeout: the submit is to be tried again
                raise
            # the ECS error says what is wrong with the name
            raise CommandError("BadRequest", f"request.taskDefinition: {aws_message(exc)}") from None
        if cmd.options.checkpoint_container and cmd.options.checkpoint_container not in td.containers:
            raise CommandError(
                "BadRequest",
                f"options.checkpoint_container: {cmd.options.checkpoint_container!r} is not a container of "
                f"{td.arn} ({', '.join(td.containers)})",
            )
        config = self.config
        refused = deadline_refused(cmd.options.deadline, self.clock()) or not_permitted(
            cmd.request, cmd.options, td, config.pass_roles, config.task_families, config.ebs_role_arn
        )
        if refused:
            raise CommandError("BadRequest", refused)
        ebs = ebs_checkpointing(cmd, td, self.config.ebs_role_arn)
        gang_refused = gang_refusal(cmd, td, ebs is not None)
        if gang_refused:
            raise CommandError("BadRequest", gang_refused)
        now = self.clock()
        job = Job(
            job_id=job_id,
            state=JobState.QUEUED,
            request=cmd.request,
            options=cmd.options,
            checkpoint_uri=ebs[1] if ebs else self.config.default_uri(job_id),
            gpus=td.gpus,
            containers=td.containers,
            created_at=now,
            updated_at=now,
            ebs_volume=ebs[0] if ebs else None,
        )
        # The request as RunTask will get it, checked against ECS's API model before the job exists: a
        # request botocore would refuse must be refused now, not fail the job at its first launch.
        first = Launch(attempt=1, client_token=client_token(job_id, 1, 1))
        wrong = self.ecs.check_run_task(run_task_params(job, first, "", now, self.config.ebs_role_arn))
        if wrong:
            raise CommandError("BadRequest", f"request: {wrong}")
        if not self.store.create(job):  # the same id, submitted at the same moment
            again = self.store.get(job_id)
            assert again is not None
            return same_submit(again, cmd)
        return self.engine.drive(job_id, job)

    def resubmit(self, cmd: Resubmit) -> Job:
        if cmd.task_arn is not None:
            job_id = self.adoption.stopped(cmd.task_arn)
        else:
            assert cmd.job_id is not None
            job_id = cmd.job_id
        job = self.engine.get(job_id)
        if cmd.checkpoint and not cmd.checkpoint.startswith(job.checkpoint_uri):
            raise CommandError(
                "BadRequest",
                f"checkpoint: not one of job {job_id}'s checkpoints (under {job.checkpoint_uri})",
            )
        return self.engine.run(
            job_id, lambda j: request_resubmit(j, self.clock(), cmd.checkpoint), current=job
        )[0]

    def cancel(self, cmd: Cancel) -> Job:
        job = self.engine.get(cmd.job_id)
        try:
            return self.engine.run(
                cmd.job_id, lambda j: request_cancel(j, self.clock(), cmd.reason), current=job, drive=False
            )[0]
        except CommandError:
            raise
        except Exception:
            # the cancel was written, and a StopTask after it failed (throttled): the attempt's stop is
            # recorded and reconcile asks again, so the cancel stands and is answered as taken
            after = self.store.get(cmd.job_id)
            if after is None or not after.cancel_requested:
                raise
            log.warning("job %s: cancelled; a StopTask failed and is asked again", cmd.job_id, exc_info=True)
            return after

    def status(self, cmd: Status) -> JobStatus:
        job = self.engine.flush(self.engine.get(cmd.job_id))
        return JobStatus.of(job, self.store.checkpoints(job.checkpoint_uri), self.clock())

    def list(self, cmd: ListJobs) -> list[JobSummary]:
        return [JobSummary.of(j) for j in self.store.list(cmd.state, cmd.limit)]

    # =============================================================================== event handling
    def on_task_event(self, ev: TaskEvent) -> str:
        """Apply one ECS task event to its job (adopting the task if it is managed and new)."""
        ref = ev.job_ref
        job_id = ref[0] if ref else adopted_job_id(ev.task_arn)
        job = self.store.get(job_id)
        if job is None and ref is None:
            job = self.adoption.running(ev)
        self._index(ev, job)
        if job is None:
            return (
                "not a managed task" if ref is None else f"job {job_id} is not in the ledger: event ignored"
            )
        # what the event taught (spend, pool facts) is recorded by the write that applied it (the
        # engine's on_written), so a repeated event racing this one is counted once
        return self.engine.run(job_id, self._task_event(ev), current=job)[1]

    def on_launch_due(self, job_id: str, launch_try: int) -> str:
        """A retry message: a job that waited for capacity is due for another RunTask."""
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
        self.engine.drive(job_id, job)
        return "launched"

    def on_snapshot(self, snapshot_id: str, ok: bool) -> str:
        """An EBS Snapshot Notification: the job waiting for it is queued, from this snapshot or, if it
        failed, the one before."""
        assert self.volumes is not None
        job_id = self.volumes.owner(snapshot_id)
        if job_id is None:
            return "not a SpotGuard snapshot"
        job = self.store.get(job_id)
        if job is None:
            return f"job {job_id} is not in the ledger"
        note = self.engine.run(job_id, self.volumes.settled(snapshot_id, ok), current=job)[1]
        return note or f"snapshot {'completed' if ok else 'failed'}"

    def on_pool_event(self, ev: PoolEvent) -> str:
        """Auto Scaling could not launch an instance for a group: its pools in that zone are marked
        unavailable, and the tasks launched there before the failure that still wait for an instance are
        stopped and launched elsewhere. Auto Scaling launched one (`ev.available`): the pools are marked
        available (their backoff ends, and a move may go there); no task is stopped.

        Weighed by its time: an event dated further ahead of the clock than clock skew is refused (kept,
        it would hold the pool until its date); one older than the pool's newer facts, or whose backoff
        is already over, is kept as history and changes nothing now (`PoolMarks.in_effect`)."""
        refused = pool_event_refused(ev, self.clock())
        if refused:
            log.warning("pool event refused: %s", refused)
            return f"refused: {refused}"
        marks = self.pool_observations.pool_event(ev)
        if not marks.kept:
            return f"group {ev.group} is no pool of a watched cluster"
        if not marks.in_effect:
            pools = ", ".join(sorted(p for _, p in marks.kept))
            return f"kept as history on {pools} (dated {ev.at.isoformat()}): no pool changes now"
        marked = set(marks.in_effect)
        pools = ", ".join(sorted(p for _, p in marked))
        if ev.available:
            # spot is there again: a deadline job on on-demand may move now rather than at the next sweep
            moving = 0
            for job in self.store.list(JobState.RUNNING, 500):
                live = job.live_attempt
                if live is not None and live.market == "on-demand":
                    moving += self.consider_move(job, "pool-event")
            return f"marked available: {pools}; {moving} job(s) asked to move"
        moved = 0
        for job in self.store.list(JobState.RUNNING, 500):
            live = job.live_attempt
            if live is None or live.pool is None or (job.request.cluster_name, live.pool) not in marked:
                continue
            if live.launched_at > ev.at:  # launched after the failure: it says nothing of this task
                continue
            why = f"Auto Scaling: {ev.message}"[:150]
            # on the job as it stands now (no `current`): its task may have started since the list
            _, note = self.engine.run(
                job.job_id, lambda j, n=live.number, why=why: abandon_provisioning(j, n, why, self.clock())
            )
            moved += note != NOTHING_TO_ABANDON
        return f"marked unavailable: {pools}; {moved} waiting task(s) stopped to launch elsewhere"

    def on_warning(self, notice: Notice) -> str:
        """A spot warning or a terminate action (the interruption function stops the tasks): the early
        replacement of the jobs on the host, when the stack has it (usecases.jobs.spares)."""
        spares = self.engine.spares
        if spares is None:
            return "early replacement is off"
        return spares.on_warning(notice, self.engine, self.placement)

    def consider_move(self, job: Job, trigger: str) -> bool:
        """Ask the policy again for a running deadline job (reconcile's sweep, a pool event) and start a
        move when it says the job should be elsewhere: SIGUSR1 now, the stop once the checkpoint that
        follows is committed (reconcile). Bounded: no move of a job without a deadline or placed by hand,
        of an attempt not running or already being stopped, past `max_moves`, or sooner than
        `min_move_interval_seconds` after its launch. True when a move was started."""
        now, attempt, options = self.clock(), job.live_attempt, job.options
        if (
            attempt is None
            or job.move is not None
            or options.deadline is None
            or options.capacity != "auto"
            or attempt.market is None
            or attempt.last_status != "RUNNING"
            or attempt.stopped_reason is not None  # being stopped already (a notice, a cancel, ECS)
            or attempt.interrupted_by is not None
            or job.moves_made >= options.max_moves
            or (now - attempt.launched_at).total_seconds() < options.min_move_interval_seconds
        ):
            return False
        decision = self.placement.decide(job, trigger)
        if decision is None or decision.placement in ("none", attempt.market):
            if decision is not None:  # the answer to "why did it not move?", in the function's log
                said = decision.summary()
                log.info("job %s stays on %s (%s): %s", job.job_id, attempt.market, trigger, said)
            return False
        _, note = self.engine.run(
            job.job_id, lambda j: request_move(j, attempt.number, decision, now), current=job, drive=False
        )
        return note != NO_MOVE

    # ------------------------------------------------------------------------------------ internals
    def _task_event(self, ev: TaskEvent) -> Transition:
        """The transition for a task event: SpotGuard's own stop claim on the host (a STOPPED event) and
        what the attempt runs on (instance, type, zone, price; looked up once per attempt)."""
        facts_cache: dict[str, Any] = {}

        def transition(job: Job) -> Step:
            attempt = job.attempt_for(ev.task_arn)
            task = attempt.node_task(ev.task_arn) if attempt is not None else None  # a gang: its node
            notice = None
            if ev.last_status == "STOPPED" and task is not None and task.instance_id:
                notice = self.claims.stop_claim(task.instance_id)
            step = on_task_event(job, ev, notice, self.clock())
            if step.job is not None:
                step = revised(step, job=self._with_host(step.job, ev, facts_cache))
            return step

        return transition

    def _index(self, ev: TaskEvent, job: Job | None) -> None:
        """Keep the host's task index, so a notice for the host needs no DescribeTasks."""
        if self.index is None or not ev.container_instance_arn:
            return
        container = job.checkpoint_container if job else None
        info = indexed_info(
            ev, managed=job is not None, gpu=bool(job and job.gpus), checkpoint_container=container
        )
        self.index.index_task(info, ev.version, self.clock())

    def _with_host(self, job: Job, ev: TaskEvent, cache: dict[str, Any]) -> Job:
        """Fill in what the event's task runs on (once per task): instance, type, zone, price, and its
        private address (a gang's node 0: where the other nodes find it)."""
        attempt = job.attempt_for(ev.task_arn)
        task = attempt.node_task(ev.task_arn) if attempt is not None else None
        if attempt is None or task is None or task.instance_id or not ev.container_instance_arn:
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
        updated = revised(
            task,
            instance_id=facts.instance_id,
            instance_type=facts.instance_type,
            availability_zone=facts.availability_zone or task.availability_zone,
            lifecycle=facts.lifecycle,
            price_per_hour=price,
            private_ip=task.private_ip or facts.private_ip,  # awsvpc: the task's own address first
        )
        changed = attempt.with_node(updated)
        return revised(job, attempts=[changed if a.number == attempt.number else a for a in job.attempts])
