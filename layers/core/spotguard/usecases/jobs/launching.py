"""RunTask, the jobs engine's launch effects: an attempt's node 0 (`Launch`), and a gang's other nodes
once node 0 runs (`LaunchPeers`); each hands back the transition that records RunTask's answer. A part
of `JobEngine` (usecases.jobs.engine), which carries the effects out in its loop."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from spotguard.domain.jobs import gangs
from spotguard.domain.jobs.effects import Launch, LaunchPeers, Transition
from spotguard.domain.jobs.launches import launch_failed, launch_refused, launch_succeeded, retry_delay
from spotguard.domain.jobs.model import Job, client_token
from spotguard.domain.jobs.request import run_task_params
from spotguard.domain.jobs.run_errors import pool_refused
from spotguard.ports import JobEcs, LaunchPlacement, LaunchRetries, NewestCheckpoint

if TYPE_CHECKING:
    from spotguard.usecases.jobs.engine import JobsConfig

# the engine's logger: its launches are logged as the engine's, as they always were
log = logging.getLogger("spotguard.usecases.jobs.engine")


class Launching:
    """The engine's RunTask effects, with the engine's own parts (`JobEngine.__init__` sets them)."""

    config: JobsConfig
    ecs: JobEcs
    checkpoints: NewestCheckpoint
    retries: LaunchRetries
    placement: LaunchPlacement
    clock: Callable[[], datetime]

    def _launch(self, job: Job, launch: Launch) -> Transition:
        """RunTask for the attempt (the same client token returns the same task when repeated); the
        transition that records its answer."""
        now = self.clock()
        # EBS mode: the agent restores the newest checkpoint on the volume made from the snapshot
        resume_from = "" if job.ebs_volume else (launch.resume_from_hint or self._newest(job))
        result = self.ecs.run_task(run_task_params(job, launch, resume_from, now, self.config.ebs_role_arn))
        if result.task_arn is not None:
            arn = result.task_arn
            return lambda j: launch_succeeded(
                j, arn, launch.client_token, resume_from, self.clock(), resubmitted=launch.attempt > 1
            )
        reason = result.reason or "no task was placed"
        # ECS refused the pool's capacity provider (detached from the cluster, or being deleted, since
        # discovery saw it): the decision's pool is gone, the job's request is not wrong.
        gone = result.failure == "request" and _in_a_pool(job) and pool_refused(reason)
        if result.failure in ("access", "request") and not gone:
            return lambda j: launch_refused(j, reason, self.clock())
        if result.failure == "capacity" and "GPU" in reason:
            reason = self._no_room(job, reason)
        delay = retry_delay(job.launch_tries, self.config.retry_base_seconds)
        # The retry is scheduled before the job says it waits, so a crash between the two can leave a
        # spare message (dropped as stale) but never a job nobody will launch again.
        self.retries.schedule(job.job_id, job.launch_tries, delay)
        capacity = result.failure == "capacity"
        if capacity and job.placement is not None:
            # The pool has no capacity now: it is marked so, and the job is decided again at once
            # (another pool, on-demand or a wait), the retry message only a backstop.
            self.placement.launch_failed(job, reason)
            delay = 0
        elif gone:
            # So are the provider's pools, and the job is decided again at once, as for capacity.
            self.placement.provider_refused(job, reason)
            delay = 0
        return lambda j: launch_failed(j, reason, self.clock(), delay, capacity=capacity)

    def _no_room(self, job: Job, reason: str) -> str:
        """A launch ECS placed nowhere for want of GPUs: the reason, with what nothing in the cluster can
        hold said, when no instance of it has as many GPUs as a task of the job asks (a user asking more
        than the instances have would otherwise read "no capacity" at every try, for good)."""
        try:
            most = self.ecs.largest_gpus(job.request.cluster)
        except Exception:  # only a better sentence is lost
            log.warning("job %s: could not look at the cluster's instances", job.job_id, exc_info=True)
            return reason
        if most is None or job.gpus <= most:
            return reason
        cluster = job.request.cluster.rsplit("/", 1)[-1]
        return (
            f"{reason}: no instance in cluster {cluster} has {job.gpus} GPUs (the most is {most}); the job "
            "waits for one that has (a pool of larger instances), or cancel it"
        )

    def _launch_peers(self, job: Job, effect: LaunchPeers) -> list[Transition]:
        """RunTask for the gang's nodes not launched yet, each told node 0's address and kept off the
        instances of the nodes placed already; the transitions that record them. A node that cannot be
        placed gives the whole gang up (all or nothing): its pool is marked as for a failed launch, and
        the job launched again once the gang's tasks have stopped."""
        attempt = next((a for a in job.attempts if a.number == effect.attempt), None)
        if attempt is None or gangs.peers_wanted(job) is not attempt:
            return []
        address = gangs.rendezvous(attempt)
        if address is None:  # node 0's address unknown yet: reconcile launches the others once it is
            log.warning("job %s: node 0 of attempt %s has no known address yet", job.job_id, attempt.number)
            return []
        out: list[Transition] = []
        beside = [t.instance_id for t in attempt.tasks if t.instance_id]
        known = attempt.instance_type and attempt.availability_zone
        pool = (str(attempt.instance_type), str(attempt.availability_zone)) if known else None
        for node in gangs.missing_nodes(attempt):
            token = client_token(job.job_id, attempt.number, 0, node)
            launch = Launch(attempt=attempt.number, client_token=token)
            params = run_task_params(
                job,
                launch,
                attempt.resume_from,
                self.clock(),
                self.config.ebs_role_arn,
                node=node,
                rendezvous=address,
                beside=beside,
                pool=pool,
            )
            result = self.ecs.run_task(params)
            if result.task_arn is None:
                reason = f"node {node}: {result.reason or 'no task was placed'}"
                if result.failure in ("access", "request"):  # no retry can help: as for node 0's
                    out.append(lambda j, why=reason: gangs.peer_refused(j, attempt.number, why, self.clock()))
                    break
                if result.failure == "capacity" and job.placement is not None:
                    self.placement.launch_failed(job, reason)
                out.append(lambda j, why=reason: gangs.abandon_gang(j, attempt.number, why, self.clock()))
                break
            arn = result.task_arn
            out.append(
                lambda j, n=node, a=arn, t=token: gangs.peer_launched(
                    j, attempt.number, n, a, t, self.clock()
                )
            )
        return out

    def _newest(self, job: Job) -> str:
        ref = self.checkpoints.newest(job.checkpoint_uri)
        return ref.manifest_uri if ref is not None else ""


def _in_a_pool(job: Job) -> bool:
    """The launch in flight goes where a capacity decision put it: a pool's capacity provider."""
    return job.placement is not None and bool(job.placement.pool and job.placement.capacity_provider)
