"""`spotguard-agent run --dir DIR -- CMD ...`: SpotGuard for a job whose code cannot change;
`spotguard-agent run -- CMD ...` (no --dir): the first process of a job whose processes use the agent
themselves, such as `torchrun` and its ranks (see `Relay`, in spotguard_agent.relay).

With --dir:

1. restores DIR from the newest committed checkpoint (or SPOTGUARD_RESUME_FROM) before CMD starts; when
   that cannot go on safely it exits (69: a committed checkpoint cannot be read now; 2: a refused
   SPOTGUARD_RESUME_FROM or DIR) with one line on stderr, and CMD does not run;
2. runs CMD, forwarding SIGTERM, SIGINT and SIGUSR1 to it;
3. commits DIR as a new checkpoint whenever CMD has written a new one into it (a change that has then
   stayed still for --quiet-seconds, so a file being written is never committed half-done). A CMD that
   saves so often that DIR never stays still that long (every 2 s) still gets its saves committed: once
   DIR has kept changing for 5 times --quiet-seconds, the wrapper copies it aside and commits the copy
   when DIR did not change while it was copied and no file was written just before (the last consistent
   moment), and says so once; when no such moment comes it says that, once, too;
4. when CMD exits, commits DIR if it changed since the last commit; after a SIGTERM that commit is the
   checkpoint SpotGuard resumes from, and the wrapper exits 75 (a CMD that saves and exits 0 on SIGTERM
   stopped, it did not finish). But a CMD that had exited 0 before the SIGTERM could reach it finished:
   it exits 0 and is never run again. Otherwise CMD's own exit code passes through.

The manifest's step counts the wrapper's commits (the restored one's step + 1 each time), and the logs
call it so ("committed checkpoint 4 (wrapper commit 5, ...)"); its progress is read from --progress-file when
CMD writes one (a number from 0 to 1), else 0.

Without --dir the wrapper is the relay of spotguard_agent.relay (see its doc).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from spotguard_agent.agent import RESUME_ME, Agent, RestoreFailed
from spotguard_agent.relay import Relay
from spotguard_agent.store_errors import StoreError

log = logging.getLogger("spotguard.agent")
STEP_NAME = "wrapper commit"  # the manifest's step in the logs: the wrapper's commits, not the job's steps
# A directory that has kept changing for BUSY_QUIETS times --quiet-seconds (10 s by default) without
# holding still that long (a script that saves every few seconds) is committed from a consistent copy
# (Wrapper._commit_copy): one no file of which was written in the SETTLE_SECONDS (at most a quarter of
# --quiet-seconds) before it began, nor while it was taken.
BUSY_QUIETS = 5
SETTLE_SECONDS = 0.5

Snapshot = dict[str, tuple[int, int]]


def snapshot(directory: Path) -> Snapshot:
    """What is in the directory now: relative path -> (size, mtime)."""
    out: Snapshot = {}
    if directory.is_dir():
        for p in directory.rglob("*"):
            if p.is_file() and not p.is_symlink():
                st = p.stat()
                out[p.relative_to(directory).as_posix()] = (st.st_size, st.st_mtime_ns)
    return out


class Wrapper:
    def __init__(
        self,
        agent: Agent,
        directory: Path,
        command: Sequence[str],
        poll_seconds: float = 2.0,
        quiet_seconds: float = 2.0,
        progress_file: Path | None = None,
    ) -> None:
        self.agent = agent
        self.directory = directory
        self.command = list(command)
        self.poll = poll_seconds
        self.quiet = quiet_seconds
        self.progress_file = progress_file
        self.busy = BUSY_QUIETS * quiet_seconds
        self.settle = min(SETTLE_SECONDS, quiet_seconds / 4)
        self.step = 0
        self.committed: Snapshot = {}
        self.stopping = threading.Event()
        self.term_reached_command = False  # SIGTERM was passed on to CMD while it ran
        self.lock = threading.Lock()  # one commit at a time
        self.child: subprocess.Popen[bytes] | None = None

    def _progress(self) -> float:
        if self.progress_file is None:
            return 0.0
        try:
            return min(1.0, max(0.0, float(self.progress_file.read_text().strip())))
        except (OSError, ValueError):
            return 0.0

    def _commit_if_changed(self) -> bool:
        with self.lock:
            now = snapshot(self.directory)
            if not now or now == self.committed:
                return False
            self.step += 1
            self.agent.commit(self.directory, self.step, self._progress())
            self.committed = now
            return True

    def _commit_copy(self) -> bool:
        """Commit a copy of DIR taken at a consistent moment: nothing in DIR changed while it was copied,
        and no file had been written in the `settle` seconds before. False when DIR has not changed since
        the last commit or the copy was not consistent (tried again at the next poll)."""
        with self.lock:
            before = snapshot(self.directory)
            newest = max((mtime for _, mtime in before.values()), default=0)
            if not before or before == self.committed or time.time_ns() - newest < self.settle * 1e9:
                return False
            staging = Path(tempfile.mkdtemp(prefix="spotguard-copy-"))
            try:
                for rel in before:
                    target = staging / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(self.directory / rel, target)
                if snapshot(self.directory) != before or snapshot(staging).keys() != before.keys():
                    return False  # written to while copied: not a consistent moment
                self.step += 1
                self.agent.commit(staging, self.step, self._progress())
                self.committed = before
                return True
            except OSError:  # a file removed or replaced while copied: not a consistent moment either
                return False
            finally:
                shutil.rmtree(staging, ignore_errors=True)

    def _forward(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGTERM:
            self.stopping.set()
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)
            if signum == signal.SIGTERM:
                self.term_reached_command = True

    def _watch(self) -> None:
        last, still_since = snapshot(self.directory), time.monotonic()
        busy_since: float | None = None  # DIR uncommitted and changing since
        said_busy = said_stuck = False
        while self.child is not None and self.child.poll() is None:
            time.sleep(self.poll)
            now = snapshot(self.directory)
            if now != last:
                last, still_since = now, time.monotonic()
                busy_since = busy_since if busy_since is not None else time.monotonic()
            try:
                if now != self.committed and time.monotonic() - still_since >= self.quiet:
                    self._commit_if_changed()
                    busy_since = None
                elif busy_since is not None and time.monotonic() - busy_since >= self.busy:
                    if self._commit_copy():
                        busy_since = time.monotonic() if snapshot(self.directory) != self.committed else None
                        if not said_busy:
                            said_busy = True
                            log.info(
                                "%s never stays still for %gs (the command saves often): committing a "
                                "consistent copy of it as the command goes on",
                                self.directory,
                                self.quiet,
                            )
                    elif not said_stuck and time.monotonic() - busy_since >= 3 * self.busy:
                        said_stuck = True
                        log.warning(
                            "%s has been written to for %.0fs without a moment still enough to copy it: "
                            "nothing committed since; the command's exit commits what it leaves",
                            self.directory,
                            time.monotonic() - busy_since,
                        )
            except Exception as exc:  # the job goes on; the next change or the exit tries again
                log.warning("commit failed: %s", exc)

    def run(self) -> int:
        self.agent.step_name = STEP_NAME
        self.agent.store.counts = "commits"  # the manifests say their step is no training step
        restored = self.agent.restore(self.directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        if restored is not None:
            self.step = restored.step
        self.committed = snapshot(self.directory)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(sig, self._forward)
        if self.agent.watcher is not None:  # what the instance metadata says becomes the same signals
            self.agent.watcher.on_stop = lambda why: self._forward(signal.SIGTERM, None)
            self.agent.watcher.on_rebalance = lambda why: self._forward(signal.SIGUSR1, None)
        self.child = subprocess.Popen(self.command)
        watcher = threading.Thread(target=self._watch, name="spotguard-watch", daemon=True)
        watcher.start()
        code = self.child.wait()
        watcher.join()
        self.agent.close()
        changed = self._commit_if_changed()
        return self._exit_code(code, changed or self.agent.last is not None or restored is not None)

    def _exit_code(self, code: int, has_checkpoint: bool) -> int:
        """What the wrapper exits with once CMD exited `code`: 75 when SpotGuard's SIGTERM stopped it
        (whatever CMD exited with: a script that saves and exits 0 on SIGTERM has not finished), CMD's
        own code otherwise, and 0 when CMD had finished (exited 0) before the SIGTERM reached it."""
        if not self.stopping.is_set() or (code == 0 and not self.term_reached_command):
            return code
        if not has_checkpoint:
            log.warning("stopped before any checkpoint was written: the job restarts from scratch")
        return RESUME_ME


def _stop_timeout() -> float:
    value = os.environ.get("SPOTGUARD_STOP_TIMEOUT_SECONDS", "").strip()
    try:
        seconds = float(value) if value else 120.0
    except ValueError:
        raise StoreError(
            f"bad environment: SPOTGUARD_STOP_TIMEOUT_SECONDS={value!r} is not a number"
        ) from None
    if not seconds > 0:
        raise StoreError("bad environment: SPOTGUARD_STOP_TIMEOUT_SECONDS must be > 0")
    return seconds


def configure_logging() -> None:
    """The agent's own lines on stderr (`spotguard-agent: ...`), from INFO; any other library's only
    from WARNING (boto's 'Found credentials in environment variables.' is no news at every start)."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("spotguard-agent: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    logging.getLogger("spotguard.agent").setLevel(logging.INFO)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="spotguard-agent", description="SpotGuard's container agent")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="run CMD, restoring and committing DIR as checkpoints; without --dir, relay SpotGuard's "
        "signals to CMD's processes that use the agent (torchrun)",
    )
    run.add_argument("--dir", type=Path, help="the directory CMD keeps its checkpoint in")
    run.add_argument("--poll-seconds", type=float, default=2.0)
    run.add_argument("--quiet-seconds", type=float, default=2.0, help="a change must stay still this long")
    run.add_argument("--progress-file", type=Path, help="a file where CMD writes its progress (0..1)")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("give the command after --")
    if args.poll_seconds <= 0 or args.quiet_seconds < 0:
        parser.error("--poll-seconds must be > 0 and --quiet-seconds >= 0")
    configure_logging()
    if args.dir is None:
        try:
            relay = Relay(cmd, _stop_timeout(), _watch_metadata())
        except StoreError as exc:
            print(f"spotguard-agent: {exc}", file=sys.stderr)
            return 2
        try:
            return relay.run()
        except FileNotFoundError as exc:
            print(f"spotguard-agent: cannot run {cmd[0]!r}: {exc.strerror}", file=sys.stderr)
            return 127
    try:
        agent = Agent.from_env()
    except StoreError as exc:
        print(f"spotguard-agent: {exc}", file=sys.stderr)
        return 2
    wrapper = Wrapper(agent, args.dir, cmd, args.poll_seconds, args.quiet_seconds, args.progress_file)
    try:
        return wrapper.run()
    except RestoreFailed as exc:  # its one line is on stderr already
        return int(exc.code or 1)
    except FileNotFoundError as exc:
        print(f"spotguard-agent: cannot run {cmd[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127


def _watch_metadata() -> bool:
    return os.environ.get("SPOTGUARD_WATCH_METADATA", "true").strip().lower() not in (
        "false",
        "0",
        "no",
        "off",
    )


if __name__ == "__main__":
    sys.exit(main())
