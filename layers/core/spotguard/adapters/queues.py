"""SQS: SpotGuard's own delayed follow-ups, and rejected records sent straight to a dead-letter queue."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from spotguard.domain import clock
from spotguard.domain.interruption.notices import LifecycleRef
from spotguard.domain.own_events import LIFECYCLE_CHECK, launch_due_message, own_event

MAX_DELAY_SECONDS = 900  # SQS's limit for DelaySeconds


class FollowUpQueue:
    def __init__(self, client: Any, queue_url: str) -> None:
        self.client = client
        self.queue_url = queue_url

    def lifecycle_check(
        self, instance_id: str, ref: LifecycleRef, deadline: datetime, notice_key: str, delay_seconds: int
    ) -> None:
        """A Lifecycle Check, delayed: is the held instance's task stopped yet?"""
        detail = {
            "instance-id": instance_id,
            "lifecycle": ref.model_dump(),
            "deadline": deadline.isoformat(),
            "notice-key": notice_key,
        }
        body = own_event(LIFECYCLE_CHECK, detail, clock.now())
        self.client.send_message(
            QueueUrl=self.queue_url,
            MessageBody=body,
            DelaySeconds=max(0, min(delay_seconds, MAX_DELAY_SECONDS)),
        )


class DeadLetters:
    """Rejected records go straight here: bad input never gets better by retrying, and the queue's
    alarm makes somebody look. The reason travels as a message attribute."""

    def __init__(self, client: Any, queue_url: str) -> None:
        self.client = client
        self.queue_url = queue_url

    def send(self, body: str, reason: str, source_message_id: str) -> None:
        self.client.send_message(
            QueueUrl=self.queue_url,
            MessageBody=body if body else "(empty)",
            MessageAttributes={
                "spotguard-reject-reason": {"DataType": "String", "StringValue": reason[:1000] or "-"},
                "spotguard-source-message-id": {
                    "DataType": "String",
                    "StringValue": source_message_id or "-",
                },
            },
        )


class RetryQueue:
    """Jobs waiting for capacity: a Launch Due message, delayed, per RunTask try."""

    def __init__(self, client: Any, queue_url: str) -> None:
        self.client = client
        self.queue_url = queue_url

    def schedule(self, job_id: str, launch_try: int, delay_seconds: int) -> None:
        self.client.send_message(
            QueueUrl=self.queue_url,
            MessageBody=launch_due_message(job_id, launch_try, clock.now()),
            DelaySeconds=max(0, min(delay_seconds, MAX_DELAY_SECONDS)),
        )
