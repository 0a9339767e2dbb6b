"""Committed checkpoints on S3: upload, then MANIFEST.json last; restore the newest good one.

- commit: every file goes up through boto3's transfer manager (parallel, multipart for large files);
  the manifest is written only after all of them, so a checkpoint cut short by SIGKILL has no manifest
  and does not exist. Older checkpoints beyond `keep` are deleted only after the new one is committed.
- restore: the newest committed checkpoint (or the one named by SPOTGUARD_RESUME_FROM) is downloaded
  beside the target, every file's size and sha256 checked, and only then moved into place; on any
  mismatch or missing file it falls back to the previous committed checkpoint.
"""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from boto3.s3.transfer import TransferConfig, create_transfer_manager
from botocore.exceptions import ClientError
from pydantic import ValidationError

from spotguard_agent.manifest import MANIFEST, FileEntry, Manifest, list_files, sequence_name, sha256_of

log = logging.getLogger("spotguard.agent")

_URI = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])/(?P<prefix>(?:[^\s]*/)?)$")
_SEQ_KEY = re.compile(r"checkpoints/(?P<seq>\d+)/(?P<rest>.+)$")

# 8 parallel transfers and 16 MiB parts: enough to fill an instance's network, small enough for memory.
TRANSFER = TransferConfig(
    multipart_threshold=16 * 1024 * 1024,
    multipart_chunksize=16 * 1024 * 1024,
    max_concurrency=8,
    use_threads=True,
)


class StoreError(RuntimeError):
    """A checkpoint location that cannot be used, said in one line."""


@dataclass(frozen=True)
class Location:
    bucket: str
    prefix: str  # "" or ends with "/"

    @classmethod
    def parse(cls, uri: str) -> Location:
        m = _URI.match(uri)
        if not m:
            raise StoreError(f"{uri!r} is not an s3://bucket/prefix/ checkpoint URI (it must end with '/')")
        return cls(m["bucket"], m["prefix"])

    def key(self, sequence: int, name: str) -> str:
        return f"{self.prefix}checkpoints/{sequence_name(sequence)}/{name}"

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"


@dataclass(frozen=True)
class Committed:
    manifest: Manifest
    uri: str  # of its MANIFEST.json
    seconds: float = 0.0  # how long the commit took (upload + manifest)

    @property
    def throughput_bytes_per_second(self) -> float:
        return self.manifest.total_bytes / self.seconds if self.seconds > 0 else 0.0


class CheckpointStore:
    def __init__(self, client: Any, uri: str, keep: int = 3, transfer: TransferConfig = TRANSFER) -> None:
        if keep < 1:
            raise StoreError("keep must be at least 1")
        self.client = client
        self.location = Location.parse(uri)
        self.keep = keep
        self.transfer = transfer

    # ------------------------------------------------------------------------------------- listing
    def _keys(self) -> list[str]:
        keys: list[str] = []
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.location.bucket, Prefix=f"{self.location.prefix}checkpoints/"
        )
        for page in pages:
            keys += [o["Key"] for o in page.get("Contents", [])]
        return keys

    def _sequences(self, keys: list[str]) -> tuple[list[int], list[int]]:
        """(every sequence that has any object, the committed ones), ascending."""
        seen, committed = set(), set()
        for key in keys:
            m = _SEQ_KEY.search(key[len(self.location.prefix) :])
            if m:
                seen.add(int(m["seq"]))
                if m["rest"] == MANIFEST:
                    committed.add(int(m["seq"]))
        return sorted(seen), sorted(committed)

    def committed(self) -> list[int]:
        return self._sequences(self._keys())[1]

    def newest(self) -> str | None:
        """URI of the newest committed manifest (what SPOTGUARD_RESUME_FROM would name)."""
        committed = self.committed()
        return self.location.uri(self.location.key(committed[-1], MANIFEST)) if committed else None

    def read_manifest(self, sequence: int) -> Manifest:
        body = self.client.get_object(Bucket=self.location.bucket, Key=self.location.key(sequence, MANIFEST))
        manifest = Manifest.model_validate_json(body["Body"].read())
        if manifest.sequence != sequence:
            raise ValueError(f"manifest says sequence {manifest.sequence}, found under {sequence}")
        return manifest

    # -------------------------------------------------------------------------------------- commit
    def commit(
        self, directory: Path, step: int, progress: float, attempt: int = 0, job_id: str = ""
    ) -> Committed:
        started = time.monotonic()
        directory = Path(directory)
        paths = list_files(directory)
        if not paths:
            raise StoreError(f"{directory} holds no file to checkpoint")
        keys = self._keys()
        seen, _ = self._sequences(keys)
        sequence = (seen[-1] + 1) if seen else 0  # never reuse a half-written sequence
        # Hash while uploading: hashlib releases the GIL on large buffers, so the two overlap.
        with (
            ThreadPoolExecutor(max_workers=4, thread_name_prefix="spotguard-sha256") as hashers,
            create_transfer_manager(self.client, self.transfer) as manager,
        ):
            bucket = self.location.bucket
            uploads = [
                manager.upload(str(directory / rel), bucket, self.location.key(sequence, rel))
                for rel in paths
            ]
            hashes = {rel: hashers.submit(sha256_of, directory / rel) for rel in paths}
            for f in uploads:
                f.result()
        entries = [
            FileEntry(path=rel, size=(directory / rel).stat().st_size, sha256=hashes[rel].result())
            for rel in paths
        ]
        manifest = Manifest(
            sequence=sequence,
            job_id=job_id,
            attempt=attempt,
            step=step,
            progress=progress,
            created_at=datetime.now(UTC),
            files=tuple(entries),
        )
        self.client.put_object(
            Bucket=self.location.bucket,
            Key=self.location.key(sequence, MANIFEST),
            Body=manifest.model_dump_json(indent=1).encode(),
            ContentType="application/json",
        )
        committed = Committed(manifest, self.location.uri(self.location.key(sequence, MANIFEST)))
        new_keys = [self.location.key(sequence, rel) for rel in [*paths, MANIFEST]]
        self._apply_retention(keys + new_keys)  # what is there now, without listing it again
        return Committed(committed.manifest, committed.uri, time.monotonic() - started)

    def _apply_retention(self, keys: list[str]) -> None:
        _, committed = self._sequences(keys)
        if len(committed) <= self.keep:
            return
        cutoff = committed[-self.keep]  # everything below the oldest kept one goes, committed or not
        doomed = []
        for key in keys:
            m = _SEQ_KEY.search(key[len(self.location.prefix) :])
            if m and int(m["seq"]) < cutoff:
                doomed.append(key)
        # Manifests first, so that a delete cut short never leaves a manifest without its files.
        doomed.sort(key=lambda k: not k.endswith(f"/{MANIFEST}"))
        for i in range(0, len(doomed), 1000):
            self.client.delete_objects(
                Bucket=self.location.bucket,
                Delete={"Objects": [{"Key": k} for k in doomed[i : i + 1000]], "Quiet": True},
            )

    # ------------------------------------------------------------------------------------- restore
    def restore(self, into: Path, resume_from: str | None = None) -> Manifest | None:
        """Restore into `into` the checkpoint named by `resume_from` (a manifest URI), or the newest;
        fall back to older committed ones when one is damaged. None: nothing to restore (fresh start)."""
        committed = self.committed()
        if resume_from:
            wanted = self._sequence_of(resume_from)
            committed = [s for s in committed if s <= wanted]
        for sequence in reversed(committed):
            try:
                manifest = self.read_manifest(sequence)
                self._download_verified(manifest, Path(into))
            except (ValidationError, ValueError, ClientError, OSError) as exc:
                log.warning(
                    "checkpoint %s is not usable (%s); trying the previous one", sequence, _short(exc)
                )
                continue
            return manifest
        return None

    def _sequence_of(self, manifest_uri: str) -> int:
        prefix = self.location.uri(f"{self.location.prefix}checkpoints/")
        m = re.fullmatch(re.escape(prefix) + r"(\d+)/" + re.escape(MANIFEST), manifest_uri)
        if not m:
            raise StoreError(f"{manifest_uri!r} is not a manifest under {prefix}")
        return int(m[1])

    def _download_verified(self, manifest: Manifest, into: Path) -> None:
        into.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".spotguard-restore-", dir=into.parent))
        try:
            with create_transfer_manager(self.client, self.transfer) as manager:
                futures = []
                for e in manifest.files:
                    target = staging / e.path
                    target.parent.mkdir(parents=True, exist_ok=True)
                    key = self.location.key(manifest.sequence, e.path)
                    futures.append(manager.download(self.location.bucket, key, str(target)))
                for f in futures:
                    f.result()
            for e in manifest.files:
                p = staging / e.path
                if p.stat().st_size != e.size or sha256_of(p) != e.sha256:
                    raise ValueError(f"{e.path} does not match its manifest")
            if into.exists():
                shutil.rmtree(into)
            staging.rename(into)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)


def _short(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
