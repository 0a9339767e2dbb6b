"""Where a checkpoint store keeps its checkpoints: an s3://bucket/prefix/ or file:///path/ URI, parsed,
and the key (or path) of each checkpoint's file."""

from __future__ import annotations

import re
from dataclasses import dataclass

from spotguard_agent.manifest import sequence_name
from spotguard_agent.store_errors import StoreError

_URI = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])/(?P<prefix>(?:[^\s]*/)?)$")
_FILE_URI = re.compile(r"^file://(?P<root>/[^\s]*/)$")


@dataclass(frozen=True)
class Location:
    bucket: str  # "" for a local directory
    prefix: str  # "" or ends with "/"; for a local directory, its absolute path

    @classmethod
    def parse(cls, uri: str) -> Location:
        m = _URI.match(uri)
        if m:
            return cls(m["bucket"], m["prefix"])
        f = _FILE_URI.match(uri)
        if f:
            return cls("", f["root"])
        raise StoreError(
            f"{uri!r} is not an s3://bucket/prefix/ or file:///path/ checkpoint URI (it must end with '/')"
        )

    @property
    def local(self) -> bool:
        return not self.bucket

    def key(self, sequence: int, name: str) -> str:
        return f"{self.prefix}checkpoints/{sequence_name(sequence)}/{name}"

    def uri(self, key: str) -> str:
        return f"file://{key}" if self.local else f"s3://{self.bucket}/{key}"
