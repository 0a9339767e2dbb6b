"""Committed checkpoints as the manager side sees them. Pure.

The contract (docs/container-contract.md) is written by the agent in the container:
`<checkpoint uri>checkpoints/<sequence, zero-padded>/<files>` and MANIFEST.json last. This module reads
it: which S3 events are manifests, and what a valid manifest says. The manifest's schema is the agent's
own: `manifest` is the agent's spotguard_agent/manifest.py, linked into the layer (its docstring says
why), so writer and reader cannot drift apart.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, ValidationError

from spotguard.domain.envelope import Refused, envelope
from spotguard.domain.errors import one_line
from spotguard.domain.manifest import MANIFEST as MANIFEST  # re-exported: the name the S3 adapter reads
from spotguard.domain.manifest import Manifest as CheckpointManifest

_MANIFEST_KEY = re.compile(r"^(?P<prefix>(?:.+/)?)checkpoints/(?P<seq>\d{1,20})/MANIFEST\.json$")


class CheckpointRef(BaseModel):
    """One committed checkpoint: where it is and what its manifest said."""

    model_config = ConfigDict(frozen=True)
    prefix_uri: str  # the job's SPOTGUARD_CHECKPOINT_URI: s3://bucket/prefix/
    sequence: int
    manifest_uri: str
    step: int = 0
    counts: Literal["steps", "commits"] = "steps"  # what `step` counts (the manifest's `counts`)
    progress: float = 0.0
    attempt: int = 0
    job_id: str = ""
    created_at: datetime | None = None
    total_bytes: int = 0

    @property
    def step_label(self) -> str:
        """`step N`, or `wrapper commit N` when the step counts the wrapper's commits."""
        return f"{'wrapper commit' if self.counts == 'commits' else 'step'} {self.step}"


class CheckpointRecorded(NamedTuple):
    """What recording a checkpoint did. `new`: the first time it was recorded (a repeated event, or one
    whose first delivery got as far: False), so it is counted once. `newest`: it is now its prefix's
    newest (an older one, or the same again: False)."""

    new: bool
    newest: bool


class ManifestUnreadable(Exception):
    """A manifest an event names that cannot be read, and never will be by retrying: gone (deleted by
    the agent's retention since, or never there) or not SpotGuard's to read (another bucket, a name S3
    refuses, access denied). Throttling and server errors are not this: they are retried."""

    def __init__(self, reason: str, gone: bool) -> None:
        super().__init__(reason)
        self.gone = gone


class ManifestEvent(BaseModel):
    model_config = ConfigDict(frozen=True)
    outcome: Literal["act", "ignore", "reject"]
    reason: str
    event_id: str | None = None
    bucket: str | None = None
    key: str | None = None
    prefix_uri: str | None = None
    sequence: int | None = None


def manifest_location(bucket: str, key: str) -> tuple[str, int] | None:
    """(the job's checkpoint prefix URI, the sequence) when `key` is a checkpoint's manifest."""
    m = _MANIFEST_KEY.fullmatch(key)  # whole: `$` would let a trailing newline through
    if not m:
        return None
    return f"s3://{bucket}/{m['prefix']}", int(m["seq"])


def parse_manifest(body: bytes | str) -> CheckpointManifest:
    return CheckpointManifest.model_validate_json(body)


def classify_object_created(raw: str | bytes | dict[str, Any]) -> ManifestEvent:
    """An EventBridge 'Object Created' event from the checkpoint bucket: act on manifests only. The
    envelope is read as every classifier reads it (`envelope`), then the S3 detail."""
    from aws_lambda_powertools.utilities.parser.models import S3EventNotificationEventBridgeDetailModel

    event = envelope(raw)
    if isinstance(event, Refused):
        return ManifestEvent(outcome="reject", reason=event.reason, event_id=event.event_id)
    if event.source != "aws.s3" or event.detail_type != "Object Created":
        return ManifestEvent(
            outcome="ignore", reason=f"not an S3 Object Created event: {event.detail_type}", event_id=event.id
        )
    try:
        detail = S3EventNotificationEventBridgeDetailModel.model_validate(event.detail)
    except ValidationError as exc:
        return ManifestEvent(outcome="reject", reason=f"detail.{one_line(exc)}", event_id=event.id)
    bucket, key = detail.bucket.name, detail.object.key
    where = manifest_location(bucket, key)
    if where is None:
        return ManifestEvent(
            outcome="ignore", reason="not a checkpoint manifest", event_id=event.id, bucket=bucket, key=key
        )
    return ManifestEvent(
        outcome="act",
        reason="a checkpoint was committed",
        event_id=event.id,
        bucket=bucket,
        key=key,
        prefix_uri=where[0],
        sequence=where[1],
    )
