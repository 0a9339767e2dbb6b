"""Committed checkpoints on S3 (or in a local directory, such as a mounted EBS volume that SpotGuard
snapshots): write the files, then MANIFEST.json last; restore the newest good one.

- commit: every file goes up through boto3's transfer manager (parallel, multipart for large files),
  from a directory (`commit`) or streamed as it is written (`parts`: torch_state's checkpoints, never
  through a local disk); the manifest is written only after all of them, so a checkpoint cut short by
  SIGKILL has no manifest and does not exist. Older checkpoints beyond `keep` are deleted only after
  the new one is committed (see "Retention" below); a retention that fails is logged and leaves the
  commit standing.
- a `file:///path/` URI keeps checkpoints in that directory: files are copied and fsynced, and the
  manifest is written to a temporary name, fsynced and renamed, so it appears whole or not at all. No
  symbolic link below that directory is followed, on commit or on restore.
- restore: the newest committed checkpoint (or the one named by SPOTGUARD_RESUME_FROM) is downloaded
  beside the target, every file's size and sha256 checked, and only then moved into place.

Restore tells two kinds of failure apart, per checkpoint, newest first:
- damaged (CheckpointDamaged: a size or hash that does not match, a manifest that is not valid or names
  another sequence, a file missing (NoSuchKey / 404, or no such file), a symbolic link or other
  non-regular file where a file should be): passed over with a warning, and the previous committed
  checkpoint tried. So is a manifest of another job (its job_id is not ours, when both are set).
- unreadable now (throttling, 5xx, timeouts, connection errors, access denied, a local I/O error such as
  a full disk): the client's botocore retry mode retries each request first; then the whole checkpoint
  is tried again, up to `restore_attempts` times in all with a pause that doubles, when the error is a
  transient one; then restore raises CheckpointUnavailable. It never falls back past, nor starts fresh
  over, a checkpoint that may well be good.

Retention keeps the newest `keep` committed checkpoints that this store has no reason to distrust, and
every sequence above the oldest of them; everything below goes (manifests first, then files). The ones
the last restore passed over (damaged, another job's, or newer than SPOTGUARD_RESUME_FROM) are not
counted among the `keep`, so they, and the one restored from, stay until `keep` checkpoints have been
committed past them; another job's checkpoints are never deleted.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import functools
import logging
import os
import re
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

from boto3.s3.transfer import TransferConfig, create_transfer_manager
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    IncompleteReadError,
)
from botocore.exceptions import ConnectionError as BotocoreConnectionError
from pydantic import ValidationError
from s3transfer.exceptions import RetriesExceededError

from spotguard_agent.manifest import MANIFEST, FileEntry, Manifest, list_files, sequence_name, sha256_of

log = logging.getLogger("spotguard.agent")
T = TypeVar("T")

_URI = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])/(?P<prefix>(?:[^\s]*/)?)$")
_SEQ_KEY = re.compile(r"checkpoints/(?P<seq>\d+)/(?P<rest>.+)$")

PART = 16 * 1024 * 1024  # bytes: multipart above this, in parts of this
# S3 gives one request about 85-90 MB/s (AWS's S3 performance guidelines: about 15 requests in flight
# fill a 10 Gb/s network card). A machine's processes share 64 (about 45 Gb/s), each keeping at least 8:
# one process of a one-GPU job no longer sends a 13.5 GiB stop checkpoint through 8 (0.7 GB/s, 20 s).
NODE_CONCURRENCY = 64
MIN_CONCURRENCY = 8


def transfer_for(concurrency: int, local_processes: int) -> TransferConfig:
    """The transfer manager's settings for one process: `concurrency` requests in flight, or (0) its
    share of the machine's NODE_CONCURRENCY among `local_processes`, at least MIN_CONCURRENCY. In
    memory at most that many parts of 16 MiB (64: 1 GiB)."""
    n = concurrency or max(MIN_CONCURRENCY, NODE_CONCURRENCY // max(1, local_processes))
    config = TransferConfig(
        multipart_threshold=PART,
        multipart_chunksize=PART,
        max_concurrency=n,
        use_threads=True,
        # not the CRT client boto3 picks on instances it deems optimized (p4d, p5, ...) when awscrt is
        # installed: the streams below rely on s3transfer's own reading, limits and retries
        preferred_transfer_client="classic",
    )
    # A file streamed up as it is written (CheckpointStore.parts) holds its parts in memory until sent,
    # and is read by a submission thread of its own for as long as it is written: as many of each as
    # there are requests in flight, or the streams would wait on s3transfer's defaults (10 and 5).
    config.max_in_memory_upload_chunks = n
    config.max_submission_concurrency = n
    return config


TRANSFER = transfer_for(MIN_CONCURRENCY, 1)  # a store made without the agent's environment


RESTORE_ATTEMPTS = 3  # tries of one checkpoint's whole restore, each after botocore's own retries
RETRY_PAUSE_SECONDS = 2.0  # before the second try; doubled before each further one


class StoreError(RuntimeError):
    """A checkpoint location, SPOTGUARD_RESUME_FROM or restore target that cannot be used, in one line."""


class OtherRankFailed(StoreError):
    """This rank's part of a checkpoint failed because another rank's did: its text names that rank and
    its error (the one to report, rather than this rank's)."""


class CheckpointUnavailable(StoreError):
    """A committed checkpoint (or the list of them) exists but cannot be read now: restore stops here
    rather than fall back to an older one or start fresh."""


class CheckpointDamaged(ValueError):
    """Evidence that a committed checkpoint is damaged: restore passes over it to the previous one."""


# Error codes of an S3 answer that say "not now" rather than "no" (with any 5xx status and 429).
_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestThrottled",
        "TooManyRequests",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "ServiceUnavailable",
    }
)
_MISSING_CODES = frozenset({"NoSuchKey", "NotFound", "404"})
_TRANSIENT_ERRNOS = frozenset({errno.EIO, errno.EAGAIN, errno.EINTR, errno.ETIMEDOUT, errno.EBUSY})
# What reading a checkpoint can raise that is not evidence of damage.
_READ_ERRORS = (ClientError, BotoCoreError, RetriesExceededError, OSError)


def is_damage(exc: BaseException) -> bool:
    """Is this error evidence that the checkpoint itself is damaged (rather than unreadable now)?"""
    if isinstance(exc, CheckpointDamaged | ValidationError):
        return True
    if isinstance(exc, ClientError):  # a key that is not there (not a bucket: NoSuchBucket is no damage)
        return exc.response.get("Error", {}).get("Code") in _MISSING_CODES
    return False


def is_transient(exc: BaseException) -> bool:
    """Might the same read succeed in a few seconds (throttling, 5xx, a timeout, a connection lost)?"""
    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        code = exc.response.get("Error", {}).get("Code")
        return code in _TRANSIENT_CODES or status == 429 or status >= 500
    if isinstance(exc, BotoCoreError):  # before OSError: botocore's timeouts are OSErrors too
        return isinstance(exc, BotocoreConnectionError | HTTPClientError | IncompleteReadError)
    if isinstance(exc, RetriesExceededError):  # s3transfer gave up on a download cut short again and again
        return True
    return isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS


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

    @contextlib.contextmanager
    def streams(self) -> Iterator[Callable[[str], contextlib.AbstractContextManager[Any]]]:
        """`open(key)`: a context whose writable stream goes up to `key` as it is written, through one
        transfer manager for every stream opened here (its requests in flight shared among them). The
        object is complete when the context ends without an error; an error inside it (or an upload that
        fails) leaves no object: the multipart upload is aborted, never completed short. No byte touches
        a local disk."""
        with create_transfer_manager(self.client, self.transfer) as manager:

            @contextlib.contextmanager
            def open_(key: str) -> Iterator[_Pipe]:
                pipe = _Pipe(key, 2 * self.transfer.multipart_chunksize)
                pipe.future = future = manager.upload(pipe, self.bucket, key)
                try:
                    yield pipe
                except BaseException as exc:
                    pipe.abort(f"not completed: its writer failed ({type(exc).__name__})")
                    failure = _failure(future)  # waits for the upload to end (aborted)
                    if isinstance(exc, _PipeAborted) and failure is not None:
                        raise failure from None  # the upload failed first: its error says why
                    raise
                pipe.close()
                future.result()

            yield open_

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
            answer = self.client.delete_objects(
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": k} for k in keys[i : i + 1000]], "Quiet": True},
            )
            if answer.get("Errors"):  # Quiet: only the keys that were not deleted come back
                first = answer["Errors"][0]
                raise StoreError(
                    f"{len(answer['Errors'])} of {len(keys[i : i + 1000])} objects not deleted, "
                    f"such as {first.get('Key')} ({first.get('Code')})"
                )


class _PipeAborted(StoreError):
    """A stream's writer or its upload ended the other side."""


_POLL_SECONDS = 0.1  # how often a writer waiting for room looks whether its upload failed


class _Pipe:
    """The bytes of one file, from the thread that writes them to the transfer manager, which reads a
    stream that cannot seek in parts of its chunk size. At most `limit` bytes wait in between: a writer
    faster than its upload waits for it. `close` is the end of the file; `abort` ends both sides with
    an error instead, so a file cut short is never taken for a whole one."""

    def __init__(self, key: str, limit: int) -> None:
        self.key, self.limit = key, limit
        self.future: Any = None  # the upload reading it: one that ends (fails) first ends the writer too
        self._chunks: collections.deque[bytes] = collections.deque()
        self._held = 0
        self._closed = False
        self._error: str | None = None
        self._cond = threading.Condition()

    # the writer's side
    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        step = max(1, self.limit // 2)
        for at in range(0, len(view), step):
            piece = bytes(view[at : at + step])  # a copy: the writer may reuse its buffer
            with self._cond:
                self._upload_going()
                while self._held >= self.limit and self._error is None:
                    self._cond.wait(_POLL_SECONDS)
                    self._upload_going()
                self._check()
                if self._closed:
                    raise ValueError(f"{self.key}: written after its end")
                self._chunks.append(piece)
                self._held += len(piece)
                self._cond.notify_all()
        return len(view)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def abort(self, why: str) -> None:
        with self._cond:
            if self._error is None:
                self._error = why
            self._cond.notify_all()

    # the transfer manager's side
    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def read(self, amount: int | None = -1) -> bytes:
        """`amount` bytes (fewer only at the end of the file), or every byte to the end."""
        out: list[bytes] = []
        wanted = amount if amount is not None and amount >= 0 else None
        got = 0
        with self._cond:
            while wanted is None or got < wanted:
                while not self._chunks and not self._closed and self._error is None:
                    self._cond.wait()
                self._check()
                if not self._chunks:  # closed: the end of the file
                    break
                chunk = self._chunks.popleft()
                if wanted is not None and got + len(chunk) > wanted:
                    keep = wanted - got
                    self._chunks.appendleft(chunk[keep:])
                    chunk = chunk[:keep]
                out.append(chunk)
                got += len(chunk)
                self._held -= len(chunk)
                self._cond.notify_all()
        return out[0] if len(out) == 1 else b"".join(out)

    def _check(self) -> None:
        if self._error is not None:
            raise _PipeAborted(f"{self.key}: {self._error}")

    def _upload_going(self) -> None:
        """An upload that is done while its file is still being written has failed or been cancelled
        (s3transfer marks it done at once, then reads on to the end of the file, skipping every part):
        the writer stops now rather than write the rest of the file for nothing."""
        if self._error is None and self.future is not None and self.future.done():
            self._error = "its upload failed"
            self._cond.notify_all()


def _failure(future: Any) -> BaseException | None:
    try:
        future.result()
    except BaseException as exc:
        return exc
    return None


class LocalBackend:
    """Files under a directory (keys are absolute paths below `root`), written durably: what is on the
    disk when the commit returns is what a snapshot of the volume holds. No symbolic link below the root
    is ever followed, reading or writing (every path is walked with O_NOFOLLOW, one directory at a time):
    a link where a checkpoint's file should be is not that file. The root itself may be a link (a mount)."""

    def __init__(self, root: str) -> None:
        self.root = Path(root)

    def list_keys(self, prefix: str) -> list[str]:
        if Path(prefix).is_symlink():
            raise StoreError(f"{prefix} is a symbolic link: checkpoints are not read or written through one")
        keys = []
        for directory, _, names in os.walk(prefix):  # does not enter links to directories
            for name in names:
                path = os.path.join(directory, name)
                with contextlib.suppress(FileNotFoundError):
                    if not name.startswith(".tmp-") and stat.S_ISREG(os.lstat(path).st_mode):
                        keys.append(path)
        return sorted(keys)

    def put_files(self, pairs: list[tuple[Path, str]]) -> None:
        for path, key in pairs:
            src = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                with self._created(key) as (dst, parent):
                    _copy(src, dst)
                    os.fsync(dst)
                    os.fsync(parent)
            finally:
                os.close(src)

    def put_bytes(self, key: str, body: bytes) -> None:
        name = Path(key).name
        tmp = f".tmp-{name}"
        with self._created(str(Path(key).parent / tmp)) as (fd, parent):
            try:
                _write_all(fd, body)
                os.fsync(fd)
                os.replace(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)  # whole or not at all
                os.fsync(parent)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=parent)
                raise

    def get_bytes(self, key: str) -> bytes:
        with self._opened(key) as fd:
            chunks = []
            while chunk := os.read(fd, _COPY_CHUNK):
                chunks.append(chunk)
            return b"".join(chunks)

    def get_files(self, pairs: list[tuple[str, Path]]) -> None:
        for key, path in pairs:
            with self._opened(key) as src:
                dst = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
                try:
                    _copy(src, dst)
                finally:
                    os.close(dst)

    def delete(self, keys: list[str]) -> None:
        for key in keys:
            Path(key).unlink(missing_ok=True)
        for d in sorted({Path(k).parent for k in keys}, reverse=True):
            with contextlib.suppress(OSError):
                d.rmdir()  # an emptied checkpoint directory

    # ----------------------------------------------------------------------- paths without links
    def _parts(self, key: str) -> tuple[list[str], str]:
        *directories, name = Path(key).relative_to(self.root).parts
        return directories, name

    def _directory(self, parts: list[str], create: bool) -> int:
        """A descriptor of root/parts..., opened without following a link below the root."""
        if create:
            self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for part in parts:
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, dir_fd=fd)
                below = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = below
        except BaseException:
            os.close(fd)
            raise
        return fd

    @contextlib.contextmanager
    def _opened(self, key: str) -> Iterator[int]:
        """The regular file at `key`, for reading; anything else there is damage to the checkpoint."""
        directories, name = self._parts(key)
        try:
            parent = self._directory(directories, create=False)
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=parent)
            finally:
                os.close(parent)
        except FileNotFoundError as exc:
            raise CheckpointDamaged(f"{key} is missing") from exc
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise CheckpointDamaged(f"{key} is a symbolic link or under one (not followed)") from exc
            raise
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise CheckpointDamaged(f"{key} is not a regular file")
            yield fd
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _created(self, key: str) -> Iterator[tuple[int, int]]:
        """(a new regular file at `key` for writing, its directory): directories on the way are made,
        and a link on the way is an error (ELOOP), never followed."""
        directories, name = self._parts(key)
        parent = self._directory(directories, create=True)
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644, dir_fd=parent)
            try:
                yield fd, parent
            finally:
                os.close(fd)
        finally:
            os.close(parent)


_COPY_CHUNK = 8 * 1024 * 1024


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _copy(src: int, dst: int) -> None:
    """All of the file `src` into `dst` (descriptors): in the kernel with sendfile where it can."""
    offset = 0
    try:
        while sent := os.sendfile(dst, src, offset, _COPY_CHUNK):
            offset += sent
        return
    except OSError as exc:
        if offset or exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSOCK, errno.EOPNOTSUPP):
            raise
    while chunk := os.read(src, _COPY_CHUNK):
        _write_all(dst, chunk)


@dataclass(frozen=True)
class Parts:
    """Where one process writes its files of a checkpoint (CheckpointStore.parts): into `directory`,
    in place (a file:// store), or each through `open(name)`, a context whose writable stream goes up
    to the file's object as it is written (S3: no copy through a local disk, which may be too small or
    too slow for a GPU's state; the upload runs while the file is written)."""

    directory: Path | None = None
    open: Callable[[str], contextlib.AbstractContextManager[Any]] | None = None


@dataclass(frozen=True)
class Committed:
    manifest: Manifest
    uri: str  # of its MANIFEST.json
    seconds: float = 0.0  # how long the commit took (upload + manifest)

    @property
    def throughput_bytes_per_second(self) -> float:
        return self.manifest.total_bytes / self.seconds if self.seconds > 0 else 0.0


class CheckpointStore:
    def __init__(
        self,
        client: Any,
        uri: str,
        keep: int = 3,
        transfer: TransferConfig = TRANSFER,
        restore_attempts: int = RESTORE_ATTEMPTS,
        retry_pause: float | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        if keep < 1:
            raise StoreError("keep must be at least 1")
        if restore_attempts < 1:
            raise StoreError("restore_attempts must be at least 1")
        self.client = client
        self.location = Location.parse(uri)
        self.keep = keep
        self.transfer = transfer
        self.restore_attempts = restore_attempts
        self.retry_pause = RETRY_PAUSE_SECONDS if retry_pause is None else retry_pause
        self.clock = clock  # dates each manifest (a scaled clock in local runs, AgentEnv.clock)
        self.counts: Literal["steps", "commits"] = "steps"  # what a manifest's step counts (Manifest)
        self.backend: S3Backend | LocalBackend = (
            LocalBackend(self.location.prefix)
            if self.location.local
            else S3Backend(client, self.location.bucket, transfer)
        )
        # What the last restore found: the sequence it restored (None: a fresh start) and the committed
        # ones it passed over, each with why. Retention does not count those (see the module's doc).
        self.restored: int | None = None
        self.passed_over: dict[int, str] = {}

    # ------------------------------------------------------------------------------------- listing
    def _keys(self) -> list[str]:
        return self.backend.list_keys(f"{self.location.prefix}checkpoints/")

    def _sequences(self, keys: list[str]) -> tuple[list[int], list[int]]:
        """(every sequence that has any object, the committed ones), ascending."""
        seen, committed = set(), set()
        for key in keys:
            seq = self._sequence_of_key(key)
            if seq is not None:
                seen.add(seq)
                if key.endswith(f"/{MANIFEST}"):
                    committed.add(seq)
        return sorted(seen), sorted(committed)

    def _sequence_of_key(self, key: str) -> int | None:
        m = _SEQ_KEY.search(key[len(self.location.prefix) :])
        return int(m["seq"]) if m else None

    def committed(self) -> list[int]:
        return self._sequences(self._keys())[1]

    def newest(self) -> str | None:
        """URI of the newest committed manifest (what SPOTGUARD_RESUME_FROM would name)."""
        committed = self.committed()
        return self.manifest_uri(committed[-1]) if committed else None

    def manifest_uri(self, sequence: int) -> str:
        return self.location.uri(self.location.key(sequence, MANIFEST))

    def read_manifest(self, sequence: int) -> Manifest:
        manifest = Manifest.model_validate_json(self.backend.get_bytes(self.location.key(sequence, MANIFEST)))
        if manifest.sequence != sequence:
            raise CheckpointDamaged(f"manifest says sequence {manifest.sequence}, found under {sequence}")
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
        sequence = self._next(keys)
        # Hash while uploading: hashlib releases the GIL on large buffers, so the two overlap.
        with ThreadPoolExecutor(max_workers=4, thread_name_prefix="spotguard-sha256") as hashers:
            hashes = {rel: hashers.submit(sha256_of, directory / rel) for rel in paths}
            self.backend.put_files([(directory / rel, self.location.key(sequence, rel)) for rel in paths])
        entries = [
            FileEntry(path=rel, size=(directory / rel).stat().st_size, sha256=hashes[rel].result())
            for rel in paths
        ]
        return self._publish(sequence, entries, keys, step, progress, attempt, job_id, started)

    def _next(self, keys: list[str]) -> int:
        seen, _ = self._sequences(keys)
        return (seen[-1] + 1) if seen else 0  # never reuse a half-written sequence

    # --------------------------------------------------- a checkpoint written in parts (torch_state)
    # The parts of one checkpoint may come from several processes (the ranks of a torchrun job): one of
    # them picks the sequence (`next_sequence`), each writes its own files where `parts(sequence)` says
    # (the checkpoint's own directory in a file:// store, so nothing is copied again; for S3 each file
    # streamed up as it is written), and once every part is durable one of them writes the manifest
    # listing every part's files (`publish`). A part that never arrives leaves no manifest.
    def next_sequence(self) -> int:
        return self._next(self._keys())

    @contextlib.contextmanager
    def parts(self, sequence: int) -> Iterator[Parts]:
        """Where this process writes its files of checkpoint `sequence`: in a file:// store into the
        checkpoint's own directory, in place (each file fsynced by its writer; the directory is fsynced
        here once they are all written); in S3 each file streamed up to its object as it is written.
        When the context ends without an error, every file written in it is durable; the manifest is
        the caller's to publish."""
        if isinstance(self.backend, LocalBackend):
            key = self.location.key(sequence, MANIFEST)
            directories, _ = self.backend._parts(key)
            fd = self.backend._directory(directories, create=True)  # made without following a link
            try:
                yield Parts(directory=Path(key).parent)
                os.fsync(fd)
            finally:
                os.close(fd)
            return
        with self.backend.streams() as open_:
            yield Parts(open=lambda name: open_(self.location.key(sequence, name)))

    def publish(
        self,
        sequence: int,
        entries: list[FileEntry],
        step: int,
        progress: float,
        attempt: int = 0,
        job_id: str = "",
        started: float | None = None,
        retain: bool = True,
    ) -> Committed:
        """Write the manifest of checkpoint `sequence`, whose files (`entries`) are all durable, and
        apply retention (unless not `retain`: a stop checkpoint leaves the deleting to the next attempt's
        first commit, which counts everything there is). `started`: time.monotonic() when the checkpoint
        was begun (for its seconds)."""
        if not entries:
            raise StoreError(f"checkpoint {sequence} has no file")
        keys = self._keys() if retain else []
        begun = time.monotonic() if started is None else started
        return self._publish(sequence, entries, keys, step, progress, attempt, job_id, begun, retain)

    def _publish(
        self,
        sequence: int,
        entries: list[FileEntry],
        keys: list[str],
        step: int,
        progress: float,
        attempt: int,
        job_id: str,
        started: float,
        retain: bool = True,
    ) -> Committed:
        paths = [e.path for e in entries]
        manifest = Manifest(
            sequence=sequence,
            job_id=job_id,
            attempt=attempt,
            step=step,
            counts=self.counts,
            progress=progress,
            created_at=self.clock(),
            files=tuple(entries),
        )
        self.backend.put_bytes(
            self.location.key(sequence, MANIFEST), manifest.model_dump_json(indent=1).encode()
        )
        new_keys = [self.location.key(sequence, rel) for rel in [*paths, MANIFEST]]
        try:
            if retain:
                self._apply_retention(keys + new_keys)  # what is there now, without listing it again
        except (StoreError, *_READ_ERRORS) as exc:  # the checkpoint is committed all the same
            log.warning(
                "retention after checkpoint %s failed (%s); the next commit tries again",
                sequence,
                _short(exc),
            )
        return Committed(manifest, self.manifest_uri(sequence), time.monotonic() - started)

    def _apply_retention(self, keys: list[str]) -> None:
        _, committed = self._sequences(keys)
        trusted = [s for s in committed if s not in self.passed_over]
        if len(trusted) < self.keep:
            return
        cutoff = trusted[-self.keep]  # everything below the oldest kept one goes, committed or not...
        foreign = {s for s, why in self.passed_over.items() if why.startswith(_FOREIGN)}
        doomed = [k for k in keys if (s := self._sequence_of_key(k)) is not None and s < cutoff]
        doomed = [k for k in doomed if self._sequence_of_key(k) not in foreign]  # ...but another job's
        # Manifests first, in requests of their own, so that a delete cut short never leaves a manifest
        # without its files: a sequence whose manifest could not be deleted keeps its files too.
        self.backend.delete([k for k in doomed if k.endswith(f"/{MANIFEST}")])
        self.backend.delete([k for k in doomed if not k.endswith(f"/{MANIFEST}")])

    # ------------------------------------------------------------------------------------- restore
    def restore(self, into: Path, resume_from: str | None = None, job_id: str = "") -> Manifest | None:
        """Restore into `into` the checkpoint named by `resume_from` (a manifest URI), or the newest;
        pass over damaged ones and other jobs' (when `job_id` is given) to older ones. None: nothing to
        restore (a fresh start). Raises StoreError for a refused `resume_from` or target, and its
        CheckpointUnavailable when a committed checkpoint cannot be read now (see the module's doc)."""
        into = Path(into)
        wanted = self._sequence_of(resume_from) if resume_from else None
        _check_target(into)
        self.restored, self.passed_over = None, {}
        listing = self.location.uri(f"{self.location.prefix}checkpoints/")
        committed = self._retrying(f"the list of checkpoints under {listing}", self.committed)
        if wanted is not None:
            if wanted not in committed:
                log.warning("SPOTGUARD_RESUME_FROM names checkpoint %s, which is not committed", wanted)
            for sequence in committed:
                if sequence > wanted:
                    self.passed_over[sequence] = "newer than SPOTGUARD_RESUME_FROM"
            committed = [s for s in committed if s <= wanted]
        for sequence in reversed(committed):
            try:
                manifest = self._retrying(
                    f"checkpoint {sequence} ({self.manifest_uri(sequence)})",
                    functools.partial(self._restore_one, sequence, into, job_id),
                )
            except Exception as exc:
                if not is_damage(exc):
                    raise
                log.warning("checkpoint %s is damaged (%s); trying the previous one", sequence, _short(exc))
                self.passed_over[sequence] = "damaged"
                continue
            if isinstance(manifest, str):  # another job's
                log.warning("checkpoint %s %s; trying the previous one", sequence, manifest)
                self.passed_over[sequence] = manifest
                continue
            self.restored = sequence
            return manifest
        return None

    def _restore_one(self, sequence: int, into: Path, job_id: str) -> Manifest | str:
        manifest = self.read_manifest(sequence)
        if job_id and manifest.job_id and manifest.job_id != job_id:
            return f"{_FOREIGN} {manifest.job_id}, not {job_id}"
        self._download_verified(manifest, into)
        return manifest

    def _retrying(self, what: str, read: Callable[[], T]) -> T:
        """`read()`, tried again after a pause while it fails in a way that may pass; damage goes up as
        it is; any other failure to read becomes CheckpointUnavailable, in one line."""
        for attempt in range(1, self.restore_attempts + 1):
            try:
                return read()
            except _READ_ERRORS as exc:
                if is_damage(exc):
                    raise
                if not is_transient(exc) or attempt == self.restore_attempts:
                    tries = f"{attempt} tr{'y' if attempt == 1 else 'ies'}"
                    raise CheckpointUnavailable(
                        f"{what} cannot be read now ({_short(exc)}; {tries}): restore later rather than "
                        "start from scratch"
                    ) from exc
                pause = self.retry_pause * 2 ** (attempt - 1)
                log.warning("%s cannot be read now (%s); trying again in %.1f s", what, _short(exc), pause)
                time.sleep(pause)
        raise AssertionError("unreachable")  # the loop returns or raises

    def _sequence_of(self, manifest_uri: str) -> int:
        """The sequence of a manifest URI of this store, exactly as the agent writes it; else StoreError."""
        prefix = self.location.uri(f"{self.location.prefix}checkpoints/")
        m = re.fullmatch(re.escape(prefix) + r"(\d+)/" + re.escape(MANIFEST), manifest_uri)
        if not m or self.manifest_uri(int(m[1])) != manifest_uri:
            raise StoreError(f"SPOTGUARD_RESUME_FROM {manifest_uri!r} is not a manifest under {prefix}")
        return int(m[1])

    def _download_verified(self, manifest: Manifest, into: Path) -> None:
        into.parent.mkdir(parents=True, exist_ok=True)
        # a volume mounted at the target (an EBS volume, a container's mount): staged on it, so that its
        # files move in by rename (across devices they could not)
        mounted = into.is_dir() and os.path.ismount(into)
        staging = Path(tempfile.mkdtemp(prefix=".spotguard-restore-", dir=into if mounted else into.parent))
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
                    raise CheckpointDamaged(f"{e.path} does not match its manifest")
            _check_target(into)  # again: nothing may have put a link there meanwhile
            _put_in_place(staging, into)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)


_FOREIGN = "belongs to job"


def _put_in_place(staging: Path, into: Path) -> None:
    """The restored checkpoint (`staging`) becomes `into`: what was there goes, and the directory is
    replaced by rename; or, when `into` is a mount point (a volume, a bind mount: it cannot be removed),
    it stays and the checkpoint's files move into it."""
    if not into.exists():
        staging.rename(into)
        return
    for child in into.iterdir():
        if child == staging:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    mounted = staging.parent == into  # staged on the volume mounted there
    if not mounted:
        try:
            into.rmdir()
        except OSError as exc:
            if exc.errno not in (errno.EBUSY, errno.EPERM, errno.EACCES):
                raise
            mounted = True
    if not mounted:
        staging.rename(into)
        return
    for child in staging.iterdir():  # a mount point: it stays, the files move in (copied when it is
        shutil.move(child, into / child.name)  # another device than the staging's)
    staging.rmdir()


def _check_target(into: Path) -> None:
    if into.is_symlink():
        raise StoreError(f"restore target {into} is a symbolic link: refusing to restore through it")
    if into.exists() and not into.is_dir():
        raise StoreError(f"restore target {into} exists and is not a directory")


def _short(exc: BaseException) -> str:
    if isinstance(exc, RetriesExceededError) and exc.last_exception is not None:
        exc = exc.last_exception
    text = str(exc).splitlines()[0][:200] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
