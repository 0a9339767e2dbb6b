"""Adoption: a task SpotGuard did not start becomes a job when it is managed (tagged
spotguard:managed=true, or any GPU task in all-gpu mode), at its first event; and a stopped task that
is resubmitted by hand becomes a job so that it can start again from its checkpoint."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from functools import partial

from spotguard.domain.jobs.adoption import adopted_job, checkpoint_uri_of
from spotguard.domain.jobs.commands import CommandError
from spotguard.domain.jobs.model import Job, adopted_job_id
from spotguard.domain.tasks import TaskEvent, is_managed
from spotguard.ports import JobEcs, JobStore
from spotguard.usecases.jobs.engine import JobsConfig


class Adoption:
    def __init__(
        self, config: JobsConfig, store: JobStore, ecs: JobEcs, clock: Callable[[], datetime]
    ) -> None:
        self.config = config
        self.store = store
        self.ecs = ecs
        self.clock = clock

    def running(self, ev: TaskEvent) -> Job | None:
        """A task SpotGuard did not start, seen in an event: read it (with tags) once; a managed one
        becomes a job, another is remembered as not managed so that its events are not read again."""
        if self.store.known_unmanaged(ev.task_arn):
            return None
        task = self.ecs.describe_task(ev.cluster_arn, ev.task_arn)
        if task is None:
            return None
        job = self._job(task, force=False)
        if job is None:
            self.store.remember_unmanaged(ev.task_arn, self.clock())
            return None
        if not self.store.create(job):  # adopted by a concurrent event: the same job
            return self.store.get(job.job_id)
        return job

    def stopped(self, task_arn: str) -> str:
        """`resubmit` of a stopped task: the id of its job, or of a new one adopted from it."""
        elsewhere = self.config.settings.elsewhere(task_arn)
        if elsewhere is not None:
            raise CommandError("BadRequest", f"task_arn: {elsewhere}")
        cluster = task_arn.split(":task/", 1)[1].split("/", 1)[0]
        if not self.config.settings.watches(cluster):
            raise CommandError("BadRequest", f"task_arn: cluster {cluster} is not a watched cluster")
        task = self.ecs.describe_task(cluster, task_arn)
        if task is None:
            raise CommandError(
                "NotFound", f"task {task_arn} does not exist (ECS keeps stopped tasks about an hour)"
            )
        if task.job_ref is not None:
            return task.job_ref[0]
        job_id = adopted_job_id(task_arn)
        if self.store.get(job_id) is not None:
            return job_id
        if task.last_status != "STOPPED":
            raise CommandError(
                "Conflict", f"task {task_arn} is {task.last_status}: only a stopped task is resubmitted"
            )
        job = self._job(task, force=True)
        assert job is not None
        self.store.create(job)
        return job_id

    def _job(self, task: TaskEvent, force: bool) -> Job | None:
        td = self.ecs.task_definition(task.task_definition_arn, task.overrides)
        if not force and not is_managed(task.info(), self.config.manage, partial(bool, td.gpus)):
            return None
        job_id = adopted_job_id(task.task_arn)
        uri = checkpoint_uri_of(task, td.environment)
        if uri is None or not uri.startswith(f"s3://{self.config.checkpoint_bucket}/"):
            uri = self.config.default_uri(job_id)
        return adopted_job(
            task,
            td,
            uri,
            self.clock(),
            self.config.default_subnets,
            self.config.default_security_groups,
        )
