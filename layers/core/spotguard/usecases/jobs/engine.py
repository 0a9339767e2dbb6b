"""The jobs engine: every change to a job goes through `JobEngine.run`, in one loop, and nothing else
writes a job. The loop and the effects it carries out are read together here; RunTask's (node 0's launch,
a gang's other nodes) are the engine's part in launching.py.

1. apply a transition (a pure function of domain.jobs) to the job as it stands;
2. commit the new job with compare-and-set on `rev` (on a conflict: reload and apply again), with its
   notifications in the job's outbox, which are sent right after the write;
3. carry out the step's effects (StopTask, RunTask, in EBS mode snapshots and clean-up); an effect whose
   outcome changes the job (RunTask's answer, a snapshot taken) hands back the next transition, which
   goes through 1-3 in the same loop;
4. when asked to drive: while the job is queued and due (or a launch is in flight), begin a launch,
   placed where the capacity advisor (capacity.py) decides, or wait as long as it says.

Nothing here calls back into `run`: effects only ever return transitions for the loop to apply.
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from spotguard.domain.jobs.commands import CommandError
from spotguard.domain.jobs.effects import (
    CapacityWanted,
    Checkpoint,
    Cleanup,
    Effect,
    GiveBackSpare,
    Launch,
    LaunchLater,
    LaunchPeers,
    Notify,
    RaiseSpare,
    Snapshot,
    Step,
    Stop,
    Transition,
)
from spotguard.domain.jobs.launches import begin_launch, due
from spotguard.domain.jobs.model import Job, JobError, JobState, OutboxItem, revised
from spotguard.domain.jobs.replies import Notification
from spotguard.domain.settings import Settings
from spotguard.domain.tasks import ManageMode, TaskInfo
from spotguard.ports import (
    JobEcs,
    JobStore,
    LaunchPlacement,
    LaunchRetries,
    NewestCheckpoint,
    Notifications,
    Signaller,
    SpareEffects,
    VolumeEffects,
)
from spotguard.usecases.jobs.launching import Launching

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)
MAX_WRITE_TRIES = 8  # compare-and-set conflicts (concurrent events for one job) before giving up
MAX_DRIVE_STEPS = 6  # launches begun in one run (each RunTask answer is applied before the next)
# How long the Lambda that wrote a notification into the outbox (or claimed a leftover) holds it for its
# send: others leave it alone meanwhile, so it goes out once, not once per Lambda that reads the job in
# the send's few hundred milliseconds. A sender whose send fails lets go at once; one that dies is
# outlived: its retry comes after the queue's visibility timeout (60 s or more), past the hold.
OUTBOX_HOLD_SECONDS = 30


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
    pass_roles: tuple[str, ...] = ()  # roles the stack may pass to ECS (ARN patterns); empty: any
    task_families: tuple[str, ...] = ()  # task definition families it may run; empty: any

    def default_uri(self, job_id: str) -> str:
        return f"s3://{self.checkpoint_bucket}/{self.checkpoint_prefix}{job_id}/"


class Conflict(RuntimeError):
    """The job kept changing under us: the record is retried (SQS) or the caller is told."""


class JobEngine(Launching):
    def __init__(
        self,
        config: JobsConfig,
        store: JobStore,
        ecs: JobEcs,
        checkpoints: NewestCheckpoint,
        notifier: Notifications,
        retries: LaunchRetries,
        clock: Callable[[], datetime],
        volumes: VolumeEffects | None = None,
        placement: LaunchPlacement | None = None,
        signaller: Signaller | None = None,
        spares: SpareEffects | None = None,
        on_written: Sequence[Callable[[Job, Job], None]] = (),
    ) -> None:
        self.config = config
        self.store = store
        self.ecs = ecs
        self.checkpoints = checkpoints
        self.notifier = notifier
        self.retries = retries
        self.clock = clock
        self.volumes = volumes or VolumeEffects()
        self.placement = placement or LaunchPlacement()
        self.signaller = signaller  # a move's SIGUSR1 to the job's checkpoint container (SSM)
        self.spares = spares  # the early replacement (usecases.jobs.spares); None: off
        # what each write taught: called with the job the write was computed on and the job written,
        # once per successful compare-and-set (job_metrics.SpendMeter: what an attempt spent; the
        # capacity advisor's task_seen: a start or an interruption in its pool). An attempt starts, or
        # stops, in exactly one such write, however many Lambdas apply its events at once; a watcher
        # that compared the job it read with the job after would count a lost race's re-read too.
        self.on_written = list(on_written)

    def get(self, job_id: str) -> Job:
        job = self.store.get(job_id)  # UnreadableJob: the caller says which job, and why, in one line
        if job is None:
            raise CommandError("NotFound", f"job {job_id} does not exist")
        return job

    def run(
        self, job_id: str, *transitions: Transition, current: Job | None = None, drive: bool = True
    ) -> tuple[Job, str]:
        """Apply the transitions, in order, and every transition their effects lead to; then, if `drive`,
        launch the job while it is queued and due. Starts from `current` when the caller has the job in
        hand (reloading only when someone else wrote it meanwhile). Returns the job as it now stands and
        the first transition's note."""
        job, note, _ = self._settle(job_id, transitions, current)
        return (self.drive(job_id, job) if drive else job), note

    def drive(self, job_id: str, current: Job | None = None) -> Job:
        """Move the job on while it can: launch when queued and due, repeat a launch in flight."""
        job = current if current is not None else self.get(job_id)
        for _ in range(MAX_DRIVE_STEPS):
            job = self.flush(job)
            if job.state not in (JobState.QUEUED, JobState.LAUNCHING):
                break
            decision = None
            if due(job, self.clock()) and not job.cancel_requested:
                decision = self.placement.decide(job, "launch")
                if decision is not None and decision.placement == "none":
                    # the retry message first, as for a failed launch: a wait nobody ends cannot happen
                    self.retries.schedule(job_id, job.launch_tries + 1, max(1, decision.recheck_seconds))
            job, _, launched = self._settle(
                job_id, [lambda j, d=decision: begin_launch(j, self.clock(), d)], job
            )
            if not launched:
                break  # not due yet, waiting for capacity, or cancelled before it started
        return job

    def flush(self, job: Job, held_by: str | None = None) -> Job:
        """Send the job's pending notifications that are this call's to send, then take them out of the
        outbox: the ones its commit has just written (held by its token, `held_by`), and the leftovers
        of a sender that died or failed, once its hold has run out, claimed first by compare-and-set.
        Items another Lambda holds are left to it. Returns the job as it stands after (reloaded only if
        someone wrote it meanwhile)."""
        if not job.outbox:
            return job
        job, tokens = self._claim_leftovers(job, held_by)
        items = [i for i in job.outbox if i.held_by in tokens]
        if not items:
            return job

        def mine(i: OutboxItem) -> bool:  # by holder: never another sender's hold
            return i.held_by in tokens

        try:
            self.notifier.send_all(
                [
                    Notification(id=i.id, kind=i.kind, job_id=job.job_id, message=i.message, detail=i.detail)
                    for i in items
                ]
            )
        except Exception:
            # let go, so that the retry of this event (or whoever reads the job next) sends them now
            self._rewrite_outbox(job, mine, lambda i: revised(i, sending_until=None, held_by=None))
            raise
        return self._rewrite_outbox(job, mine, lambda i: None)

    def _claim_leftovers(self, job: Job, held_by: str | None) -> tuple[Job, set[str | None]]:
        """The leftovers nobody holds now (no holder, or a hold run out), held by this call: a
        compare-and-set, so that of two readers one claims them. The job as it stands after, and the
        tokens whose items this call may send (`held_by`'s, and its claim's)."""
        tokens: set[str | None] = {held_by} if held_by else set()
        current: Job | None = job
        claim: str | None = None
        for _ in range(MAX_WRITE_TRIES):
            if current is None:
                return job, tokens
            if claim is not None and any(i.held_by == claim for i in current.outbox):
                return current, tokens | {claim}  # the claim went through, its answer lost
            now = self.clock()
            free = {i.id for i in current.outbox if i.held_by not in tokens and i.free_at(now)}
            if not free:
                return current, tokens
            claim = claim or uuid.uuid4().hex
            until = now + timedelta(seconds=OUTBOX_HOLD_SECONDS)
            held = [
                revised(i, sending_until=until, held_by=claim) if i.id in free else i for i in current.outbox
            ]
            claimed = revised(current, outbox=held, rev=current.rev + 1)
            if self.store.replace(claimed, current.rev):
                return claimed, tokens | {claim}
            current = self.store.get(job.job_id)
        return current or job, tokens  # the leftovers wait for the next reader; its own items go now

    def _rewrite_outbox(
        self, job: Job, which: Callable[[OutboxItem], bool], change: Callable[[OutboxItem], OutboxItem | None]
    ) -> Job:
        """The outbox items `which` picks changed (None: taken out), by compare-and-set on the job as it
        stands."""
        current: Job | None = job
        for _ in range(MAX_WRITE_TRIES):
            if current is None:
                return job
            if not any(which(i) for i in current.outbox):
                return current
            outbox = [c for i in current.outbox if (c := change(i) if which(i) else i) is not None]
            rewritten = revised(current, outbox=outbox, rev=current.rev + 1)
            if self.store.replace(rewritten, current.rev):
                return rewritten
            current = self.store.get(job.job_id)
        return job

    # ------------------------------------------------------------------------------------- the loop
    def _settle(self, job_id: str, first: Iterable[Transition], current: Job | None) -> tuple[Job, str, bool]:
        """The one loop: write a transition, carry out its effects, queue the transitions they hand
        back, until none is left. Returns the job, the first step's note, and whether RunTask was called."""
        pending: deque[Transition] = deque(first)
        note: str | None = None
        launched = False
        spare_checked = False
        job = current
        while pending:
            job, step = self._write(job_id, pending.popleft(), job)
            note = step.note if note is None else note
            for effect in step.effects:
                launched = launched or isinstance(effect, Launch)
                pending.extend(self._carry_out(job, effect))
            if not pending and not spare_checked and self.spares is not None and job is not None:
                # every change may end the job's need for its spare: give it back with that change
                spare_checked = True
                give_back = self.spares.unneeded(job)
                if give_back is not None:
                    pending.append(give_back)
        job = job if job is not None else self.get(job_id)
        return job, note or "", launched

    def _write(self, job_id: str, transition: Transition, current: Job | None) -> tuple[Job, Step]:
        """Compute the transition on the job as it stands and commit it (compare-and-set)."""
        for _ in range(MAX_WRITE_TRIES):
            job = current if current is not None else self.get(job_id)
            current = None
            try:
                step = transition(job)
            except JobError as exc:
                raise CommandError("Conflict", str(exc)) from None
            if step.job is None:
                return job, step
            written, current = self._commit(job, step)
            if written is not None:
                return written, step
        raise Conflict(f"job {job_id} changed {MAX_WRITE_TRIES} times while being updated")

    def _commit(self, old: Job, step: Step) -> tuple[Job | None, Job | None]:
        """Write the step's job (with its notifications in the outbox) if `old` is still current;
        then send them. (The job as written and flushed, None) or, when another writer got there first,
        (None, the job as it now stands: None if unread)."""
        assert step.job is not None
        token = uuid.uuid4().hex  # this write's: on the job and on the notifications it holds
        hold = self.clock() + timedelta(seconds=OUTBOX_HOLD_SECONDS)
        items = [
            revised(outbox_item(step.job, i, e), sending_until=hold, held_by=token)
            for i, e in enumerate(step.effects)
            if isinstance(e, Notify | CapacityWanted)
        ]
        new = revised(step.job, outbox=[*step.job.outbox, *items]) if items else step.job
        new = new.model_copy(update={"written_by": token})  # a plain string of ours: no need to validate
        stands = new
        if not self.store.replace(new, old.rev):
            # The write may have gone through with its answer lost (botocore sent it again, and the
            # second try met the first): then it is this write's, with its effects still to carry out
            # and its notifications (held by it: nobody else sends them for the hold's length) to send.
            seen = self.store.get(new.job_id)
            ours = seen is not None and (
                seen.written_by == token or any(i.held_by == token for i in seen.outbox)
            )
            if not ours:
                return None, seen
            assert seen is not None
            stands = seen
        for watcher in self.on_written:
            try:
                watcher(old, new)
            except Exception:  # a metric or a pool fact lost, never the job's change
                log.exception("job %s: could not record what its change taught", new.job_id)
        return self.flush(stands, held_by=token), None

    def _carry_out(self, job: Job, effect: Effect) -> Iterable[Transition]:
        """Do one effect; return the transitions its outcome leads to. Notifications are in the outbox
        already (sent by the commit)."""
        if isinstance(effect, Stop):
            self.ecs.stop_task(effect.cluster, effect.task_arn, effect.reason)
        elif isinstance(effect, Launch):
            return [self._launch(job, effect)]
        elif isinstance(effect, LaunchPeers):
            return self._launch_peers(job, effect)
        elif isinstance(effect, LaunchLater):
            self.retries.schedule(job.job_id, effect.launch_try, effect.delay_seconds)
        elif isinstance(effect, Snapshot):
            return self.volumes.snapshot(job, effect.attempt)
        elif isinstance(effect, Cleanup):
            return self.volumes.cleanup(job, effect)
        elif isinstance(effect, Checkpoint):
            self._signal_checkpoint(job, effect.attempt)
        elif isinstance(effect, RaiseSpare | GiveBackSpare) and self.spares is not None:
            return self.spares.carry(job, effect)
        return []

    def _signal_checkpoint(self, job: Job, attempt: int) -> None:
        """SIGUSR1 to the attempt's checkpoint container (a move asks for a checkpoint first)."""
        live = next((a for a in job.attempts if a.number == attempt), None)
        if self.signaller is None or live is None or not live.instance_id:
            log.warning(
                "job %s: cannot signal attempt %s (no signaller, or no instance known); the move waits",
                job.job_id,
                attempt,
            )
            return
        container = job.checkpoint_container
        task = TaskInfo(
            task_arn=live.task_arn,
            cluster_arn=job.request.cluster,
            task_definition_arn=job.request.taskDefinition,
            container_instance_arn=live.container_instance_arn,
            containers=((container, None),) if container else (),
        )  # no runtime id: the signal document finds the container by the task's labels
        self.signaller.signal(live.instance_id, [task], "SIGUSR1")


def outbox_item(job: Job, index: int, effect: Notify | CapacityWanted) -> OutboxItem:
    """A notification as the job's outbox keeps it: its id is stable (job, rev, index), so a consumer can
    drop one sent twice."""
    item_id = f"{job.job_id}:{job.rev}:{index}"
    if isinstance(effect, Notify):
        live = job.live_attempt or (job.attempts[-1] if job.attempts else None)
        detail: dict[str, Any] = {
            "state": str(job.state),
            "attempt": live.number if live else 0,
            "task-arn": live.task_arn if live else None,
            "gpus": job.gpus,
            **effect.detail,
        }
        return OutboxItem(
            id=item_id, kind=effect.kind, message=effect.message, at=job.updated_at, detail=detail
        )
    return OutboxItem(
        id=item_id,
        kind="capacity-wanted",
        message=effect.reason,
        at=job.updated_at,
        detail={
            "gpus": effect.gpus,
            "avoid-instances": list(effect.avoid_instances),
            "avoid-pools": [{"instance-type": t, "availability-zone": z} for t, z in effect.avoid_pools],
            "deadline": job.options.deadline.isoformat() if job.options.deadline else None,
        },
    )
