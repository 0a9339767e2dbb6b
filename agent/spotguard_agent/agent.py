"""The agent for training loops: restore at start, know when to save, save and commit.

    agent = Agent.from_env()                # SPOTGUARD_* from the task's environment
    restored = agent.restore(workdir)       # the newest committed checkpoint, or None for a fresh start
    for step in range(first, steps):
        ...one training step...
        if agent.should_save():             # SIGTERM, SIGUSR1, or the periodic interval
            write your state into a directory, then agent.commit(directory, step, progress)
        if agent.should_exit():             # after SIGTERM: the checkpoint is committed, resume me
            sys.exit(agent.exit_code)       # 75

Signals only set flags; the loop acts at its next safe point (between steps), so a checkpoint is always
of a whole step. `commit_async` uploads in a background thread so training goes on; the next commit,
`should_exit` and `close` wait for it.

When restore cannot go on safely it ends the process (RestoreFailed, a SystemExit: no traceback, one
line on stderr): exit 69 when a committed checkpoint exists but cannot be read now (S3 throttling, 5xx,
timeouts, a local I/O error: resuming later from it beats starting from scratch), exit 2 when
SPOTGUARD_RESUME_FROM or the restore target is refused. Neither is 75: nothing was committed.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

import boto3
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from spotguard_agent.imds import MetadataWatcher
from spotguard_agent.manifest import Manifest
from spotguard_agent.store import CheckpointStore, CheckpointUnavailable, Committed, StoreError

log = logging.getLogger("spotguard.agent")

RESUME_ME = 75  # exit code: stopped after committing a checkpoint, resume me
CANNOT_RESTORE_NOW = 69  # exit code (EX_UNAVAILABLE): a committed checkpoint cannot be read now
REFUSED = 2  # exit code: SPOTGUARD_* settings or the restore target refused (as for bad command lines)
MIN_INTERVAL_SECONDS = 60.0
WARNING_SECONDS = 120  # a spot warning's notice: a checkpoint should commit within it


class AgentEnv(BaseModel):
    """The task's environment as SpotGuard sets it (docs/container-contract.md), validated."""

    model_config = ConfigDict(frozen=True)
    job_id: str = Field(default="local", alias="SPOTGUARD_JOB_ID")
    attempt: int = Field(default=0, alias="SPOTGUARD_ATTEMPT", ge=0)
    checkpoint_uri: str = Field(alias="SPOTGUARD_CHECKPOINT_URI")
    resume_from: str = Field(default="", alias="SPOTGUARD_RESUME_FROM")
    interval_seconds: float = Field(default=1800.0, alias="SPOTGUARD_CHECKPOINT_INTERVAL_SECONDS", gt=0)
    keep: int = Field(default=3, alias="SPOTGUARD_KEEP_CHECKPOINTS", ge=1)
    # Expected interruptions per hour in this pool (SpotGuard's history): turns on the adaptive interval.
    interruptions_per_hour: float = Field(default=0.0, alias="SPOTGUARD_INTERRUPTIONS_PER_HOUR", ge=0)
    watch_metadata: bool = Field(default=True, alias="SPOTGUARD_WATCH_METADATA")
    # Local runs only (`spotguard local demo --scenario capacity`, `spotguard local replay`): the time
    # manifests carry reads `clock_at` (Unix seconds; default `clock_origin`) at the wall clock's
    # `clock_origin` and runs `clock_scale` times faster from there, as the functions' clock does there.
    # Unset on AWS: the wall clock.
    clock_origin: float | None = Field(default=None, alias="SPOTGUARD_CLOCK_ORIGIN", ge=0)
    clock_at: float | None = Field(default=None, alias="SPOTGUARD_CLOCK_AT", ge=0)
    clock_scale: float = Field(default=1.0, alias="SPOTGUARD_CLOCK_SCALE", gt=0, le=100_000)

    def clock(self) -> datetime:
        now = datetime.now(UTC)
        if self.clock_origin is None:
            return now
        origin = datetime.fromtimestamp(self.clock_origin, UTC)
        at = origin if self.clock_at is None else datetime.fromtimestamp(self.clock_at, UTC)
        return at + (now - origin) * self.clock_scale

    @classmethod
    def load(cls, environ: Mapping[str, str] | None = None) -> AgentEnv:
        env = os.environ if environ is None else environ
        try:
            return cls.model_validate({k: v for k, v in env.items() if k.startswith("SPOTGUARD_")})
        except ValidationError as exc:
            err = exc.errors()[0]
            raise StoreError(f"bad environment: {'.'.join(map(str, err['loc']))}: {err['msg']}") from None


class RestoreFailed(SystemExit):
    """Restore cannot go on safely: uncaught, it ends the process with `code` and no traceback. Its
    one-line reason (`reason`) has already been written to stderr."""

    def __init__(self, reason: str, code: int) -> None:
        super().__init__(code)
        self.reason = reason

    def __str__(self) -> str:
        return self.reason


class Agent:
    def __init__(self, env: AgentEnv, store: CheckpointStore, install_signals: bool = True) -> None:
        self.env = env
        self.store = store
        self.exit_code = RESUME_ME
        self._stop = threading.Event()  # SIGTERM: checkpoint, then exit 75
        self._save = threading.Event()  # SIGUSR1: checkpoint and go on
        self._last_commit = time.monotonic()
        self._pending: threading.Thread | None = None
        self._pending_error: BaseException | None = None
        self.last: Committed | None = None
        self.cost_seconds: float | None = None  # what the last checkpoint cost the training loop
        self.watcher: MetadataWatcher | None = None
        # what a manifest's `step` counts, as the logs name it: the training loop's step; under
        # `spotguard-agent run`, the wrapper's commits of the directory (it knows no step of the job)
        self.step_name = "step"
        if install_signals:
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGUSR1, self._on_signal)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, client: Any = None) -> Agent:
        env = AgentEnv.load(environ)
        s3 = client or boto3.client("s3", config=_retrying())
        agent = cls(env, CheckpointStore(s3, env.checkpoint_uri, keep=env.keep, clock=env.clock))
        if env.watch_metadata and os.environ.get("AWS_EC2_METADATA_DISABLED", "").lower() != "true":
            agent.watcher = MetadataWatcher(
                on_stop=lambda why: (log.warning("%s: checkpoint and stop", why), agent.request_stop()),
                on_rebalance=lambda why: (log.info("%s: checkpoint", why), agent.request_checkpoint()),
            ).start()
        return agent

    # --------------------------------------------------------------------------------------- signals
    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGTERM:
            # stopping: a checkpoint request that comes late (a move decided while the task was already
            # being stopped) must not end the process mid-exit with SIGUSR1's default action (exit 138)
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        (self._stop if signum == signal.SIGTERM else self._save).set()

    def request_stop(self) -> None:
        """What SIGTERM does (for the instance-metadata watcher and for tests)."""
        self._stop.set()

    def request_checkpoint(self) -> None:
        """What SIGUSR1 does."""
        self._save.set()

    # ----------------------------------------------------------------------------------------- state
    def restore(self, into: Path) -> Manifest | None:
        """The newest committed checkpoint of this job (or SPOTGUARD_RESUME_FROM's), verified, in `into`;
        None for a fresh start. Raises RestoreFailed (exit 69 or 2) rather than start fresh over a
        checkpoint that cannot be read now, or restore what it was not asked to."""
        # Another job's manifest is passed over only when SPOTGUARD_JOB_ID is set (and the manifest names
        # a job): without it the agent cannot tell.
        job_id = self.env.job_id if "job_id" in self.env.model_fields_set else ""
        try:
            manifest = self.store.restore(Path(into), self.env.resume_from or None, job_id=job_id)
        except StoreError as exc:
            code = CANNOT_RESTORE_NOW if isinstance(exc, CheckpointUnavailable) else REFUSED
            print(f"spotguard-agent: {exc}", file=sys.stderr, flush=True)
            raise RestoreFailed(str(exc), code) from exc
        if manifest is not None:
            log.info("restored checkpoint %s (%s %s)", manifest.sequence, self.step_name, manifest.step)
        self._last_commit = time.monotonic()
        return manifest

    def interval(self) -> float:
        """Seconds between periodic checkpoints. With an interruption rate and a measured checkpoint
        cost C, the Young/Daly optimum sqrt(2 C M) for a mean time M between interruptions (at least a
        minute, at most the configured interval); else the configured interval."""
        rate, cost = self.env.interruptions_per_hour, self.cost_seconds
        if rate <= 0 or cost is None:
            return self.env.interval_seconds
        optimum = math.sqrt(2.0 * max(cost, 0.001) * 3600.0 / rate)
        return min(self.env.interval_seconds, max(MIN_INTERVAL_SECONDS, optimum))

    def note_cost(self, seconds: float) -> None:
        """What the last checkpoint cost the loop (the stall of an async save, all of a sync one)."""
        self.cost_seconds = max(0.0, seconds)

    def should_save(self) -> bool:
        interval_due = time.monotonic() - self._last_commit >= self.interval()
        return self._stop.is_set() or self._save.is_set() or interval_due

    @property
    def stopping(self) -> bool:
        """True once SIGTERM (or a notice the agent watched for) asked the process to stop."""
        return self._stop.is_set()

    def should_exit(self) -> bool:
        """True after SIGTERM once the checkpoint is committed: exit with `exit_code` (75)."""
        if not self._stop.is_set():
            return False
        self.wait()
        return self.last is not None

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

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.close()
        self.wait()

    def _done(self, committed: Committed) -> None:
        self.last = committed
        self._save.clear()
        self._last_commit = time.monotonic()
        rate = committed.throughput_bytes_per_second
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


def _retrying() -> Any:
    from botocore.config import Config

    return Config(retries={"mode": "standard", "max_attempts": 6}, max_pool_connections=16)
