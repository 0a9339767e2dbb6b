"""Job notifications: the SNS topic (e-mail and whatever else subscribes) and EventBridge events with
source `spotguard` on the default bus, for users' own automation."""

from __future__ import annotations

import json
from typing import Any

from spotguard.domain.facts import Notification

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
            if n.kind in EMAILED and self.topic_arn:
                self.sns.publish(
                    TopicArn=self.topic_arn,
                    Subject=f"SpotGuard: job {n.job_id} {n.kind}"[:100],
                    Message=json.dumps(_detail(n), indent=2, default=str),
                    MessageAttributes={
                        "kind": {"DataType": "String", "StringValue": n.kind},
                        "job_id": {"DataType": "String", "StringValue": n.job_id},
                    },
                )

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
