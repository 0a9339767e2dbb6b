"""EBS mode's Volumes port (adapters/ebs.py EbsAdapter), the same cases against its fake (tests/fakes.py
FakeVolumes) and against the adapter on moto's EC2: an attempt's volume found by SpotGuard's tags, one
snapshot per attempt however often it is asked, a snapshot's state and owner (None when it is gone or not
SpotGuard's), a volume in use kept until it is let go, and deletes that are safe to repeat.

Each side's `world` makes what EC2 holds: on moto, volumes tagged as ECS tags an attempt's managed
volume (an attached one attached to an instance); on the fake, its state.

What moto cannot do: a snapshot that is still pending or has failed (moto's snapshots are completed at
once), so neither "pending" nor the new snapshot the adapter takes when the attempt's one is in "error" is
held here (the fake does both: FakeVolumes(snapshot_state=...))."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from botocore.exceptions import ClientError

from spotguard.adapters.ebs import EbsAdapter
from spotguard.domain.jobs.submission import ATTEMPT_TAG
from spotguard.domain.tasks import JOB_TAG
from tests.contract.moto_aws import Clients, one_side
from tests.fakes import FakeVolumes

ZONE = "us-east-1a"
NO_VOLUME, NO_SNAPSHOT = "vol-0123456789abcdef0", "snap-0123456789abcdef0"


class MotoWorld:
    def __init__(self, ec2: Any) -> None:
        self.ec2 = ec2
        self.attached_to: dict[str, str] = {}  # volume -> instance

    def volume(self, job_id: str | None, attempt: int = 0, attached: bool = False) -> str:
        """A volume of (job, attempt), as ECS makes and tags one at a launch; job None: not SpotGuard's."""
        tags = [{"Key": JOB_TAG, "Value": job_id}, {"Key": ATTEMPT_TAG, "Value": str(attempt)}]
        specs = [{"ResourceType": "volume", "Tags": tags}] if job_id else []
        volume = self.ec2.create_volume(AvailabilityZone=ZONE, Size=100, TagSpecifications=specs)["VolumeId"]
        if attached:
            instance = self.ec2.run_instances(
                ImageId="ami-0a1b2c3d4e5f60718", MinCount=1, MaxCount=1, Placement={"AvailabilityZone": ZONE}
            )["Instances"][0]["InstanceId"]
            self.ec2.attach_volume(VolumeId=volume, InstanceId=instance, Device="/dev/xvdf")
            self.attached_to[volume] = instance
        return str(volume)

    def let_go(self, volume: str) -> None:
        """The task stopped: ECS detaches its volume."""
        self.ec2.detach_volume(VolumeId=volume, InstanceId=self.attached_to.pop(volume))

    def foreign_snapshot(self) -> str:
        """A snapshot someone else took, of a volume without SpotGuard's tags."""
        return str(self.ec2.create_snapshot(VolumeId=self.volume(None))["SnapshotId"])

    def snapshot_count(self) -> int:
        return len(self.ec2.describe_snapshots(OwnerIds=["self"])["Snapshots"])


class FakeWorld:
    def __init__(self, fake: FakeVolumes) -> None:
        self.fake = fake
        self.ids = itertools.count(1)

    def volume(self, job_id: str | None, attempt: int = 0, attached: bool = False) -> str:
        return self.fake.add_volume(job_id, attempt, attached=attached)

    def let_go(self, volume: str) -> None:
        self.fake.attached.discard(volume)

    def foreign_snapshot(self) -> str:
        snapshot = f"snap-f{next(self.ids):016x}"
        self.fake.taken[snapshot] = (None, self.fake.state)
        return snapshot

    def snapshot_count(self) -> int:
        return len(self.fake.taken)


@dataclass
class Side:
    name: str
    volumes: Any  # EbsAdapter | FakeVolumes
    world: Any  # MotoWorld | FakeWorld


def fake_side() -> Side:
    fake = FakeVolumes()
    return Side("fake", fake, FakeWorld(fake))


def moto_side(aws: Clients) -> Side:
    return Side("moto", EbsAdapter(aws["ec2"]), MotoWorld(aws["ec2"]))


@pytest.fixture(params=["fake", "moto"])
def side(request: pytest.FixtureRequest) -> Iterator[Side]:
    yield from one_side(request, ("ec2",), fake_side, moto_side)


# ----------------------------------------------------------------------------------------- volumes
def test_an_attempts_volume_is_found_by_its_job_and_attempt(side: Side):
    first, second, other = side.world.volume("j1", 1), side.world.volume("j1", 2), side.world.volume("j2", 1)
    side.world.volume(None)  # not SpotGuard's
    assert side.volumes.find("j1", 1) == first
    assert side.volumes.find("j1", 2) == second
    assert side.volumes.find("j2", 1) == other
    assert side.volumes.find("j1", 3) is None and side.volumes.find("j3", 1) is None


def test_a_volume_in_use_is_kept_until_its_task_lets_it_go(side: Side):
    volume = side.world.volume("j1", 1, attached=True)
    assert side.volumes.delete_volume(volume) is False  # tried again later
    assert side.volumes.find("j1", 1) == volume
    side.world.let_go(volume)
    assert side.volumes.delete_volume(volume) is True
    assert side.volumes.find("j1", 1) is None
    assert side.volumes.delete_volume(volume) is True  # gone already: what was asked


# --------------------------------------------------------------------------------------- snapshots
def test_an_attempt_is_snapshotted_once_however_often_it_is_asked(side: Side):
    first, second = side.world.volume("j1", 1), side.world.volume("j1", 2)
    snapshot = side.volumes.snapshot(first, "j1", 1)
    assert side.volumes.snapshot(first, "j1", 1) == snapshot  # a repeated effect finds the first
    assert side.world.snapshot_count() == 1
    assert side.volumes.snapshot_state(snapshot) in ("pending", "completed")
    assert side.volumes.snapshot_owner(snapshot) == ("j1", 1)
    other = side.volumes.snapshot(second, "j1", 2)
    assert other != snapshot and side.volumes.snapshot_owner(other) == ("j1", 2)
    assert side.world.snapshot_count() == 2


def test_a_snapshot_not_spotguards_has_no_owner(side: Side):
    foreign = side.world.foreign_snapshot()
    ours = side.volumes.snapshot(side.world.volume("j1", 1), "j1", 1)
    assert side.volumes.snapshot_owner(foreign) is None
    assert side.volumes.snapshot_state(foreign) in ("pending", "completed")
    assert side.volumes.snapshot_owner(ours) == ("j1", 1)


def test_a_snapshot_that_does_not_exist_has_no_state_and_no_owner(side: Side):
    ours = side.volumes.snapshot(side.world.volume("j1", 1), "j1", 1)
    assert side.volumes.snapshot_state(NO_SNAPSHOT) is None
    assert side.volumes.snapshot_owner(NO_SNAPSHOT) is None
    assert side.volumes.snapshot_state(ours) in ("pending", "completed")


def test_a_deleted_snapshot_is_gone_and_the_attempt_may_be_snapshotted_again(side: Side):
    volume = side.world.volume("j1", 1)
    snapshot = side.volumes.snapshot(volume, "j1", 1)
    side.volumes.delete_snapshot(snapshot)
    assert side.volumes.snapshot_state(snapshot) is None and side.volumes.snapshot_owner(snapshot) is None
    side.volumes.delete_snapshot(snapshot)  # gone already: no error
    side.volumes.delete_snapshot(NO_SNAPSHOT)
    again = side.volumes.snapshot(volume, "j1", 1)
    assert again != snapshot and side.volumes.snapshot_owner(again) == ("j1", 1)


def test_a_snapshot_of_a_volume_that_is_gone_is_an_error(side: Side):
    side.world.volume("j1", 1)
    with pytest.raises(ClientError) as err:
        side.volumes.snapshot(NO_VOLUME, "j1", 1)
    assert err.value.response["Error"]["Code"] == "InvalidVolume.NotFound"
    assert side.world.snapshot_count() == 0
