"""The agent for training loops: restore at start, know when to save, save and commit.

    agent = Agent.from_env()                # SPOTGUARD_* from the task's environment
    state = torch_state.restore(agent)      # the newest committed checkpoint's state, None: a fresh start
    # (or agent.restore(workdir): its files, downloaded and verified into a directory)
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
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from spotguard_agent.commits import Commits
from spotguard_agent.imds import MetadataWatcher
from spotguard_agent.manifest import Manifest
from spotguard_agent.ranks import Collective, ControlDir, Ranks
from spotguard_agent.restores import Restores
from spotguard_agent.signals import Signals, signal_safe_ignore_usr1
from spotguard_agent.store import CheckpointStore, Committed
from spotguard_agent.store_errors import CheckpointUnavailable, StoreError
from spotguard_agent.store_s3 import transfer_for

log = logging.getLogger("spotguard.agent")

RESUME_ME = 75  # exit code: stopped after committing a checkpoint, resume me
CANNOT_RESTORE_NOW = 69  # exit code (EX_UNAVAILABLE): a committed checkpoint cannot be read now
REFUSED = 2  # exit code: SPOTGUARD_* settings or the restore target refused (as for bad command lines)


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
    # shared among its processes, at least 8 each (store_s3.transfer_for).
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


class Agent(Signals, Commits, Restores):
    """Restore, know when to save, save and commit (see the module's doc): the state is set here; the
    signals and the stop budget are spotguard_agent.signals', the commits spotguard_agent.commits'."""

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
        self.restore_counts: Any = None  # what torch_state.restore read (dcp_reader.ReadCounts)
        self.restore_seconds: float | None = None  # how long the last restore took
        # from the process's start to the end of the first step after a restore (said once, FirstStep)
        self.first_step_seconds: float | None = None
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

    # ----------------------------------------------------------------------------------------- state
    def restore(self, into: Path) -> Manifest | None:
        """The newest committed checkpoint of this job (or SPOTGUARD_RESUME_FROM's), verified, in `into`;
        None for a fresh start. Raises RestoreFailed (exit 69 or 2) rather than start fresh over a
        checkpoint that cannot be read now, or restore what it was not asked to.

        In a job of several ranks every rank calls it: rank 0 chooses the checkpoint (with the fall-backs
        below), and the same one is put in every rank's `into` (once for the ranks that name the same
        directory on the same machine); when any rank cannot, every rank raises the same RestoreFailed."""
        began = time.monotonic()
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
        self.restore_seconds = self._last_commit - began
        return manifest

    def _restore_here(self, into: Path, resume_from: str | None) -> Manifest | tuple[str, int] | None:
        """This process's restore: the manifest, None, or (why, exit code) with the line on stderr."""
        # Another job's manifest is passed over only when SPOTGUARD_JOB_ID is set (and the manifest names
        # a job): without it the agent cannot tell.
        job_id = self.env.job_id if "job_id" in self.env.model_fields_set else ""
        try:
            return self.store.restore(into, resume_from, job_id=job_id)
        except StoreError as exc:
            return self._refused(exc)

    def _refused(self, exc: StoreError) -> tuple[str, int]:
        """(why, exit code) of a restore that cannot go on, said on stderr in one line."""
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

    def _coll(self) -> Collective:
        if self._collective is None:
            self._collective = Collective()
        return self._collective

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


def _retrying(concurrency: int) -> Any:
    """botocore's standard retries, and a connection for every request in flight (and a few more for the
    manifests and listings beside them)."""
    from botocore.config import Config

    return Config(retries={"mode": "standard", "max_attempts": 6}, max_pool_connections=concurrency + 8)
