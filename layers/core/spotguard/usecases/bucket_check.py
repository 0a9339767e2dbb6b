"""A checkpoint bucket the user brought, checked for what SpotGuard relies on; what is missing is said.

SpotGuard relies on four settings of its checkpoint bucket: versioning (an overwritten or deleted
checkpoint can be brought back), default encryption, a public access block, and Amazon EventBridge
notifications (the MANIFEST.json events that record each committed checkpoint as it is written). The
stack sets all four on a bucket it creates; a bucket given as CheckpointBucketName is checked by the
reconcile function at its first sweep after a cold start and then once an hour. Each missing setting is
logged at warning level every time, and sent on the stack's topic when the findings differ from the last
ones this container sent, so that an unchanged bucket does not mail every hour (a new container, after a
cold start, sends them once again). Nothing is assumed: a setting that
cannot be read is a finding too. The check never raises: the sweep goes on whatever it finds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from spotguard.ports import PUBLIC_ACCESS_SETTINGS, Alerts, BucketFacts, BucketSettings

log = logging.getLogger(__name__)


def missing(facts: BucketFacts) -> list[str]:
    """What the bucket lacks, one plain sentence each (empty: nothing)."""
    out: list[str] = []
    unreadable = dict(facts.unreadable)
    if "versioning" in unreadable:
        out.append(f"versioning could not be read ({unreadable.pop('versioning')})")
    elif facts.versioning != "Enabled":
        state = "suspended" if facts.versioning == "Suspended" else "never turned on"
        out.append(
            f"versioning is {state}: a checkpoint overwritten or deleted by mistake cannot be brought back"
        )
    if "encryption" in unreadable:
        out.append(f"default encryption could not be read ({unreadable.pop('encryption')})")
    elif not facts.encryption:
        out.append("no default encryption: objects written without an encryption header are not encrypted")
    if "public_access_block" in unreadable:
        out.append(f"the public access block could not be read ({unreadable.pop('public_access_block')})")
    else:
        block = facts.public_access_block or {}
        off = [s for s in PUBLIC_ACCESS_SETTINGS if not block.get(s)]
        if off:
            out.append(
                "the bucket's public access block is not fully on"
                f" ({', '.join(off)} off): a bucket policy or ACL could make checkpoints public"
                " (an account-wide block, if there is one, is not looked at)"
            )
    if "eventbridge" in unreadable:
        out.append(f"the notification configuration could not be read ({unreadable.pop('eventbridge')})")
    elif not facts.eventbridge:
        out.append(
            "Amazon EventBridge notifications are off: committed checkpoints are not recorded as they are"
            " written (a resubmit finds the newest only by listing the bucket)"
        )
    out += [f"{name} could not be read ({why})" for name, why in unreadable.items()]
    return out


class BucketCheck:
    """The check, at first use and then at most once per `every`."""

    def __init__(
        self,
        bucket: str,
        settings: BucketSettings,
        alerts: Alerts,
        clock: Callable[[], datetime],
        every: timedelta = timedelta(hours=1),
    ) -> None:
        self.bucket = bucket
        self.settings = settings
        self.alerts = alerts
        self.clock = clock
        self.every = every
        self._checked_at: datetime | None = None
        self._sent: Sequence[str] = ()

    def due(self) -> bool:
        return self._checked_at is None or self.clock() - self._checked_at >= self.every

    def run(self) -> list[str] | None:
        """The findings (empty when the bucket is right); None when the last check is recent enough."""
        if not self.due():
            return None
        self._checked_at = self.clock()
        try:
            findings = missing(self.settings.facts(self.bucket))
        except Exception as exc:  # the sweep must go on: a failed check is a finding, not an error
            findings = [f"its settings could not be read ({type(exc).__name__}: {exc})"]
        for finding in findings:
            log.warning("checkpoint bucket %s: %s", self.bucket, finding, extra={"bucket": self.bucket})
        if findings and list(findings) != list(self._sent):
            self._send(findings)
        elif not findings:
            self._sent = ()
        return findings

    def _send(self, findings: list[str]) -> None:
        detail = {
            "kind": "checkpoint-bucket-check",
            "bucket": self.bucket,
            "findings": findings,
            "message": f"SpotGuard's checkpoint bucket {self.bucket} (given as CheckpointBucketName) lacks"
            " what a bucket the stack creates has: versioning, default encryption, a public access block"
            " and Amazon EventBridge notifications. SpotGuard goes on using it as it is.",
        }
        try:
            self.alerts.alert(f"SpotGuard: checkpoint bucket {self.bucket} lacks settings", detail)
        except Exception:
            log.exception("checkpoint bucket %s: the alert could not be sent", self.bucket)
            return
        self._sent = list(findings)
