"""Job notifications: the SNS topic (e-mail and whatever else subscribes) and EventBridge events with
source `spotguard` on the default bus, for users' own automation; and operational alerts on the same
topic (the one the alarms use), JSON as everything else on it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from spotguard.domain.jobs.replies import Notification

SOURCE = "spotguard"


DETAIL_TYPES = {
    "interrupted": "SpotGuard Job Interrupted",
    "resubmitted": "SpotGuard Job Resubmitted",
    "succeeded": "SpotGuard Job Succeeded",
    "failed": "SpotGuard Job Failed",
    "gave-up": "SpotGuard Job Gave Up",
    "cancelled": "SpotGuard Job Cancelled",
    "waiting": "SpotGuard Job Waiting For Capacity",
    "capacity-wanted": "SpotGuard Capacity Wanted",
    "decision": "SpotGuard Job Capacity Decision",
}
# Worth an e-mail: the rest go to EventBridge only.
EMAILED = {"interrupted", "resubmitted", "succeeded", "failed", "gave-up", "cancelled"}


class Notifier:
    def __init__(self, sns: Any, events: Any, topic_arn: str, bus: str = "default") -> None:
        self.sns, self.events, self.topic_arn, self.bus = sns, events, topic_arn, bus

    def send_all(self, notifications: list[Notification]) -> None:
        """One PutEvents call for up to 10 notifications; an SNS message for each that is worth one."""
        for i in range(0, len(notifications), 10):
            batch = notifications[i : i + 10]
            resp = self.events.put_events(Entries=[self._entry(n) for n in batch])
            if resp.get("FailedEntryCount"):
                failed = next(e for e in resp.get("Entries", []) if e.get("ErrorCode"))
                raise RuntimeError(f"EventBridge refused a notification: {failed.get('ErrorCode')}")
        for n in notifications:
            if n.kind in EMAILED:
                subject = f"SpotGuard: job {n.job_id} {n.kind}"
                publish(self.sns, self.topic_arn, subject, _detail(n), kind=n.kind, job_id=n.job_id)

    def _entry(self, n: Notification) -> dict[str, Any]:
        return {
            "Source": SOURCE,
            "DetailType": DETAIL_TYPES[n.kind],
            "Detail": json.dumps(_detail(n), default=str),
            "EventBusName": self.bus,
            "Resources": [],
        }


def _detail(n: Notification) -> dict[str, Any]:
    return {"notification-id": n.id, "job-id": n.job_id, "kind": n.kind, "message": n.message, **n.detail}


class TopicAlerts:
    """Operational alerts (a checkpoint bucket missing a setting) on the stack's topic."""

    def __init__(self, sns: Any, topic_arn: str) -> None:
        self.sns, self.topic_arn = sns, topic_arn

    def alert(self, subject: str, detail: Mapping[str, object]) -> None:
        publish(self.sns, self.topic_arn, subject, detail, kind=str(detail.get("kind", "alert")))


def publish(sns: Any, topic_arn: str, subject: str, detail: Mapping[str, object], **attributes: str) -> None:
    """One JSON message on the topic (nothing when the stack has none), with string attributes that
    subscriptions can filter on."""
    if not topic_arn:
        return
    sns.publish(
        TopicArn=topic_arn,
        Subject=subject[:100],
        Message=json.dumps(detail, indent=2, default=str),
        MessageAttributes={k: {"DataType": "String", "StringValue": v} for k, v in attributes.items()},
    )
