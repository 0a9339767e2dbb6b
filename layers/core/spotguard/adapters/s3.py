"""S3: read checkpoint manifests, and find the newest committed one by listing when the ledger has none."""

from __future__ import annotations

import re
from typing import Any

from botocore.exceptions import ClientError, ParamValidationError

from spotguard.domain.checkpoints import MANIFEST, ManifestUnreadable, manifest_location

_URI = re.compile(r"^s3://(?P<bucket>[^/]+)/(?P<prefix>.*)$")
_GONE = {"NoSuchKey", "404", "NotFound"}
_NOT_OURS = {
    "NoSuchBucket",
    "AccessDenied",
    "403",
    "InvalidBucketName",
    "AllAccessDisabled",
    "InvalidObjectState",
}


def split_uri(uri: str) -> tuple[str, str]:
    m = _URI.match(uri)
    if not m:
        raise ValueError(f"{uri!r} is not an s3:// URI")
    return m["bucket"], m["prefix"]


class S3Checkpoints:
    def __init__(self, client: Any) -> None:
        self.client = client

    def read(self, bucket: str, key: str) -> bytes:
        """The manifest's bytes. Raises ManifestUnreadable for what no retry can mend; other errors
        (throttling, 5xx: what outlived botocore's retries) are raised as they are, to be retried."""
        try:
            return bytes(self.client.get_object(Bucket=bucket, Key=key)["Body"].read())
        except ParamValidationError as exc:  # a bucket or key S3 would refuse: botocore refuses it first
            raise ManifestUnreadable(f"s3://{bucket}/{key}: {str(exc).splitlines()[0]}", gone=False) from None
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            where = f"s3://{bucket}/{key}"
            if code in _GONE:
                raise ManifestUnreadable(f"{where}: no such manifest ({code})", gone=True) from None
            if code in _NOT_OURS:
                raise ManifestUnreadable(f"{where}: cannot be read ({code})", gone=False) from None
            raise

    def committed(self, prefix_uri: str) -> list[tuple[int, str]]:
        """(sequence, manifest key) of every committed checkpoint under the prefix, newest first."""
        bucket, prefix = split_uri(prefix_uri)
        found: list[tuple[int, str]] = []
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=f"{prefix}checkpoints/"
        )
        for page in pages:
            for obj in page.get("Contents", []):
                key = obj["Key"]
                if key.endswith(f"/{MANIFEST}"):
                    where = manifest_location(bucket, key)
                    if where is not None and where[0] == prefix_uri:
                        found.append((where[1], key))
        return sorted(found, reverse=True)
