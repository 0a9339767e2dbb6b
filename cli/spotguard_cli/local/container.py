"""A task's container on the local stack, for `spotguard local run`: what a container gives a job on ECS
that a local process does not have, given before the job's command runs in its place (exec: the same
process, so SpotGuard's signals reach the command, or the agent's wrapper, directly).

- A file system of its own: the job's checkpoint directory (an absolute path in the container, e.g.
  /opt/checkpoints) becomes a fresh directory for each attempt under `--root`, so the second attempt finds
  nothing the first left there (as on a new instance) and only what SpotGuard restores.
- The image's programs: `python` and `python3` are this checkout's Python (with torch and the agent),
  `spotguard-agent` its agent, and its environment's programs (torchrun) come first on the PATH.

    python -m spotguard_cli.local.container --root ROOT [--dir /opt/checkpoints] -- COMMAND ...

Each container writes what its checkpoint directory held when it started, before the job's command (and
the agent's restore) ran, to START_RECORD in its root: local run proves from it that attempt 1 started
from nothing but what SpotGuard gave it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from spotguard_cli.arguments import checkpoint_directory

START_RECORD = ".spotguard-start.json"  # in the attempt's root: {"directory": ..., "found": [files]}

PROGRAMS = {
    "python": [sys.executable],
    "python3": [sys.executable],
    "spotguard-agent": [sys.executable, "-m", "spotguard_agent.wrapper"],
}


def container_command(command: Sequence[str], root: Path, directory: str | None) -> list[str]:
    """The command as this container runs it: its programs found, its checkpoint directory under root."""
    if not command:
        raise ValueError("no command to run")
    out = [*PROGRAMS.get(command[0], [command[0]]), *command[1:]]
    if directory:
        directory = checkpoint_directory(directory)  # normalised; never the root (it would match all)
        local = str(root / directory.lstrip("/"))
        inside = re.compile(re.escape(directory) + r"(?=/|$)")
        out = [inside.sub(lambda _: local, arg) for arg in out]  # the path taken as it is, no escapes
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="spotguard_cli.local.container")
    p.add_argument("--root", required=True, type=Path, help="where each attempt's file system goes")
    p.add_argument("--dir", help="the job's checkpoint directory in the container")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    # each attempt its own file system: the job and attempt SpotGuard's RunTask gave the task
    job, attempt = os.environ.get("SPOTGUARD_JOB_ID", "job"), os.environ.get("SPOTGUARD_ATTEMPT", os.getpid())
    name = f"{job}-attempt-{attempt}"
    root = args.root.resolve() / name
    if args.dir:
        args.dir = checkpoint_directory(args.dir)
        inside = root / args.dir.lstrip("/")
        found = sorted(p.relative_to(inside).as_posix() for p in inside.rglob("*")) if inside.is_dir() else []
        inside.mkdir(parents=True, exist_ok=True)
        (root / START_RECORD).write_text(json.dumps({"directory": args.dir, "found": found}))
    run = container_command(command, root, args.dir)
    # the image's PATH: this checkout's environment first (torchrun, spotguard-agent, python)
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    sys.stdout.flush()
    os.execvp(run[0], run)
    return 127  # not reached: exec replaces this process


if __name__ == "__main__":
    raise SystemExit(main())
