"""The agent's side of stopping and saving: SIGTERM and SIGUSR1, the wrapper's requests through the
control directory (spotguard_agent.ranks.ControlDir), the decision to save at a step boundary
(`should_save`, one for every rank), the stop budget the stop checkpoint must fit in, and the outcome
told back to the wrapper (a mixin of spotguard_agent.agent.Agent, whose __init__ sets its state)."""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from spotguard_agent.manifest import Manifest
from spotguard_agent.ranks import ControlDir, Ranks
from spotguard_agent.store import Committed

if TYPE_CHECKING:
    from spotguard_agent.agent import AgentEnv
    from spotguard_agent.ranks import Collective

log = logging.getLogger("spotguard.agent")

MIN_INTERVAL_SECONDS = 60.0
# A stop checkpoint is started only when the measured commit, times this, fits in the time left.
FIT_MARGIN = 1.25
_NEVER = 1e18  # "no deadline" in the ranks' agreement (a MAX over negated seconds left)


class Signals:
    """Agent's signals, requests, save decisions and stop budget."""

    env: AgentEnv
    ranks: Ranks
    control: ControlDir | None
    exit_code: int
    step_name: str
    restored: Manifest | None
    restore_seconds: float | None
    first_step_seconds: float | None
    last: Committed | None
    snapshot_seconds: float
    cost_seconds: float | None
    _stop: threading.Event
    _save: threading.Event
    _stop_since: float | None
    _deadline: float | None
    _agreed_stop: bool
    _kept: bool
    _stop_committed: bool
    _outcome_written: bool
    _last_commit: float

    if TYPE_CHECKING:

        def _coll(self) -> Collective: ...

        def wait(self) -> None: ...

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
        self._first_step_done()
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

    def _first_step_done(self) -> None:
        """At the end of the first step after a restore (the first should_save), say once how long the
        process took from its start to there, and the restore's share: what a job waits after each
        interruption before it trains again (`spotguard local run` prints it for each attempt)."""
        if self.first_step_seconds is not None or self.restored is None:
            return
        self.first_step_seconds = max(0.0, time.time() - process_started())
        if self.ranks.leader:
            print(
                f"spotguard-agent: first step after the restore: {self.first_step_seconds:.2f} s from the "
                f"process's start (restore {self.restore_seconds or 0.0:.2f} s)",
                file=sys.stderr,
                flush=True,
            )

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


def process_started() -> float:
    """This process's start, in Unix seconds: from /proc (Linux: its age since it began, to 10 ms);
    elsewhere, when this module was loaded."""
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # starttime: field 22, clock ticks since boot
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return _LOADED


_LOADED = time.time()


def signal_safe_ignore_usr1() -> None:
    """Stopping: a late SIGUSR1 must not end the process with its default action (from the main thread
    only, where Python lets a handler be set)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
