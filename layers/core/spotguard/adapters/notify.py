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

    def send(self, n: Notification) -> None:
        detail = {
            "notification-id": n.id,
            "job-id": n.job_id,
            "kind": n.kind,
            "message": n.message,
            **n.detail,
        }
        resp = self.events.put_events(
            Entries=[
                {
                    "Source": SOURCE,
                    "DetailType": DETAIL_TYPES[n.kind],
                    "Detail": json.dumps(detail, default=str),
                    "EventBusName": self.bus,
                    "Resources": [],
                }
            ]
        )
        if resp.get("FailedEntryCount"):
            entry = (resp.get("Entries") or [{}])[0]
            raise RuntimeError(f"EventBridge refused the notification: {entry.get('ErrorCode')}")
        if n.kind in EMAILED and self.topic_arn:
            self.sns.publish(
                TopicArn=self.topic_arn,
                Subject=f"SpotGuard: job {n.job_id} {n.kind}"[:100],
                Message=json.dumps(detail, indent=2, default=str),
                MessageAttributes={
                    "kind": {"DataType": "String", "StringValue": n.kind},
                    "job_id": {"DataType": "String", "StringValue": n.job_id},
                },
            )
