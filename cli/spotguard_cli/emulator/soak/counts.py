"""`SoakCounts`: what a soak counts at its end (`Result`): jobs lost, stuck or still at work, attempts of
one job alive at once, committed steps lost, dead letters, cancels not done, the faults played, and the
digest of its timeline."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta

from spotguard_cli.emulator.soak.faults import CALL_FAULTS, SoakFaults
from spotguard_cli.emulator.soak.model import (
    CANCEL_BOUND_SECONDS,
    RECONCILE_SECONDS,
    START,
    Result,
    alive_at_once,
)


class SoakCounts(SoakFaults):
    """The result, read from SpotGuard (each job's status) and from the model."""

    # ---------------------------------------------------------------------------------- the result
    def result(self) -> Result:
        lost, stuck, succeeded, unfinished = [], [], 0, 0
        cancelled, undone = 0, []
        now = self.clock.now()
        for job_id, book in self.books.items():
            with self._own():
                answer = self.world.invoke({"action": "status", "job_id": job_id})
            if not answer.get("ok"):
                lost.append(f"{job_id}: {answer.get('error', {}).get('message', 'no answer')}")
                continue
            job = answer["job"]
            if job["state"] == "succeeded":
                succeeded += 1
                continue
            if book.cancelled_at is not None:  # its user cancelled it: it must end so, and soon
                if job["state"] == "cancelled":
                    cancelled += 1
                elif (now - book.cancelled_at).total_seconds() > CANCEL_BOUND_SECONDS:
                    undone.append(f"{job_id}: {job['state']} since its cancel: {job['last_reason']}")
                else:
                    unfinished += 1
                continue
            live = any(t.exited_at is None for t in self.tasks.values() if t.job_id == job_id)
            waiting = job["state"] in ("queued", "launching") and (
                job["retry_at"] is None
                or datetime.fromisoformat(job["retry_at"]) > now - timedelta(seconds=2 * RECONCILE_SECONDS)
            )
            if job["finished"]:
                lost.append(f"{job_id}: {job['state']}: {job['last_reason']}")
            elif not live and not waiting and job["state"] != "running":
                stuck.append(f"{job_id}: {job['state']}: {job['last_reason']}")
            elif not live and job["state"] == "running":
                stuck.append(f"{job_id}: running with no task: {job['last_reason']}")
            else:
                unfinished += 1
        twice = self._twice_at_once()
        dead_count, dead = self._dead_letter_lines()
        self._heard()
        text = "\n".join(self.log)
        return Result(
            jobs=len(self.books),
            succeeded=succeeded,
            unfinished=unfinished,
            lost=lost,
            twice_at_once=twice,
            steps_lost=sum(b.steps_lost for b in self.books.values()),
            dead_letters=dead_count,
            dead_letter_lines=dead,
            stuck=stuck,
            cancelled=cancelled,
            cancels_undone=undone,
            interruptions=self.interruptions,
            tasks=len(self.tasks),
            virtual_hours=round((now - START).total_seconds() / 3600, 2),
            digest=hashlib.sha256(text.encode()).hexdigest()[:16],
            timeline=list(self.log),
            faults=self._faults_played(),
            stopped_early=self.stopped_early,
        )

    def _faults_played(self) -> dict[str, int]:
        played = dict(self.faults_done)
        if self.injector is not None:
            played |= {k: self.injector.fired[k] for k in CALL_FAULTS}
        return played

    def _twice_at_once(self) -> list[str]:
        return alive_at_once(list(self.tasks.values()), self.clock.now())

    def _dead_letters(self) -> int:
        return self._dead_letter_lines()[0]

    def _dead_letter_lines(self) -> tuple[int, list[str]]:
        """Every message in a dead-letter queue: the queue, and SpotGuard's reason when it rejected the
        message, or the body when SQS moved it after maxReceiveCount failed receives."""
        sqs = self.world.stack.client("sqs")
        count, lines = 0, []
        for url in sqs.list_queues().get("QueueUrls", []):
            if "DeadLetter" in url or "DLQ" in url or "Dlq" in url:
                messages = sqs.receive_message(
                    QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"], VisibilityTimeout=0
                ).get("Messages", [])
                for m in messages:
                    reason = (m.get("MessageAttributes") or {}).get("spotguard-reject-reason") or {}
                    why = reason.get("StringValue") or f"after maxReceiveCount: {m['Body'][:300]}"
                    lines.append(f"{url.rsplit('/', 1)[-1]}: {why}")
                attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
                held = max(len(messages), int(attrs["Attributes"]["ApproximateNumberOfMessages"]))
                count += held
                lines += (
                    [f"{url.rsplit('/', 1)[-1]}: {held - len(messages)} more"] if held > len(messages) else []
                )
        return count, lines
