"""The agent's three ways to commit a checkpoint: a directory now (`commit`), a directory in the
background while training goes on (`commit_async`), and the files every rank writes in parts, published
in one manifest by rank 0 (`commit_parts`); and the wait for the one in flight (a mixin of
spotguard_agent.agent.Agent, whose __init__ sets its state)."""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spotguard_agent.manifest import FileEntry
from spotguard_agent.ranks import Ranks
from spotguard_agent.store import CheckpointStore, Committed, Parts
from spotguard_agent.store_errors import OtherRankFailed, StoreError

if TYPE_CHECKING:
    from spotguard_agent.agent import AgentEnv
    from spotguard_agent.ranks import Collective

log = logging.getLogger("spotguard.agent")

WARNING_SECONDS = 120  # a spot warning's notice: a checkpoint should commit within it


class Commits:
    """Agent's commits, in the loop's thread or in the background, and the wait for them."""

    env: AgentEnv
    store: CheckpointStore
    ranks: Ranks
    step_name: str
    last: Committed | None
    _stop: threading.Event
    _save: threading.Event
    _agreed_stop: bool
    _stop_committed: bool
    _last_commit: float
    _pending: threading.Thread | None
    _pending_error: BaseException | None

    if TYPE_CHECKING:

        def _coll(self) -> Collective: ...

    def commit(self, directory: Path, step: int, progress: float) -> Committed:
        """Commit `directory` now (and wait for any upload still running first)."""
        self.wait()
        return self._commit(directory, step, progress)

    def commit_async(
        self,
        directory: Path,
        step: int,
        progress: float,
        remove: bool = True,
        prepare: Callable[[], None] | None = None,
    ) -> None:
        """Write (`prepare`, if given), upload and commit `directory` in the background; training goes
        on meanwhile. With `remove` the directory is deleted once committed. After SIGTERM all of it
        happens at once instead, since the process is about to exit."""
        if self._stop.is_set():
            try:
                if prepare is not None:
                    prepare()
                self.commit(directory, step, progress)
            finally:
                if remove:
                    shutil.rmtree(directory, ignore_errors=True)
            return
        self.wait()

        def run() -> None:
            try:
                if prepare is not None:
                    prepare()
                self._commit(directory, step, progress)
            except BaseException as exc:  # reported by the next wait()
                self._pending_error = exc
            finally:
                if remove:
                    shutil.rmtree(directory, ignore_errors=True)

        self._save.clear()
        self._last_commit = time.monotonic()
        self._pending = threading.Thread(target=run, name="spotguard-commit", daemon=False)
        self._pending.start()

    def commit_parts(
        self,
        write: Callable[[Parts, Any], list[FileEntry]],
        step: int,
        progress: float,
        sync: bool = False,
    ) -> None:
        """Commit a checkpoint whose files `write(parts, group)` writes where `parts` says (store.Parts:
        a directory in place, or streams to S3), returning each file's entry, hashed as written; they
        are durable once it returns. `group` is the agent's process group for
        the writers' own collectives (None in one process). In the background unless `sync` or stopping;
        in a job of several ranks every rank calls it at the same step, and rank 0 writes the manifest
        of every rank's files once all of them are durable: a rank that fails or dies leaves none."""
        stopping = self._agreed_stop if self.ranks.distributed else self._stop.is_set()
        self.wait()
        if self.ranks.distributed:
            self._coll()  # made here, in the loop's thread, in every rank at the same point
        if sync or stopping:
            self._done(self._commit_parts(write, step, progress))
            return

        def run() -> None:
            try:
                self._done(self._commit_parts(write, step, progress))
            except BaseException as exc:  # reported by the next wait()
                self._pending_error = exc

        self._save.clear()
        self._last_commit = time.monotonic()
        self._pending = threading.Thread(target=run, name="spotguard-commit", daemon=False)
        self._pending.start()

    def _commit_parts(
        self, write: Callable[[Parts, Any], list[FileEntry]], step: int, progress: float
    ) -> Committed:
        started = time.monotonic()
        coll = self._coll() if self.ranks.distributed else None
        if coll is None:
            sequence = self.store.next_sequence()
        else:
            chosen = coll.broadcast(_attempt(self.store.next_sequence) if self.ranks.leader else None)
            if isinstance(chosen, str):
                raise StoreError(chosen)
            sequence = chosen
        entries: list[FileEntry] = []
        error: str | None = None
        own = True
        try:
            with self.store.parts(sequence) as target:
                entries = write(target, coll.commit if coll is not None else None)
        except Exception as exc:
            if coll is None:
                raise
            own = not isinstance(exc, OtherRankFailed)
            error = f"rank {self.ranks.rank}: {type(exc).__name__}: {exc}" if own else str(exc)
        if coll is None:
            return self._publish(sequence, entries, step, progress, started)
        parts = coll.gather((entries, error, own))
        # a rank's own failure is the one said, before the ranks that failed because of it
        errors = [e for _, e, first in sorted(parts, key=lambda p: not p[2]) if e]
        result: Committed | str | None = None
        if self.ranks.leader:
            every = [entry for files, _, _ in parts for entry in files]
            result = (
                errors[0]
                if errors
                else _attempt(lambda: self._publish(sequence, every, step, progress, started))
            )
        result = coll.broadcast(result)
        if isinstance(result, str):
            raise StoreError(f"checkpoint {sequence} not committed: {result}")
        assert isinstance(result, Committed)
        return result

    def _publish(
        self, sequence: int, entries: list[FileEntry], step: int, progress: float, started: float
    ) -> Committed:
        stopping = self._agreed_stop or self._stop.is_set()  # every second counts: no deleting now
        return self.store.publish(
            sequence, entries, step, progress, self.env.attempt, self.env.job_id, started, not stopping
        )

    def _commit(self, directory: Path, step: int, progress: float) -> Committed:
        committed = self.store.commit(
            Path(directory), step=step, progress=progress, attempt=self.env.attempt, job_id=self.env.job_id
        )
        self._done(committed)
        return committed

    def wait(self) -> None:
        """Wait for a background commit; raise what it raised."""
        if self._pending is not None:
            self._pending.join()
            self._pending = None
        if self._pending_error is not None:
            err, self._pending_error = self._pending_error, None
            raise err

    def _done(self, committed: Committed) -> None:
        self.last = committed
        self._save.clear()
        self._last_commit = time.monotonic()
        if self._agreed_stop or (not self.ranks.distributed and self._stop.is_set()):
            self._stop_committed = True
        rate = committed.throughput_bytes_per_second
        if not self.ranks.leader:
            return
        log.info(
            "committed checkpoint %s (%s %s, %d bytes, %.1f s)",
            committed.manifest.sequence,
            self.step_name,
            committed.manifest.step,
            committed.manifest.total_bytes,
            committed.seconds,
        )
        if rate > 0 and committed.manifest.total_bytes / rate > WARNING_SECONDS / 2:
            log.warning(
                "a checkpoint of this size takes %.0f s to commit: more than half of the %d s spot warning",
                committed.manifest.total_bytes / rate,
                WARNING_SECONDS,
            )


def _attempt(call: Callable[[], Any]) -> Any:
    """call()'s value, or its error in one line (to send to the other ranks instead of raising alone)."""
    try:
        return call()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
