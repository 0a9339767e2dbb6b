"""Which checkpoint is a job's newest committed one: recorded from manifest events, found by listing
when the record is missing (an event lost, or a checkpoint from before SpotGuard watched the bucket)."""

from __future__ import annotations

from pydantic import ValidationError

from spotguard.domain.checkpoints import (
    CheckpointManifest,
    CheckpointRecorded,
    CheckpointRef,
    ManifestEvent,
    ManifestUnreadable,
    parse_manifest,
)
from spotguard.ports import CheckpointLedger, Manifests


class BadManifest(ValueError):
    """A manifest that is not valid, or not SpotGuard's to read: the checkpoint cannot be used (said in
    one line); the event is rejected."""


class ManifestGone(ValueError):
    """The manifest an event names is not there (the agent's retention deleted it since, or the event
    was replayed): nothing to record, the event is ignored."""


def _ref(prefix_uri: str, bucket: str, key: str, m: CheckpointManifest) -> CheckpointRef:
    return CheckpointRef(
        prefix_uri=prefix_uri,
        sequence=m.sequence,
        manifest_uri=f"s3://{bucket}/{key}",
        step=m.step,
        counts=m.counts,
        progress=m.progress,
        attempt=m.attempt,
        job_id=m.job_id,
        created_at=m.created_at,
        total_bytes=m.total_bytes,
    )


class CheckpointService:
    def __init__(self, manifests: Manifests, ledger: CheckpointLedger) -> None:
        self.manifests = manifests
        self.ledger = ledger

    def _load(self, prefix_uri: str, bucket: str, key: str, sequence: int) -> CheckpointRef:
        try:
            manifest = parse_manifest(self.manifests.read(bucket, key))
        except ManifestUnreadable as exc:
            raise (ManifestGone if exc.gone else BadManifest)(str(exc)) from None
        except ValidationError as exc:
            err = exc.errors()[0]
            raise BadManifest(
                f"{key}: {'.'.join(map(str, err['loc'])) or 'manifest'}: {err['msg']}"
            ) from None
        if manifest.sequence != sequence:
            raise BadManifest(f"{key}: the manifest says sequence {manifest.sequence}")
        return _ref(prefix_uri, bucket, key, manifest)

    def on_committed(self, event: ManifestEvent) -> tuple[CheckpointRef, CheckpointRecorded]:
        """Record the checkpoint, as the job's newest if it is newer than the one recorded. Returns it
        and what recording it did (an older or repeated event changes nothing; a repeated one is not
        new)."""
        assert event.prefix_uri and event.bucket and event.key and event.sequence is not None
        ref = self._load(event.prefix_uri, event.bucket, event.key, event.sequence)
        return ref, self.ledger.record_checkpoint(ref)

    def newest(self, prefix_uri: str) -> CheckpointRef | None:
        """The newest committed checkpoint: the ledger's record, else the newest valid one listed."""
        recorded = self.ledger.newest_checkpoint(prefix_uri)
        if recorded is not None:
            return recorded
        bucket = prefix_uri.removeprefix("s3://").split("/", 1)[0]
        for sequence, key in self.manifests.committed(prefix_uri):
            try:
                ref = self._load(prefix_uri, bucket, key, sequence)
            except (BadManifest, ManifestGone):
                continue
            self.ledger.record_checkpoint(ref, count=False)  # counted when its own event comes
            return ref
        return None
