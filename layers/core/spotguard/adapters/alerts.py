"""Operational alerts on the stack's SNS topic (the one its alarms use, e-mailed to NotificationEmail):
JSON, as everything else on the topic is."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


class TopicAlerts:
    def __init__(self, sns: Any, topic_arn: str) -> None:
        self.sns, self.topic_arn = sns, topic_arn

    def alert(self, subject: str, detail: Mapping[str, object]) -> None:
        if not self.topic_arn:
            return
        self.sns.publish(
            TopicArn=self.topic_arn,
            Subject=subject[:100],
            Message=json.dumps(detail, indent=2, default=str),
            MessageAttributes={
                "kind": {"DataType": "String", "StringValue": str(detail.get("kind", "alert"))}
            },
        )
