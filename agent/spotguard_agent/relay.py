"""`spotguard-agent run -- CMD ...` (no --dir): the relay, the first process of a job whose processes use
the agent themselves, such as `torchrun` and its ranks.

Without --dir (relay): ECS signals only the container's first process. torchrun, as the first process,
turns SIGTERM into a shutdown of its workers (SIGKILL --shutdown-timeout later, 30 s by default), does
not pass SIGUSR1 on, and exits 1 whatever its workers exited with. So the wrapper keeps the signals:
1. CMD runs with SPOTGUARD_CONTROL_DIR naming a directory of the wrapper's; every process that uses the
   agent reads it at each step boundary (spotguard_agent.ranks.ControlDir);
2. SIGTERM (or a spot notice in the instance metadata) writes a stop request there, with its deadline
   (now + SPOTGUARD_STOP_TIMEOUT_SECONDS, or the notice's time): every rank checkpoints at the next step
   boundary and exits 75; CMD gets nothing, so torchrun cannot cut the commit. Only if CMD is still
   running 5 s after the deadline does the wrapper send it SIGTERM (where no SIGKILL comes). When no
   process has made its agent yet, nothing would read the request and there is nothing to checkpoint
   (a node of a multi-node job waiting for the others at torchrun's rendezvous, a job still starting):
   CMD gets SIGTERM at once, so it stops in seconds rather than at SIGKILL;
3. SIGUSR1 (or a rebalance recommendation) writes a checkpoint request: every rank checkpoints and goes
   on; SIGINT goes to CMD;
4. when CMD exits, the wrapper exits 75 if the agent in CMD reported that it stopped on a committed
   checkpoint (whoever asked for the stop: SpotGuard, or the notice the wrapper saw itself), else with
   CMD's exit code.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from spotguard_agent.agent import RESUME_ME
from spotguard_agent.imds import MetadataWatcher
from spotguard_agent.ranks import CONTROL_DIR_ENV, ControlDir

log = logging.getLogger("spotguard.agent")
# Relay: seconds past the stop deadline before CMD, still running, gets SIGTERM itself (on ECS SIGKILL
# has come by then; run elsewhere, a CMD that does not use the agent stops so)
FORWARD_GRACE = 5.0


class Relay:
    """The first process of a job whose processes use the agent (see the module's doc, "Without --dir")."""

    def __init__(self, command: Sequence[str], stop_timeout: float, watch_metadata: bool) -> None:
        self.command = list(command)
        self.stop_timeout = stop_timeout
        self.watch_metadata = watch_metadata
        self.control: ControlDir | None = None
        self.child: subprocess.Popen[bytes] | None = None
        self.deadline: float | None = None  # Unix time: the stop checkpoint's, once asked to stop
        self.forwarded = False  # CMD got SIGTERM from the wrapper
        self.watcher: MetadataWatcher | None = None

    def _stop(self, why: str, deadline: float | None = None) -> None:
        if self.control is None:
            return
        end = time.time() + self.stop_timeout
        end = end if deadline is None else min(end, deadline)
        if self.deadline is not None and end >= self.deadline:
            return
        self.deadline = end
        self.control.request_stop(end, why)
        if self.control.started():
            log.info("%s: every process checkpoints at its next step and stops", why)
            return
        # checked after the request is written: a process that announces itself from now on reads it
        log.info("%s: no process uses the agent yet, nothing to checkpoint: SIGTERM to the command", why)
        self._terminate()

    def _terminate(self) -> None:
        """SIGTERM to CMD, once."""
        if not self.forwarded and self.child is not None and self.child.poll() is None:
            self.forwarded = True
            self.child.send_signal(signal.SIGTERM)

    def _rebalance(self, why: str) -> None:
        if self.control is not None and self.deadline is None:
            self.control.request_checkpoint(why)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGTERM:
            self._stop("SIGTERM")
        elif signum == signal.SIGUSR1:
            self._rebalance("SIGUSR1")
        elif self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)

    def run(self) -> int:
        path = Path(tempfile.mkdtemp(prefix="spotguard-control-"))
        self.control = ControlDir(path)
        try:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
                signal.signal(sig, self._on_signal)
            if self.watch_metadata and os.environ.get("AWS_EC2_METADATA_DISABLED", "").lower() != "true":
                watcher = MetadataWatcher(on_stop=lambda why: None, on_rebalance=lambda why: None)
                watcher.on_stop = lambda why: self._stop(why, watcher.action_time)
                watcher.on_rebalance = lambda why: (
                    self.control.request_checkpoint(why) if self.control else None
                )
                self.watcher = watcher.start()
            self.child = subprocess.Popen(self.command, env={**os.environ, CONTROL_DIR_ENV: str(path)})
            code = self._wait(self.child)
            if self.watcher is not None:
                self.watcher.close()
            outcome = self.control.outcome()
            if outcome is not None and outcome.get("exit") == RESUME_ME:
                log.info(
                    "stopped on committed checkpoint %s (step %s; %s): exit %d",
                    outcome.get("sequence"),
                    outcome.get("step"),
                    outcome.get("why"),
                    RESUME_ME,
                )
                return RESUME_ME
            if self.deadline is not None:
                log.warning("asked to stop, but no process reported a committed checkpoint: exit %d", code)
            return code
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def _wait(self, child: subprocess.Popen[bytes]) -> int:
        while True:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = child.wait(timeout=0.2)
                return code if code >= 0 else 128 - code
            late = self.deadline is not None and time.time() > self.deadline + FORWARD_GRACE
            if late and not self.forwarded:
                log.warning("the stop deadline has passed and the command still runs: SIGTERM to it")
                self._terminate()
