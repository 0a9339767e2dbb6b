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

In a job of several processes (torchrun: RANK, WORLD_SIZE, LOCAL_RANK; the job initialises
torch.distributed first) the same calls in every rank make one checkpoint: should_save and should_exit
are one decision for all ranks, taken at the step boundary (one small all_reduce MAX over the agent's own
gloo group), so one rank's SIGTERM, SIGUSR1 or instance-metadata notice is every rank's; `torch_state.save`
writes each rank's part (torch.distributed.checkpoint) and rank 0 writes the one manifest once every
rank's files are durable (`commit_parts`); restore gives every rank the same checkpoint. Under
`spotguard-agent run -- torchrun ...` the wrapper's requests arrive through SPOTGUARD_CONTROL_DIR
(spotguard_agent.ranks).

After SIGTERM the checkpoint must commit within the stop budget (SPOTGUARD_STOP_TIMEOUT_SECONDS from the
signal, or sooner when the spot notice says the instance goes sooner). When the commits measured so far
say the new one cannot make it and a committed checkpoint exists, the agent says so in one line, does not
start it, and exits 75 on the last committed one (a commit cut by SIGKILL would save nothing).

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
from spotguard_agent.manifest import FileEntry, Manifest
from spotguard_agent.ranks import Collective, ControlDir, Ranks
from spotguard_agent.store import (
    CheckpointStore,
    CheckpointUnavailable,
    Committed,
    OtherRankFailed,
    Parts,
    StoreError,
    transfer_for,
)

log = logging.getLogger("spotguard.agent")

RESUME_ME = 75  # exit code: stopped after committing a checkpoint, resume me
CANNOT_RESTORE_NOW = 69  # exit code (EX_UNAVAILABLE): a committed checkpoint cannot be read now
REFUSED = 2  # exit code: SPOTGUARD_* settings or the restore target refused (as for bad command lines)
MIN_INTERVAL_SECONDS = 60.0
WARNING_SECONDS = 120  # a spot warning's notice: a checkpoint should commit within it
# A stop checkpoint is started only when the measured commit, times this, fits in the time left.
FIT_MARGIN = 1.25
_NEVER = 1e18  # "no deadline" in the ranks' agreement (a MAX over negated seconds left)


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
    # The container's stopTimeout: ECS sends SIGKILL this long after SIGTERM, so the stop checkpoint must
    # commit within it (a spot notice that says the instance goes sooner shortens it).
    stop_timeout_seconds: float = Field(default=120.0, alias="SPOTGUARD_STOP_TIMEOUT_SECONDS", gt=0)
    # Threads writing (and hashing) one process's part of a torch_state checkpoint; 0: up to 8, the
    # machine's cores shared among the processes on it (LOCAL_WORLD_SIZE).
    write_threads: int = Field(default=0, alias="SPOTGUARD_WRITE_THREADS", ge=0, le=256)
    # S3 requests one process keeps in flight (16 MiB parts, uploads and restores); 0: 64 a machine
    # shared among its processes, at least 8 each (store.transfer_for).
    s3_concurrency: int = Field(default=0, alias="SPOTGUARD_S3_CONCURRENCY", ge=0, le=256)
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


class NotUnderSpotGuard(SystemExit):
    """The agent was made outside a SpotGuard task (SPOTGUARD_CHECKPOINT_URI unset: a script run by hand).
    Uncaught, it ends the process with exit 2 and one line on stderr saying how to run the script alone."""

    HOW = (
        "spotguard-agent: SPOTGUARD_CHECKPOINT_URI is not set (SpotGuard sets it for each attempt of a job); "
        "to run this script alone, name a directory for its checkpoints: "
        "SPOTGUARD_CHECKPOINT_URI=file:///tmp/my-checkpoints/ python SCRIPT"
    )

    def __init__(self) -> None:
        super().__init__(2)
        print(self.HOW, file=sys.stderr)

    def __str__(self) -> str:
        return self.HOW


class Agent:
    def __init__(
        self,
        env: AgentEnv,
        store: CheckpointStore,
        install_signals: bool = True,
        ranks: Ranks | None = None,
        control: ControlDir | None = None,
    ) -> None:
        self.env = env
        self.store = store
        self.exit_code = RESUME_ME
        self.ranks = ranks if ranks is not None else Ranks.from_env()
        self.control = control
        if control is not None:
            try:  # the wrapper waits for this process's stop checkpoint from now on
                control.announce(self.ranks.rank)
            except OSError as exc:  # it then forwards a stop as a signal: the job still stops
                log.warning("could not tell the wrapper this process uses the agent (%s)", exc)
        self._collective: Collective | None = None
        self._stop_since: float | None = None  # time.monotonic() when this process first heard "stop"
        self._deadline: float | None = None  # Unix time the stop checkpoint must be committed by
        self._agreed_stop = False  # every rank knows (distributed: agreed at a step boundary)
        self._kept = False  # the stop checkpoint would not fit: stop on the last committed one
        self._stop_committed = False  # a checkpoint begun after the stop was agreed is committed
        self._outcome_written = False
        self.restored: Manifest | None = None
        self.snapshot_seconds = 0.0  # the last snapshot's stall (torch_state), part of a commit's cost
        self.host_buffers: Any = None  # torch_state's reused host buffers (pinned on a GPU machine)
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
        self.install_signals = install_signals
        if install_signals:
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGUSR1, self._on_signal)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, client: Any = None) -> Agent:
        if not (os.environ if environ is None else environ).get("SPOTGUARD_CHECKPOINT_URI", "").strip():
            raise NotUnderSpotGuard()
        env = AgentEnv.load(environ)
        try:
            ranks = Ranks.from_env(environ)
        except ValueError as exc:
            raise StoreError(f"bad environment: {exc}") from None
        transfer = transfer_for(env.s3_concurrency, ranks.local_world)
        s3 = client or boto3.client("s3", config=_retrying(transfer.max_concurrency))
        store = CheckpointStore(s3, env.checkpoint_uri, keep=env.keep, clock=env.clock, transfer=transfer)
        control = ControlDir.from_env(environ)
        agent = cls(env, store, ranks=ranks, control=control)
        # The instance metadata is watched once a machine: by the wrapper when there is one (its requests
        # come through the control directory), else by each machine's first local rank.
        watch = env.watch_metadata and control is None and ranks.local_rank == 0
        if watch and os.environ.get("AWS_EC2_METADATA_DISABLED", "").lower() != "true":
            watcher = MetadataWatcher(on_stop=lambda why: None, on_rebalance=lambda why: None)

            def on_stop(why: str) -> None:
                log.warning("%s: checkpoint and stop", why)
                agent.request_stop(deadline=watcher.action_time)

            watcher.on_stop = on_stop
            watcher.on_rebalance = lambda why: (log.info("%s: checkpoint", why), agent.request_checkpoint())
            agent.watcher = watcher.start()
        return agent

    # --------------------------------------------------------------------------------------- signals
    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGTERM:
            # stopping: a checkpoint request that comes late (a move decided while the task was already
            # being stopped) must not end the process mid-exit with SIGUSR1's default action (exit 138)
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)
            self.request_stop()
        else:
            self._save.set()

    def request_stop(self, deadline: float | None = None) -> None:
        """What SIGTERM does (for the instance-metadata watcher and for tests). `deadline`: the Unix time
        the instance goes, when known (a spot notice's), which may shorten the stop budget."""
        if self._stop_since is None:
            self._stop_since = time.monotonic()
        if deadline is not None:
            self._deadline = deadline if self._deadline is None else min(self._deadline, deadline)
        self._stop.set()

    def request_checkpoint(self) -> None:
        """What SIGUSR1 does."""
        self._save.set()

    # ----------------------------------------------------------------------------------------- state
    def restore(self, into: Path) -> Manifest | None:
        """The newest committed checkpoint of this job (or SPOTGUARD_RESUME_FROM's), verified, in `into`;
        None for a fresh start. Raises RestoreFailed (exit 69 or 2) rather than start fresh over a
        checkpoint that cannot be read now, or restore what it was not asked to.

        In a job of several ranks every rank calls it: rank 0 chooses the checkpoint (with the fall-backs
        below), and the same one is put in every rank's `into` (once for the ranks that name the same
        directory on the same machine); when any rank cannot, every rank raises the same RestoreFailed."""
        if self.ranks.distributed:
            manifest = self._restore_ranks(Path(into))
        else:
            outcome = self._restore_here(Path(into), self.env.resume_from or None)
            if isinstance(outcome, tuple):
                raise RestoreFailed(*outcome)
            manifest = outcome
        if manifest is not None and self.ranks.leader:
            log.info("restored checkpoint %s (%s %s)", manifest.sequence, self.step_name, manifest.step)
        self.restored = manifest
        self._last_commit = time.monotonic()
        return manifest

    def _restore_here(self, into: Path, resume_from: str | None) -> Manifest | tuple[str, int] | None:
        """This process's restore: the manifest, None, or (why, exit code) with the line on stderr."""
        # Another job's manifest is passed over only when SPOTGUARD_JOB_ID is set (and the manifest names
        # a job): without it the agent cannot tell.
        job_id = self.env.job_id if "job_id" in self.env.model_fields_set else ""
        try:
            return self.store.restore(into, resume_from, job_id=job_id)
        except StoreError as exc:
            code = CANNOT_RESTORE_NOW if isinstance(exc, CheckpointUnavailable) else REFUSED
            print(f"spotguard-agent: {exc}", file=sys.stderr, flush=True)
            return (str(exc), code)

    def _restore_ranks(self, into: Path) -> Manifest | None:
        import socket

        coll = self._coll()
        place = (socket.gethostname(), str(into.resolve()))
        places = coll.gather(place, commit=False)
        chosen = self._restore_here(into, self.env.resume_from or None) if self.ranks.leader else None
        chosen = coll.broadcast(chosen, commit=False)
        if isinstance(chosen, tuple):
            raise RestoreFailed(*chosen)
        mine: Manifest | tuple[str, int] | None = chosen
        if chosen is not None and not self.ranks.leader and places.index(place) == self.ranks.rank:
            # the first rank at this place (machine, directory) restores the very checkpoint rank 0 chose
            mine = self._restore_here(into, self.store.manifest_uri(chosen.sequence))
            if isinstance(mine, Manifest) and mine.sequence != chosen.sequence:
                why = f"rank {self.ranks.rank} could not restore checkpoint {chosen.sequence}"
                print(f"spotguard-agent: {why}", file=sys.stderr, flush=True)
                mine = (why, CANNOT_RESTORE_NOW)
        failures = [m for m in coll.gather(mine, commit=False) if isinstance(m, tuple)]
        if failures:
            raise RestoreFailed(*failures[0])
        return chosen

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
        """Checkpoint now? SIGTERM, SIGUSR1, the instance metadata, the wrapper's requests or the
        interval; in a job of several ranks, one answer for all of them (call it in every rank at every
        step boundary). After a stop, False when the checkpoint cannot commit within the stop budget."""
        self._poll_control()
        if self._kept:
            return False
        stop, save = self._stop.is_set(), self._save.is_set()
        due = time.monotonic() - self._last_commit >= self.interval()
        estimate = self.commit_estimate() or 0.0
        left = self.budget_left() if stop else _NEVER
        if self.ranks.distributed:
            s, v, d, neg_left, estimate = self._coll().max([stop, save, due, -left, estimate])
            stop, save, due, left = s > 0, v > 0, d > 0, -neg_left
            if stop and not self._stop.is_set():
                signal_safe_ignore_usr1()
                self.request_stop()
            if save:
                self._save.clear()  # this request is answered by this checkpoint, in every rank
                if self.control is not None:  # ... and so is one a slower rank has not read yet
                    self.control.consume_checkpoint_requests()
        if stop:
            self._agreed_stop = True
            if estimate and estimate * FIT_MARGIN > left and self._committed_step() is not None:
                self._keep_last(estimate, left)
                return False
        return stop or save or due

    def _keep_last(self, estimate: float, left: float) -> None:
        self._kept = True
        if self.ranks.leader:
            sequence, step = self._committed_step() or (None, None)
            log.warning(
                "a new checkpoint would take about %.1f s to commit and %.1f s are left to stop in: not "
                "starting it; stopping on committed checkpoint %s (%s %s)",
                estimate,
                max(0.0, left),
                sequence,
                self.step_name,
                step,
            )

    def _committed_step(self) -> tuple[int, int] | None:
        last = self.last.manifest if self.last is not None else self.restored
        return (last.sequence, last.step) if last is not None else None

    def budget_left(self) -> float:
        """Seconds left to commit the stop checkpoint in: the stop timeout from when the stop was heard,
        or less when the instance is known to go sooner."""
        since = self._stop_since if self._stop_since is not None else time.monotonic()
        left = self.env.stop_timeout_seconds - (time.monotonic() - since)
        if self._deadline is not None:
            left = min(left, self._deadline - time.time())
        return left

    def commit_estimate(self) -> float | None:
        """What the next checkpoint should take, from the last one this process committed (its snapshot
        and its commit); None before the first."""
        if self.last is None:
            return None
        return self.snapshot_seconds + self.last.seconds

    def _poll_control(self) -> None:
        if self.control is None:
            return
        if not self._stop.is_set():
            request = self.control.stop_request()
            if request is not None:
                deadline = request.get("deadline")
                signal_safe_ignore_usr1()
                self.request_stop(deadline=float(deadline) if isinstance(deadline, int | float) else None)
        if self.control.new_checkpoint_request() and not self._stop.is_set():
            self._save.set()

    @property
    def stopping(self) -> bool:
        """True once SIGTERM (or a notice the agent watched for) asked the process to stop."""
        return self._stop.is_set()

    @property
    def stop_agreed(self) -> bool:
        """True once should_save has taken the stop (in a job of several ranks: in every rank at the same
        step boundary, so a condition on it is the same in every rank, as `stopping` is not)."""
        return self._agreed_stop

    def should_exit(self) -> bool:
        """True after SIGTERM once the checkpoint is committed (or, when it could not fit, once the last
        committed one is kept): exit with `exit_code` (75). In a job of several ranks, after the stop
        was agreed at a step boundary and the checkpoint begun after it is committed, in every rank."""
        if not self._stop.is_set():
            return False
        if self.ranks.distributed and not self._agreed_stop:
            return False  # heard here only: every rank learns it at the next should_save
        self.wait()
        if self._kept:
            done = True
        elif self.ranks.distributed:
            done = self._stop_committed
        else:
            done = self.last is not None
        if done:
            self._report_outcome()
        return done

    def _report_outcome(self) -> None:
        """Tell the wrapper (SPOTGUARD_CONTROL_DIR) that the job stops on a committed checkpoint. Each
        machine's first local rank tells its own: in a job of several nodes every node has a wrapper
        (its container's first process) that must exit 75, not only rank 0's. The outcome is the same
        in every rank (the stop agreed at one step boundary, the checkpoint's result broadcast)."""
        if self.control is None or self._outcome_written or self.ranks.local_rank != 0:
            return
        committed = self._committed_step()
        sequence, step = committed if committed is not None else (None, None)
        why = "kept the last committed checkpoint" if self._kept else "committed the stop checkpoint"
        try:
            self.control.write_outcome(self.exit_code, sequence, step, why)
            self._outcome_written = True
        except OSError as exc:
            log.warning("could not tell the wrapper the outcome (%s)", exc)

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

    def _coll(self) -> Collective:
        if self._collective is None:
            self._collective = Collective()
        return self._collective

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
        """The training is done: stop watching, wait for the commit in flight. From here a late SIGUSR1
        (a move SpotGuard decided as the job finished) is ignored: Python's exit puts SIGUSR1 back to its
        default action, which would end a job that succeeded with exit 138, a failure; an ignored signal
        it leaves ignored."""
        if self.install_signals:
            signal_safe_ignore_usr1()
        if self.watcher is not None:
            self.watcher.close()
        self.wait()

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


def _retrying(concurrency: int) -> Any:
    """botocore's standard retries, and a connection for every request in flight (and a few more for the
    manifests and listings beside them)."""
    from botocore.config import Config

    return Config(retries={"mode": "standard", "max_attempts": 6}, max_pool_connections=concurrency + 8)


def _attempt(call: Callable[[], Any]) -> Any:
    """call()'s value, or its error in one line (to send to the other ranks instead of raising alone)."""
    try:
        return call()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def signal_safe_ignore_usr1() -> None:
    """Stopping: a late SIGUSR1 must not end the process with its default action (from the main thread
    only, where Python lets a handler be set)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
