"""S3: read checkpoint manifests, and find the newest committed one by listing when the ledger has none."""

from __future__ import annotations

import re
from typing import Any

from spotguard.domain.checkpoints import MANIFEST, manifest_location

_URI = re.compile(r"^s3://(?P<bucket>[^/]+)/(?P<prefix>.*)$")


def split_uri(uri: str) -> tuple[str, str]:
    m = _URI.match(uri)
    if not m:
        raise ValueError(f"{uri!r} is not an s3:// URI")
    return m["bucket"], m["prefix"]


class S3Checkpoints:
    def __init__(self, client: Any) -> None:
        self.client = client

    def read(self, bucket: str, key: str) -> bytes:
        return bytes(self.client.get_object(Bucket=bucket, Key=key)["Body"].read())

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
