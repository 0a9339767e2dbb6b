"""The checkpoint manifests' contract (adapters/s3.py S3Checkpoints: read, committed), the same cases
against its fake (tests/fakes.py FakeManifests) and against the adapter on moto's S3: a manifest is read
as it was written; one not there is gone, and one in a bucket not there, or named as S3 refuses a name, is
not SpotGuard's to read, neither to be retried; the committed checkpoints under a job's prefix are its own
manifests, newest first, nothing else in the bucket; listing a bucket not there is an error, never "no
checkpoint".

Only the buckets a case writes are made, a new moto for each case. Not covered here: throttling and
server errors (raised as they are, to be retried), which moto cannot be made to give, and a listing over
1000 keys (the adapter pages with botocore's paginator)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError

from spotguard.adapters.s3 import S3Checkpoints
from spotguard.domain.checkpoints import ManifestUnreadable
from tests.contract.moto_aws import one_side
from tests.fakes import FakeManifests

BUCKET = "ckpt-bucket"
PREFIX = "s3://ckpt-bucket/jobs/j1/"


class FakeSide:
    name = "fake"

    def __init__(self) -> None:
        self.manifests = FakeManifests()

    def put(self, bucket: str, key: str, body: bytes = b"{}") -> None:
        self.manifests.buckets.setdefault(bucket, {})[key] = body


class MotoSide:
    name = "s3"

    def __init__(self, s3: Any) -> None:
        self.s3 = s3
        self.manifests = S3Checkpoints(self.s3)
        self.buckets: set[str] = set()

    def put(self, bucket: str, key: str, body: bytes = b"{}") -> None:
        if bucket not in self.buckets:
            self.s3.create_bucket(Bucket=bucket)
            self.buckets.add(bucket)
        self.s3.put_object(Bucket=bucket, Key=key, Body=body)


Side = FakeSide | MotoSide


@pytest.fixture(params=["fake", "s3"])
def side(request: pytest.FixtureRequest) -> Iterator[Side]:
    yield from one_side(request, ("s3",), FakeSide, lambda aws: MotoSide(aws["s3"]))


def unreadable(side: Side, bucket: str, key: str) -> ManifestUnreadable:
    with pytest.raises(ManifestUnreadable) as raised:
        side.manifests.read(bucket, key)
    assert str(raised.value).startswith(f"s3://{bucket}/{key}: ")
    return raised.value


# --------------------------------------------------------------------------------------------- read
def test_a_manifest_is_read_as_it_was_written(side: Side):
    body = b'{"sequence": 3, "step": 1200, "files": []}\n\xff'
    side.put(BUCKET, "jobs/j1/checkpoints/3/MANIFEST.json", body)
    assert side.manifests.read(BUCKET, "jobs/j1/checkpoints/3/MANIFEST.json") == body


def test_a_manifest_not_there_is_gone(side: Side):
    side.put(BUCKET, "jobs/j1/checkpoints/3/MANIFEST.json")
    assert unreadable(side, BUCKET, "jobs/j1/checkpoints/4/MANIFEST.json").gone


def test_a_manifest_whose_bucket_is_not_there_or_not_a_name_is_not_ours_to_read(side: Side):
    side.put(BUCKET, "jobs/j1/checkpoints/3/MANIFEST.json")
    assert not unreadable(side, "no-such-bucket", "jobs/j1/checkpoints/3/MANIFEST.json").gone
    assert not unreadable(side, "not a bucket", "jobs/j1/checkpoints/3/MANIFEST.json").gone


# ---------------------------------------------------------------------------------------- committed
def test_the_committed_checkpoints_are_the_prefixs_own_manifests_newest_first(side: Side):
    ours = {
        1: "jobs/j1/checkpoints/1/MANIFEST.json",
        2: "jobs/j1/checkpoints/2/MANIFEST.json",
        7: "jobs/j1/checkpoints/00000007/MANIFEST.json",
        10: "jobs/j1/checkpoints/10/MANIFEST.json",
    }
    not_ours = [
        "jobs/j1/checkpoints/2/model.pt",  # a checkpoint's file
        "jobs/j1/checkpoints/11/MANIFEST.json.tmp",  # not committed
        "jobs/j1/checkpoints/12/shard/MANIFEST.json",
        "jobs/j1/checkpoints/5/checkpoints/6/MANIFEST.json",  # under another prefix, jobs/j1/checkpoints/5/
        "jobs/j10/checkpoints/20/MANIFEST.json",  # another job
        "jobs/j1/MANIFEST.json",
    ]
    for key in [*ours.values(), *not_ours]:
        side.put(BUCKET, key)
    side.put("other-bucket", "jobs/j1/checkpoints/30/MANIFEST.json")
    assert side.manifests.committed(PREFIX) == [(10, ours[10]), (7, ours[7]), (2, ours[2]), (1, ours[1])]


def test_a_prefix_with_no_checkpoint_has_none(side: Side):
    side.put(BUCKET, "jobs/j1/checkpoints/1/MANIFEST.json")
    assert side.manifests.committed("s3://ckpt-bucket/jobs/j2/") == []


def test_listing_a_bucket_not_there_is_an_error_not_no_checkpoint(side: Side):
    side.put(BUCKET, "jobs/j1/checkpoints/1/MANIFEST.json")
    with pytest.raises(ClientError) as raised:
        side.manifests.committed("s3://no-such-bucket/jobs/j1/")
    assert raised.value.response["Error"]["Code"] == "NoSuchBucket"
