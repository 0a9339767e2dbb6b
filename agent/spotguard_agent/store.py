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

import contextlib
import functools
import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

from boto3.s3.transfer import TransferConfig

from spotguard_agent.manifest import MANIFEST, FileEntry, Manifest, list_files, sha256_of
from spotguard_agent.restore_target import _check_target, download_verified
from spotguard_agent.store_errors import (
    _READ_ERRORS,
    CheckpointDamaged,
    CheckpointUnavailable,
    StoreError,
    _short,
    is_damage,
    is_transient,
    unreadable,
)
from spotguard_agent.store_file import LocalBackend
from spotguard_agent.store_location import Location
from spotguard_agent.store_s3 import TRANSFER, S3Backend

log = logging.getLogger("spotguard.agent")
T = TypeVar("T")

_SEQ_KEY = re.compile(r"checkpoints/(?P<seq>\d+)/(?P<rest>.+)$")

RESTORE_ATTEMPTS = 3  # tries of one checkpoint's whole restore, each after botocore's own retries
RETRY_PAUSE_SECONDS = 2.0  # before the second try; doubled before each further one


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
            self.location.key(sequence, MANIFEST),
            manifest.model_dump_json(indent=1, exclude_none=True).encode(),
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
        if resume_from:
            self._sequence_of(resume_from)
        _check_target(into)
        found = self.restore_with(functools.partial(self.download_verified, into=into), resume_from, job_id)
        return None if found is None else found[0]

    def restore_with(
        self, read: Callable[[Manifest], T], resume_from: str | None = None, job_id: str = ""
    ) -> tuple[Manifest, T] | None:
        """`restore`, but each checkpoint tried is read by `read(manifest)` (torch_state reads it straight
        into the training state): the chosen manifest and what `read` returned, or None."""
        for sequence in reversed(self.candidates(resume_from)):
            try:
                manifest = self.manifest_of(sequence, job_id)
                if isinstance(manifest, str):  # another job's
                    self.pass_over(sequence, manifest)
                    continue
                value = self._retrying(
                    f"checkpoint {sequence} ({self.manifest_uri(sequence)})",
                    functools.partial(read, manifest),
                )
            except Exception as exc:
                if not is_damage(exc):
                    raise
                self.pass_over(sequence, "damaged", _short(exc))
                continue
            self.restored = sequence
            return manifest, value
        return None

    def candidates(self, resume_from: str | None = None) -> list[int]:
        """The committed checkpoints a restore may take, oldest first: every one, or (`resume_from`) the
        one it names and those before it. Starts a restore: forgets what the last one passed over."""
        wanted = self._sequence_of(resume_from) if resume_from else None
        self.restored, self.passed_over = None, {}
        listing = self.location.uri(f"{self.location.prefix}checkpoints/")
        committed = self._retrying(f"the list of checkpoints under {listing}", self.committed)
        if wanted is None:
            return committed
        if wanted not in committed:
            log.warning("SPOTGUARD_RESUME_FROM names checkpoint %s, which is not committed", wanted)
        for sequence in committed:
            if sequence > wanted:
                self.passed_over[sequence] = "newer than SPOTGUARD_RESUME_FROM"
        return [s for s in committed if s <= wanted]

    def manifest_of(self, sequence: int, job_id: str = "") -> Manifest | str:
        """Checkpoint `sequence`'s manifest, or why it is not this job's (`job_id`, when given). Raises
        CheckpointDamaged (and ValidationError) when it is damaged, CheckpointUnavailable when it cannot
        be read now."""
        what = f"checkpoint {sequence} ({self.manifest_uri(sequence)})"
        manifest = self._retrying(what, functools.partial(self.read_manifest, sequence))
        if job_id and manifest.job_id and manifest.job_id != job_id:
            return f"{_FOREIGN} {manifest.job_id}, not {job_id}"
        return manifest

    def pass_over(self, sequence: int, why: str, detail: str = "") -> None:
        """Checkpoint `sequence` is not restored (damaged, another job's): said, and kept from retention."""
        if detail:
            log.warning("checkpoint %s is %s (%s); trying the previous one", sequence, why, detail)
        else:
            log.warning("checkpoint %s %s; trying the previous one", sequence, why)
        self.passed_over[sequence] = why

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
                    raise CheckpointUnavailable(unreadable(what, _short(exc), attempt)) from exc
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

    def download_verified(self, manifest: Manifest, into: Path) -> None:
        """`manifest`'s files, downloaded beside `into`, verified, and put in place there."""
        pairs = [(self.location.key(manifest.sequence, e.path), e) for e in manifest.files]
        download_verified(self.backend.get_files, pairs, into)


_FOREIGN = "belongs to job"
