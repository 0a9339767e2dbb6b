"""The bucket check's S3 adapter against moto in this process, and the check as the reconcile function's
runtime builds it from the stack's environment."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from spotguard.adapters import clients
from spotguard.adapters.bucket import S3BucketSettings
from spotguard.adapters.notify import TopicAlerts
from spotguard.ports import PUBLIC_ACCESS_SETTINGS
from spotguard.runtime.bucket_check import bucket_check
from spotguard.usecases.bucket_check import BucketCheck, missing


@pytest.fixture
def s3() -> Iterator[Any]:
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        # moto keeps a bucket's EventBridgeConfiguration but leaves it out of its answer to
        # GetBucketNotificationConfiguration; S3 answers with it (an empty element). Add what moto holds.
        client.meta.events.register("before-parameter-build.s3.GetBucketNotificationConfiguration", _bucket)
        client.meta.events.register("after-call.s3.GetBucketNotificationConfiguration", _eventbridge)
        yield client


def _bucket(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
    context["bucket"] = params["Bucket"]


def _eventbridge(parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
    from moto.s3.models import s3_backends

    bucket = s3_backends["123456789012"]["aws"].buckets.get(context["bucket"])
    conf = bucket.notification_configuration if bucket else None
    if conf is not None and conf.event_bridge is not None:
        parsed["EventBridgeConfiguration"] = {}


def _right_bucket(s3: Any, name: str) -> None:
    s3.create_bucket(Bucket=name)
    s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    s3.put_bucket_encryption(
        Bucket=name,
        ServerSideEncryptionConfiguration={
            "Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "aws:kms"}}]
        },
    )
    s3.put_public_access_block(
        Bucket=name, PublicAccessBlockConfiguration=dict.fromkeys(PUBLIC_ACCESS_SETTINGS, True)
    )
    s3.put_bucket_notification_configuration(
        Bucket=name, NotificationConfiguration={"EventBridgeConfiguration": {}}
    )


def test_a_bucket_set_up_as_the_stack_sets_up_its_own_has_no_findings(s3):
    _right_bucket(s3, "users-bucket")
    facts = S3BucketSettings(s3).facts("users-bucket")
    assert facts.versioning == "Enabled" and facts.encryption == "aws:kms" and facts.eventbridge
    assert missing(facts) == []


def test_a_bare_bucket_lacks_all_four(s3):
    s3.create_bucket(Bucket="users-bucket")
    facts = S3BucketSettings(s3).facts("users-bucket")
    assert facts.unreadable == {}  # "never set" is S3's answer, not a failure to read
    assert [f.split(" ")[0] for f in missing(facts)] == ["versioning", "no", "the", "Amazon"]


def test_what_cannot_be_read_is_said_with_the_error_code(s3):
    facts = S3BucketSettings(s3).facts("no-such-bucket")
    assert dict(facts.unreadable) == dict.fromkeys(
        ("versioning", "encryption", "public_access_block", "eventbridge"), "NoSuchBucket"
    )
    assert all("could not be read (NoSuchBucket)" in f for f in missing(facts))


def test_the_alert_reaches_the_stacks_topic_as_json(s3):
    sns, sqs = boto3.client("sns", region_name="us-east-1"), boto3.client("sqs", region_name="us-east-1")
    topic = sns.create_topic(Name="spotguard-notifications")["TopicArn"]
    url = sqs.create_queue(QueueName="mail")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn)
    s3.create_bucket(Bucket="users-bucket")
    s3.put_bucket_versioning(Bucket="users-bucket", VersioningConfiguration={"Status": "Suspended"})
    check = BucketCheck("users-bucket", S3BucketSettings(s3), TopicAlerts(sns, topic), clock=_fixed_clock)
    assert len(check.run() or []) == 4
    (msg,) = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    envelope = json.loads(msg["Body"])
    assert envelope["Subject"] == "SpotGuard: checkpoint bucket users-bucket lacks settings"
    detail = json.loads(envelope["Message"])
    assert detail["kind"] == "checkpoint-bucket-check" and detail["bucket"] == "users-bucket"
    assert detail["findings"][0].startswith("versioning is suspended")


def _fixed_clock() -> Any:
    from datetime import UTC, datetime

    return datetime(2026, 11, 23, tzinfo=UTC)


def test_the_runtime_checks_only_a_bucket_the_user_brought(s3):
    clients.reset()
    brought = {"SPOTGUARD_BUCKET_CHECK": "on", "SPOTGUARD_CHECKPOINT_BUCKET": "users-bucket"}
    assert bucket_check({**brought, "SPOTGUARD_BUCKET_CHECK": "off"}) is None  # the stack's own bucket
    assert bucket_check({}) is None
    check = bucket_check({**brought, "SPOTGUARD_TOPIC_ARN": ""})
    assert check is not None and check.bucket == "users-bucket"
    s3.create_bucket(Bucket="users-bucket")
    assert len(check.run() or []) == 4  # through the runtime's own clients, against moto
    clients.reset()


@pytest.mark.slow  # deploys the stack into moto
def test_the_reconcile_function_checks_a_brought_bucket_and_sweeps_anyway(aws, caplog):
    """The reconcile function as the stack deploys it, given a bucket of the user's: the first sweep
    checks it (warnings logged, one alert on the topic), the next ones within the hour do not, and the
    sweep's answer is the same as without the check."""
    from datetime import timedelta

    from spotguard_cli.emulator.world import make_jobs_world

    # CheckpointBucketName given: the template turns the check on (test_template checks that mapping)
    jobs = make_jobs_world({"SPOTGUARD_BUCKET_CHECK": "on", "SPOTGUARD_CHECKPOINT_BUCKET": "users-bucket"})
    s3 = jobs.stack.client("s3")
    s3.create_bucket(Bucket="users-bucket")
    s3.put_bucket_versioning(Bucket="users-bucket", VersioningConfiguration={"Status": "Enabled"})
    with caplog.at_level("WARNING"):
        first = jobs.reconcile()
    warned = [r.getMessage() for r in caplog.records if "checkpoint bucket users-bucket:" in r.getMessage()]
    assert len(warned) == 3 and not any("versioning" in w for w in warned)
    (alert,) = jobs.notifications()
    assert alert["kind"] == "checkpoint-bucket-check" and len(alert["findings"]) == 3
    caplog.clear()
    assert jobs.reconcile() == first  # within the hour: not checked again, the sweep unchanged
    assert not [r for r in caplog.records if "checkpoint bucket" in r.getMessage()]
    jobs.shift_clock(timedelta(hours=1, seconds=1).total_seconds())
    with caplog.at_level("WARNING"):
        jobs.reconcile()
    assert len([r for r in caplog.records if "checkpoint bucket users-bucket:" in r.getMessage()]) == 3
    assert jobs.notifications() == []  # the same findings: logged again, not re-sent
