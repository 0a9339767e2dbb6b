"""`spotguard-agent run --dir DIR -- CMD ...`: SpotGuard for a job whose code cannot change.

1. restores DIR from the newest committed checkpoint (or SPOTGUARD_RESUME_FROM) before CMD starts; when
   that cannot go on safely it exits (69: a committed checkpoint cannot be read now; 2: a refused
   SPOTGUARD_RESUME_FROM or DIR) with one line on stderr, and CMD does not run;
2. runs CMD, forwarding SIGTERM, SIGINT and SIGUSR1 to it;
3. commits DIR as a new checkpoint whenever CMD has written a new one into it (a change that has then
   stayed still for --quiet-seconds, so a file being written is never committed half-done);
4. when CMD exits, commits DIR if it changed since the last commit; after a SIGTERM that commit is the
   checkpoint SpotGuard resumes from, and the wrapper exits 75. Otherwise CMD's own exit code passes
   through.

The manifest's step counts the wrapper's commits (the restored one's step + 1 each time), and the logs
call it so ("committed checkpoint 4 (wrapper commit 5, ...)"); its progress is read from --progress-file when
CMD writes one (a number from 0 to 1), else 0.
"""

from __future__ import annotations

import argparse
import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from spotguard_agent.agent import RESUME_ME, Agent, RestoreFailed
from spotguard_agent.store import StoreError

log = logging.getLogger("spotguard.agent")
STEP_NAME = "wrapper commit"  # the manifest's step in the logs: the wrapper's commits, not the job's steps

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
        self.step = 0
        self.committed: Snapshot = {}
        self.stopping = threading.Event()
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

    def _forward(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGTERM:
            self.stopping.set()
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)

    def _watch(self) -> None:
        last, still_since = snapshot(self.directory), time.monotonic()
        while self.child is not None and self.child.poll() is None:
            time.sleep(self.poll)
            now = snapshot(self.directory)
            if now != last:
                last, still_since = now, time.monotonic()
            elif now != self.committed and time.monotonic() - still_since >= self.quiet:
                try:
                    self._commit_if_changed()
                except Exception as exc:  # the job goes on; the next change or the exit tries again
                    log.warning("commit failed: %s", exc)

    def run(self) -> int:
        self.agent.step_name = STEP_NAME
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
        if self.stopping.is_set():
            if not (changed or self.agent.last is not None or restored is not None):
                log.warning("stopped before any checkpoint was written: the job restarts from scratch")
            return RESUME_ME
        return code


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
    run = sub.add_parser("run", help="run CMD, restoring and committing DIR as checkpoints")
    run.add_argument("--dir", required=True, type=Path, help="the directory CMD keeps its checkpoint in")
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


if __name__ == "__main__":
    sys.exit(main())
