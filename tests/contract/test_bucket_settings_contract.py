"""The bucket settings' contract (adapters/bucket.py S3BucketSettings: facts), the same cases against its
fake (tests/fakes.py FakeBucketSettings) and against the adapter on moto's S3: a bucket's versioning,
default encryption and public access block are reported as they are set, a setting never set as None
(S3's "not found" answer for it is no failure), and a bucket that is not there has every setting
unreadable, with S3's error code.

moto keeps a bucket's EventBridge notifications but leaves them out of its answer to
GetBucketNotificationConfiguration (moto 5.2), so on moto the adapter reads them as off: the case of
EventBridge on is skipped there, and `test_moto_still_leaves_eventbridge_out` fails once a moto answers
with them, for the case to run on both sides. (tests/integration/test_bucket_check.py adds what moto holds
to its answer, to check the adapter reads it.) Not covered here: a setting that cannot be read for want
of permission (moto does not enforce IAM here). Only the buckets a case makes, a new moto for each case."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import boto3
import pytest
from moto import mock_aws

from spotguard.adapters.bucket import S3BucketSettings
from spotguard.adapters.clients import URGENT
from spotguard.ports import PUBLIC_ACCESS_SETTINGS, BucketFacts
from tests.contract.moto_aws import one_side
from tests.fakes import BUCKET_SETTINGS, FakeBucketSettings

REGION = "us-east-1"
# One session for the clients of the check on moto: the service models are loaded once.
SESSION = boto3.session.Session()
ALL_ON = dict.fromkeys(PUBLIC_ACCESS_SETTINGS, True)


class FakeSide:
    name = "fake"
    eventbridge_readable = True

    def __init__(self) -> None:
        self.settings = FakeBucketSettings()

    def bucket(
        self,
        name: str,
        versioning: str | None = None,
        encryption: str | None = None,
        block: Mapping[str, bool] | None = None,
        eventbridge: bool = False,
    ) -> None:
        """A bucket with these settings set (None, False: never set)."""
        self.settings.buckets[name] = BucketFacts(versioning, encryption, block, eventbridge)


class MotoSide:
    name = "s3"

    def __init__(self, s3: Any) -> None:
        self.s3 = s3
        self.settings = S3BucketSettings(self.s3)
        self.eventbridge_readable = moto_answers_eventbridge(self.s3)

    def bucket(
        self,
        name: str,
        versioning: str | None = None,
        encryption: str | None = None,
        block: Mapping[str, bool] | None = None,
        eventbridge: bool = False,
    ) -> None:
        self.s3.create_bucket(Bucket=name)
        if versioning is not None:
            self.s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": versioning})
        if encryption is not None:
            rule = {"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": encryption}}
            self.s3.put_bucket_encryption(Bucket=name, ServerSideEncryptionConfiguration={"Rules": [rule]})
        if block is not None:
            self.s3.put_public_access_block(Bucket=name, PublicAccessBlockConfiguration=dict(block))
        if eventbridge:
            self.s3.put_bucket_notification_configuration(
                Bucket=name, NotificationConfiguration={"EventBridgeConfiguration": {}}
            )


def moto_answers_eventbridge(s3: Any) -> bool:
    """Whether GetBucketNotificationConfiguration answers with the EventBridge notifications put."""
    s3.create_bucket(Bucket="eventbridge-probe")
    s3.put_bucket_notification_configuration(
        Bucket="eventbridge-probe", NotificationConfiguration={"EventBridgeConfiguration": {}}
    )
    answer = s3.get_bucket_notification_configuration(Bucket="eventbridge-probe")
    s3.delete_bucket(Bucket="eventbridge-probe")
    return "EventBridgeConfiguration" in answer


Side = FakeSide | MotoSide


@pytest.fixture(params=["fake", "s3"])
def side(request: pytest.FixtureRequest) -> Iterator[Side]:
    yield from one_side(request, ("s3",), FakeSide, lambda aws: MotoSide(aws["s3"]))


def test_moto_still_leaves_eventbridge_out():
    """When this fails, moto answers with a bucket's EventBridge notifications: the case of EventBridge
    on runs on both sides by itself, and this test and the docstring's note can go."""
    with mock_aws():
        assert not moto_answers_eventbridge(SESSION.client("s3", region_name=REGION, config=URGENT))


def test_each_setting_is_reported_as_it_is_set(side: Side):
    side.bucket("users-bucket", versioning="Enabled", encryption="aws:kms", block=ALL_ON)
    assert side.settings.facts("users-bucket") == BucketFacts("Enabled", "aws:kms", ALL_ON, False)


def test_settings_set_otherwise_are_reported_as_they_are(side: Side):
    half = {**ALL_ON, "BlockPublicPolicy": False, "RestrictPublicBuckets": False}
    side.bucket("users-bucket", versioning="Suspended", encryption="AES256", block=half)
    assert side.settings.facts("users-bucket") == BucketFacts("Suspended", "AES256", half, False)


def test_a_bucket_with_nothing_set_has_every_setting_none_and_none_unreadable(side: Side):
    side.bucket("users-bucket")
    side.bucket("other-bucket", versioning="Enabled", encryption="AES256", block=ALL_ON)
    facts = side.settings.facts("users-bucket")
    assert facts == BucketFacts(None, None, None, False) and facts.unreadable == {}


def test_a_bucket_not_there_has_every_setting_unreadable_with_s3s_code(side: Side):
    side.bucket("users-bucket", versioning="Enabled", encryption="AES256", block=ALL_ON)
    facts = side.settings.facts("no-such-bucket")
    assert (facts.versioning, facts.encryption, facts.public_access_block, facts.eventbridge) == (
        None,
        None,
        None,
        False,
    )
    assert dict(facts.unreadable) == dict.fromkeys(BUCKET_SETTINGS, "NoSuchBucket")


def test_eventbridge_notifications_on_are_reported(side: Side):
    if not side.eventbridge_readable:
        pytest.skip("moto leaves a bucket's EventBridge notifications out of its answer")
    side.bucket("users-bucket", versioning="Enabled", eventbridge=True)
    assert side.settings.facts("users-bucket") == BucketFacts("Enabled", None, None, True)
