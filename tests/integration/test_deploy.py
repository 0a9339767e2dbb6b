"""What moto's CloudFormation skips, the local deploy creates directly: the queue policies (moto stores
them without enforcing them) and the dead-letter alarms; not the TLS-only bucket policy, which moto's S3
would enforce on its plain-HTTP endpoint."""

from __future__ import annotations

import json

import pytest

from spotguard_cli.emulator.stack import deploy

pytestmark = pytest.mark.slow  # deploys the stack into moto


def test_the_resources_moto_skips_are_created_directly(aws):
    st = deploy(None, {"ClusterNames": "gpu-spot"})
    assert {"InterruptionsQueuePolicy", "TaskEventsQueuePolicy", "TaskEventsDeadLetterAlarm"} <= set(
        st.created_directly
    )
    assert "CheckpointBucketPolicy" not in st.created_directly
    alarms = {a["AlarmName"]: a for a in st.client("cloudwatch").describe_alarms()["MetricAlarms"]}
    alarm = alarms["spotguard-TaskEventsDeadLetterAlarm"]
    assert alarm["AlarmActions"] == [st.outputs["NotificationsTopicArn"]]
    dlq_name = st.outputs["TaskEventsDeadLetterQueueUrl"].rsplit("/", 1)[-1]
    assert alarm["Dimensions"] == [{"Name": "QueueName", "Value": dlq_name}]
    sqs = st.client("sqs")
    policy = json.loads(
        sqs.get_queue_attributes(QueueUrl=st.outputs["TaskEventsQueueUrl"], AttributeNames=["Policy"])[
            "Attributes"
        ]["Policy"]
    )
    sources = policy["Statement"][0]["Condition"]["ArnEquals"]["aws:SourceArn"]
    assert all(s.startswith("arn:aws:events:us-east-1:123456789012:rule/spotguard-") for s in sources)
