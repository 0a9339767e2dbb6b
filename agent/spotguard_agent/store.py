"""Committed checkpoints on S3 (or in a local directory, such as a mounted EBS volume that SpotGuard
snapshots): write the files, then MANIFEST.json last; restore the newest good one.

- commit: every file goes up through boto3's transfer manager (parallel, multipart for large files);
  the manifest is written only after all of them, so a checkpoint cut short by SIGKILL has no manifest
  and does not exist. Older checkpoints beyond `keep` are deleted only after the new one is committed.
- a `file:///path/` URI keeps checkpoints in that directory: files are copied and fsynced, and the
  manifest is written to a temporary name, fsynced and renamed, so it appears whole or not at all.
- restore: the newest committed checkpoint (or the one named by SPOTGUARD_RESUME_FROM) is downloaded
  beside the target, every file's size and sha256 checked, and only then moved into place; on any
  mismatch or missing file it falls back to the previous committed checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import os
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


class S3Backend:
    """Objects in a bucket, moved by boto3's transfer manager (parallel, multipart)."""

    def __init__(self, client: Any, bucket: str, transfer: TransferConfig) -> None:
        self.client, self.bucket, self.transfer = client, bucket, transfer

    def list_keys(self, prefix: str) -> list[str]:
        keys: list[str] = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            keys += [o["Key"] for o in page.get("Contents", [])]
        return keys

    def put_files(self, pairs: list[tuple[Path, str]]) -> None:
        with create_transfer_manager(self.client, self.transfer) as manager:
            for f in [manager.upload(str(path), self.bucket, key) for path, key in pairs]:
                f.result()

    def put_bytes(self, key: str, body: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=key, Body=body, ContentType="application/json")

    def get_bytes(self, key: str) -> bytes:
        return bytes(self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read())

    def get_files(self, pairs: list[tuple[str, Path]]) -> None:
        with create_transfer_manager(self.client, self.transfer) as manager:
            for f in [manager.download(self.bucket, key, str(path)) for key, path in pairs]:
                f.result()

    def delete(self, keys: list[str]) -> None:
        for i in range(0, len(keys), 1000):
            self.client.delete_objects(
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": k} for k in keys[i : i + 1000]], "Quiet": True},
            )


class LocalBackend:
    """Files under a directory (keys are absolute paths), written durably: what is on the disk when
    the commit returns is what a snapshot of the volume holds."""

    def list_keys(self, prefix: str) -> list[str]:
        root = Path(prefix)
        if not root.is_dir():
            return []
        return sorted(str(p) for p in root.rglob("*") if p.is_file() and not p.name.startswith(".tmp-"))

    def put_files(self, pairs: list[tuple[Path, str]]) -> None:
        for path, key in pairs:
            target = Path(key)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            _fsync(target)

    def put_bytes(self, key: str, body: bytes) -> None:
        target = Path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f".tmp-{target.name}"
        tmp.write_bytes(body)
        _fsync(tmp)
        os.replace(tmp, target)  # whole or not at all
        _fsync(target.parent)

    def get_bytes(self, key: str) -> bytes:
        try:
            return Path(key).read_bytes()
        except FileNotFoundError as exc:
            raise ValueError(f"{key} is missing") from exc

    def get_files(self, pairs: list[tuple[str, Path]]) -> None:
        for key, path in pairs:
            shutil.copyfile(key, path)

    def delete(self, keys: list[str]) -> None:
        for key in keys:
            Path(key).unlink(missing_ok=True)
        for d in sorted({Path(k).parent for k in keys}, reverse=True):
            with contextlib.suppress(OSError):
                d.rmdir()  # an emptied checkpoint directory


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
        self.backend: S3Backend | LocalBackend = (
            LocalBackend() if self.location.local else S3Backend(client, self.location.bucket, transfer)
        )

    # ------------------------------------------------------------------------------------- listing
    def _keys(self) -> list[str]:
        return self.backend.list_keys(f"{self.location.prefix}checkpoints/")

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
        manifest = Manifest.model_validate_json(self.backend.get_bytes(self.location.key(sequence, MANIFEST)))
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
        with ThreadPoolExecutor(max_workers=4, thread_name_prefix="spotguard-sha256") as hashers:
            hashes = {rel: hashers.submit(sha256_of, directory / rel) for rel in paths}
            self.backend.put_files([(directory / rel, self.location.key(sequence, rel)) for rel in paths])
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
        self.backend.put_bytes(
            self.location.key(sequence, MANIFEST), manifest.model_dump_json(indent=1).encode()
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
        self.backend.delete(doomed)

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
            pairs = []
            for e in manifest.files:
                target = staging / e.path
                target.parent.mkdir(parents=True, exist_ok=True)
                pairs.append((self.location.key(manifest.sequence, e.path), target))
            self.backend.get_files(pairs)
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
