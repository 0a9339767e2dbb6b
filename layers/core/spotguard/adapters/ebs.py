"""EC2 EBS, for EBS mode: find an attempt's volume, snapshot it once, follow the snapshot, clean up.

Volumes and snapshots are found by SpotGuard's tags (job id, attempt), so every call here is safe to
repeat: a second snapshot of the same attempt finds the first one instead of taking another.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from spotguard.domain.jobs.submission import ATTEMPT_TAG
from spotguard.domain.tasks import JOB_TAG

_GONE = {"InvalidVolume.NotFound", "InvalidSnapshot.NotFound"}


def _tags(job_id: str, attempt: int) -> list[dict[str, Any]]:
    return [
        {"Name": f"tag:{JOB_TAG}", "Values": [job_id]},
        {"Name": f"tag:{ATTEMPT_TAG}", "Values": [str(attempt)]},
    ]


class EbsAdapter:
    def __init__(self, ec2: Any) -> None:
        self.ec2 = ec2

    def find(self, job_id: str, attempt: int) -> str | None:
        volumes = self.ec2.describe_volumes(Filters=_tags(job_id, attempt)).get("Volumes") or []
        return str(volumes[0]["VolumeId"]) if volumes else None

    def snapshot(self, volume_id: str, job_id: str, attempt: int) -> str:
        found = self.ec2.describe_snapshots(OwnerIds=["self"], Filters=_tags(job_id, attempt)).get(
            "Snapshots"
        )
        live = [s for s in found or [] if s.get("State") != "error"]
        if live:
            return str(live[0]["SnapshotId"])
        snap = self.ec2.create_snapshot(
            VolumeId=volume_id,
            Description=f"SpotGuard checkpoint of job {job_id} attempt {attempt}",
            TagSpecifications=[
                {
                    "ResourceType": "snapshot",
                    "Tags": [{"Key": JOB_TAG, "Value": job_id}, {"Key": ATTEMPT_TAG, "Value": str(attempt)}],
                }
            ],
        )
        return str(snap["SnapshotId"])

    def _described(self, snapshot_id: str) -> dict[str, Any] | None:
        try:
            found = self.ec2.describe_snapshots(SnapshotIds=[snapshot_id]).get("Snapshots") or []
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _GONE:
                return None
            raise
        return dict(found[0]) if found else None

    def snapshot_state(self, snapshot_id: str) -> str | None:
        """pending | completed | error; None when it does not exist."""
        snap = self._described(snapshot_id)
        return str(snap["State"]) if snap else None

    def snapshot_owner(self, snapshot_id: str) -> tuple[str, int] | None:
        """(job id, attempt) from SpotGuard's tags on the snapshot; None for a snapshot not SpotGuard's."""
        snap = self._described(snapshot_id) or {}
        tags = {t["Key"]: t["Value"] for t in snap.get("Tags") or []}
        if JOB_TAG not in tags or not tags.get(ATTEMPT_TAG, "").isdigit():
            return None
        return tags[JOB_TAG], int(tags[ATTEMPT_TAG])

    def delete_volume(self, volume_id: str) -> bool:
        """True when the volume is gone; False while it is still attached (tried again later)."""
        try:
            self.ec2.delete_volume(VolumeId=volume_id)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code in _GONE:
                return True
            if code == "VolumeInUse":
                return False
            raise
        return True

    def delete_snapshot(self, snapshot_id: str) -> None:
        try:
            self.ec2.delete_snapshot(SnapshotId=snapshot_id)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in _GONE:
                raise
