"""`SoakWorld`: the world a soak plays, on the virtual clock: the spot pools following their traces (spot's
warnings, instances taken back, launched and joining), the jobs submitted and cancelled as their users
would, and each job's tasks modelled (placed, running, committing, stopped, exiting) as ECS and the agent
would run them."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from spotguard_cli.emulator.soak.faults import SoakFaults
from spotguard_cli.emulator.soak.model import (
    CANCEL_AFTER_HOURS,
    CANCEL_REASON,
    COMMIT_MINUTES,
    INSTANCE_TYPE,
    START,
    SUBMIT_RETRY_SECONDS,
    WARNING_SECONDS,
    ZONES,
    Task,
)


class SoakWorld(SoakFaults):
    """The pools, the jobs and the tasks, each step of the loop (loop.py)."""

    # ----------------------------------------------------------------------------------- the pools
    def _tick(self, now: datetime) -> int:
        gap = self.traces[0].gap_hours * 3600
        return int((now - START).total_seconds() // gap)

    def _traces(self, now: datetime) -> None:
        tick = self._tick(now)
        for i, trace in enumerate(self.traces):
            up = trace.available[min(tick, len(trace.available) - 1)]
            if up == self.available[i]:
                continue
            self.available[i] = up
            if up:  # the group launches what the pool lacks; each instance joins once booted
                launched = self.hosts_per_pool - len(self.pools[i])
                self.booting += [(now + self.boot, i)] * launched
                self._note(f"pool {i}: spot back, {launched} instance(s) launched")
            else:
                gone = [b for b in self.booting if b[1] == i]
                if gone:  # still booting: taken back before they join
                    self._note(f"pool {i}: {len(gone)} booting instance(s) gone")
                    self.booting = [b for b in self.booting if b[1] != i]
                for host in self.pools[i]:
                    if self._fault("no-warning"):  # spot takes the instance back without a word
                        self.reclaims.append((now, host))
                        self._note(f"pool {i}: {host.instance_id} goes without a warning")
                        continue
                    self.world.interrupt(host)  # the warning, through the interruption function
                    self.interruptions += 1
                    self.reclaims.append((now + timedelta(seconds=WARNING_SECONDS), host))
                    self._note(f"pool {i}: spot warning for {host.instance_id}")
                    self._slow_last_commits(host)
                self.pools[i] = []
        for when, i in [b for b in self.booting if b[0] <= now]:
            self.booting.remove((when, i))
            host = self.world.cluster.add_host(INSTANCE_TYPE, ZONES[i])
            self.pools[i].append(host)
            self._note(f"pool {i}: {host.instance_id} joins")
        for when, host in [r for r in self.reclaims if r[0] <= now]:
            self.reclaims.remove((when, host))
            for task in self._live_on(host):
                if task.stop_asked_at is not None and task.running_at is not None:
                    self._commit_cut(task)  # stopped, still writing its last checkpoint
                reason = f"Host EC2 (instance {host.instance_id}) terminated."
                self._exit(task, None, reason)
            self.world.cluster.remove_host(host)
            self._note(f"{host.instance_id} taken back")

    # ------------------------------------------------------------------------------------ the jobs
    def _submit(self, now: datetime) -> None:
        from spotguard_cli.emulator.lambdas import InvocationFailed

        for book in self.books.values():
            if book.submitted or book.submit_at > now:
                continue
            try:
                answer = self.world.invoke(
                    {
                        "action": "submit",
                        "job_id": book.job_id,
                        "request": {"cluster": "gpu-spot", "taskDefinition": self.td, "launchType": "EC2"},
                        "options": {"max_attempts": 100},
                    }
                )
            except InvocationFailed as exc:  # Lambda's error: the user's CLI submits the same job again
                answer = {"ok": False, "error": {"type": "InvocationFailed", "message": str(exc)}}
            failed = answer.get("error", {}).get("type") in ("InternalError", "InvocationFailed")
            if not answer.get("ok") and failed and self.injector is not None:  # a fault (else: SpotGuard)
                book.submit_at = now + timedelta(seconds=SUBMIT_RETRY_SECONDS)
                why = answer["error"]["message"]
                self._note(f"{book.job_id} submit failed ({why}): again at {book.submit_at.isoformat()}")
                continue
            if not answer.get("ok"):
                raise RuntimeError(f"submit {book.job_id}: {answer}")
            book.submitted, book.checkpoint_uri = True, answer["job"]["checkpoint_uri"]
            self._note(f"{book.job_id} submitted")
            if self._fault("cancelled"):
                book.cancel_at = now + timedelta(hours=self.chance.uniform(*CANCEL_AFTER_HOURS))
                self._note(
                    f"fault: {book.job_id} to be cancelled by its user at {book.cancel_at.isoformat()}"
                )

    def _cancel(self, now: datetime) -> None:
        """The user's `jobs cancel`, once; again later only when SpotGuard did not take it (the job neither
        says it was cancelled nor has ended): an error answer after the cancel was written (a StopTask
        that failed) is left to SpotGuard, as a user who reads the job's status would leave it."""
        from spotguard_cli.emulator.lambdas import InvocationFailed

        for book in self.books.values():
            if book.cancel_at is None or book.cancelled_at is not None or book.cancel_at > now:
                continue
            try:
                answer = self.world.invoke(
                    {"action": "cancel", "job_id": book.job_id, "reason": CANCEL_REASON}
                )
            except InvocationFailed as exc:
                answer = {"ok": False, "error": {"type": "InvocationFailed", "message": str(exc)}}
            with self._own():
                job = self.world.invoke({"action": "status", "job_id": book.job_id})["job"]
            if answer.get("ok") or job["finished"] or job["last_reason"] == CANCEL_REASON:
                book.cancelled_at = now
                said = "ok" if answer.get("ok") else answer["error"]["message"].splitlines()[0][:120]
                self._note(f"{book.job_id} cancelled by its user ({said}); the job is {job['state']}")
            else:
                book.cancel_at = now + timedelta(seconds=SUBMIT_RETRY_SECONDS)
                self._note(f"{book.job_id} cancel failed ({answer['error']['message'][:120]}): again later")

    # ----------------------------------------------------------------------------------- the tasks
    def _discover(self, now: datetime) -> None:
        """The tasks RunTask placed since the last look: each starts its run now."""
        for arn, host in list(self.world.scheduler.placed.items()):
            if arn not in self.tasks:
                self._placed(arn, host, now)

    def _tasks(self, now: datetime) -> None:
        for task in list(self.tasks.values()):
            if task.exited_at is not None:
                continue
            if task.running_at is None and now >= task.placed_at + self.restart:
                task.running_at = task.placed_at + self.restart
                self._emit(task.arn, None)
                self._note(
                    f"{task.arn[-8:]} ({task.job_id}/{task.attempt}) running from step {task.resumed_step}"
                )
            if task.running_at is None:
                continue
            if task.stop_asked_at is not None:
                if now >= task.stop_asked_at + timedelta(seconds=task.stop_seconds):
                    self._commit(task, task.stop_asked_at + timedelta(seconds=task.stop_seconds))
                    self._exit(task, 75, None)
                continue
            for due in self._commits_due(task, now):
                self._commit(task, due)
            if task.step_at(now, self.total_steps) >= self.total_steps:
                self._commit(task, now)
                self._exit(task, 0, "Essential container in task exited")

    def _placed(self, arn: str, host: str, now: datetime) -> None:
        described = self.world.cluster.tasks([arn]).get(arn)
        if described is None:
            return
        env: dict[str, str] = {}
        for c in (described.get("overrides") or {}).get("containerOverrides") or []:
            env |= {e["name"]: e["value"] for e in c.get("environment") or []}
        job_id, attempt = env.get("SPOTGUARD_JOB_ID", ""), int(env.get("SPOTGUARD_ATTEMPT", "0"))
        book = self.books.get(job_id)
        if book is None:
            return
        resumed = book.steps.get(env.get("SPOTGUARD_RESUME_FROM", ""), 0)
        if resumed < book.newest_step:  # committed work this attempt does again
            book.steps_lost += book.newest_step - resumed
            self._note(f"{job_id}/{attempt} resumes from step {resumed}, newest committed {book.newest_step}")
        self.tasks[arn] = Task(arn, job_id, attempt, host, now, resumed)
        self._note(f"{arn[-8:]} placed: {job_id}/{attempt} on {host[-8:]}")

    def _commits_due(self, task: Task, now: datetime) -> list[datetime]:
        assert task.running_at is not None
        every = timedelta(minutes=COMMIT_MINUTES)
        due = []
        t = (task.last_commit_at or task.running_at) + every
        while t <= now:
            due.append(t)
            t += every
        if due:
            task.last_commit_at = due[-1]
        return due

    def _commit(self, task: Task, at: datetime) -> None:
        book = self.books[task.job_id]
        step = task.step_at(at, self.total_steps)
        if step <= book.newest_step and book.sequence > 0:
            return  # nothing new since the last commit
        book.sequence += 1
        job = {"job_id": book.job_id, "checkpoint_uri": book.checkpoint_uri}
        uri = self.world.commit_checkpoint(
            job, book.sequence, task.attempt, progress=step / self.total_steps, at=at, step=step
        )
        book.steps[uri] = step
        book.newest_step = max(book.newest_step, step)

    def _exit(self, task: Task, code: int | None, reason: str | None) -> None:
        """The task's container exits (`code`; None: its instance is gone): ECS stops it and says so."""
        from moto.ecs.models import ecs_backends

        stack = self.world.stack
        moto_task = ecs_backends[stack.account][stack.region].tasks["gpu-spot"][task.arn]
        if moto_task.desired_status != "STOPPED":
            moto_task.stopped_reason = reason or "Essential container in task exited"
        moto_task.desired_status = moto_task.last_status = "STOPPED"
        for c in moto_task.containers:
            c.exitCode = code
        self.world.scheduler.release(task.arn)
        task.exited_at, task.exit_code = self.clock.now(), code
        self._emit(task.arn, code)
        self._note(f"{task.arn[-8:]} ({task.job_id}/{task.attempt}) exited {code}")

    def _stop_asked(self, parsed: dict[str, Any], **_: Any) -> None:
        """SpotGuard's StopTask: ECS asks the container to stop; it runs on until it exits (moto would
        mark it stopped at once, with the exit code it defaults to)."""
        from moto.ecs.models import ecs_backends

        arn = str(((parsed or {}).get("task") or {}).get("taskArn") or "")
        task = self.tasks.get(arn)
        if task is None or task.exited_at is not None:
            return
        stack = self.world.stack
        moto_task = ecs_backends[stack.account][stack.region].tasks["gpu-spot"].get(arn)
        if moto_task is not None:
            moto_task.last_status = "RUNNING" if task.running_at is not None else "PENDING"
        self.world.scheduler.gpus[arn] = 1  # its GPU stays taken until it exits
        if task.stop_asked_at is None:
            task.stop_asked_at = self.clock.now()
            if task.running_at is None:  # stopped before it ran: it exits at once
                task.running_at = self.clock.now()
