"""S3: a bucket's versioning, default encryption, public access block and EventBridge notifications, as
`BucketFacts`. A setting S3 reports as never set is None; one that cannot be read (no permission, no
such bucket) is noted with its error code, never guessed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from botocore.exceptions import ClientError

from spotguard.ports import PUBLIC_ACCESS_SETTINGS, BucketFacts

T = TypeVar("T")

# The error codes S3 answers with when a setting was never set (the setting's absence, not a failure).
_NOT_SET = {
    "ServerSideEncryptionConfigurationNotFoundError",
    "NoSuchPublicAccessBlockConfiguration",
}


class S3BucketSettings:
    def __init__(self, s3: Any) -> None:
        self.s3 = s3

    def facts(self, bucket: str) -> BucketFacts:
        unreadable: dict[str, str] = {}

        def read(name: str, call: Callable[[], T], unset: T) -> T:
            try:
                return call()
            except ClientError as exc:
                code = str(exc.response.get("Error", {}).get("Code", "Unknown"))
                if code in _NOT_SET:
                    return unset
                unreadable[name] = code
                return unset

        versioning = read(
            "versioning", lambda: self.s3.get_bucket_versioning(Bucket=bucket).get("Status"), None
        )
        encryption = read(
            "encryption", lambda: _algorithm(self.s3.get_bucket_encryption(Bucket=bucket)), None
        )
        block = read(
            "public_access_block",
            lambda: _block(self.s3.get_public_access_block(Bucket=bucket)),
            None,
        )
        eventbridge = read(
            "eventbridge",
            lambda: (
                "EventBridgeConfiguration" in self.s3.get_bucket_notification_configuration(Bucket=bucket)
            ),
            False,
        )
        return BucketFacts(
            versioning=versioning,
            encryption=encryption,
            public_access_block=block,
            eventbridge=eventbridge,
            unreadable=unreadable,
        )


def _algorithm(resp: dict[str, Any]) -> str | None:
    rules = resp.get("ServerSideEncryptionConfiguration", {}).get("Rules") or []
    for rule in rules:
        algorithm = rule.get("ApplyServerSideEncryptionByDefault", {}).get("SSEAlgorithm")
        if algorithm:
            return str(algorithm)
    return None


def _block(resp: dict[str, Any]) -> dict[str, bool]:
    conf = resp.get("PublicAccessBlockConfiguration") or {}
    return {s: bool(conf.get(s)) for s in PUBLIC_ACCESS_SETTINGS}
