"""A task's container on the local stack, for `spotguard local run`: what a container gives a job on ECS
that a local process does not have, given before the job's command runs in its place (exec: the same
process, so SpotGuard's signals reach the command, or the agent's wrapper, directly).

- A file system of its own: the job's checkpoint directory (an absolute path in the container, e.g.
  /opt/checkpoints) is a fresh directory for each attempt under `--root`, so the second attempt finds
  nothing the first left there (as on a new instance) and only what SpotGuard restores. As root on Linux
  (`private_view`), the process gets a mount namespace of its own with that directory bound at the
  checkpoint directory's path: a script that hard-codes /opt/checkpoints writes to its attempt's
  directory, never to the machine's /opt/checkpoints (the bind's mount point is made there if missing, an
  empty directory). Where no namespace can be had, the path is rewritten in the command line instead, and
  a command (the part after the agent's `--`) that does not name it is refused in one line: it would write
  to the machine's own directory, shared by every attempt and rehearsal.
- The image's programs: `python` and `python3` are this checkout's Python (with torch and the agent),
  `spotguard-agent` its agent, and its environment's programs (torchrun) come first on the PATH.

    python -m spotguard_cli.local.container --root ROOT [--dir /opt/checkpoints] -- COMMAND ...

Each container writes what its checkpoint directory held when it started, before the job's command (and
the agent's restore) ran, to START_RECORD in its root: local run proves from it that attempt 1 started
from nothing but what SpotGuard gave it.
"""

from __future__ import annotations

import argparse
import ctypes
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


# Linux's unshare(2) and mount(2) flags (sched.h, sys/mount.h)
CLONE_NEWNS = 0x00020000
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18


def private_view(inside: Path, directory: str) -> bool:
    """Give this process a mount namespace of its own in which `directory` is `inside` (a bind mount,
    private: nothing of it reaches the machine's own mounts). False where that cannot be had (not root,
    not Linux, no namespace allowed): nothing changed then but, at most, the namespace."""
    if sys.platform != "linux" or os.geteuid() != 0:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS) != 0:
        return False
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return False
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError:
        return False
    return libc.mount(os.fsencode(inside), os.fsencode(directory), None, MS_BIND, None) == 0


def user_command(command: Sequence[str]) -> list[str]:
    """The user's own command: the part after the agent's `--` when the agent's wrapper runs it."""
    if command and command[0] == "spotguard-agent" and "--" in command:
        return list(command[command.index("--") + 1 :])
    return list(command)


def container_command(
    command: Sequence[str], root: Path, directory: str | None, isolated: bool = False
) -> list[str]:
    """The command as this container runs it: its programs found, and, unless the process has a private
    view of it (`isolated`), its checkpoint directory rewritten to the attempt's under root. ValueError
    for a command that does not name the directory when it must be rewritten: it would write to the
    machine's own."""
    if not command:
        raise ValueError("no command to run")
    out = [*PROGRAMS.get(command[0], [command[0]]), *command[1:]]
    if directory and isolated:
        return out
    if directory:
        directory = checkpoint_directory(directory)  # normalised; never the root (it would match all)
        inside = re.compile(re.escape(directory) + r"(?=/|$)")
        if not any(inside.search(arg) for arg in user_command(command)):
            raise ValueError(
                f"checkpoint_dir {directory}: the command does not name it, and this machine cannot give "
                "each attempt a private view of it (a mount namespace needs root on Linux): pass the "
                f"directory in the command (e.g. --ckpt-dir {directory}), or run as root"
            )
        local = str(root / directory.lstrip("/"))
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
    if os.environ.get("SPOTGUARD_NODES", "1") != "1":  # a gang's nodes are all on this machine
        name += f"-node-{os.environ.get('SPOTGUARD_NODE_RANK', '0')}"
    root = args.root.resolve() / name
    if args.dir:
        args.dir = checkpoint_directory(args.dir)
        inside = root / args.dir.lstrip("/")
        found = sorted(p.relative_to(inside).as_posix() for p in inside.rglob("*")) if inside.is_dir() else []
        inside.mkdir(parents=True, exist_ok=True)
        (root / START_RECORD).write_text(json.dumps({"directory": args.dir, "found": found}))
    isolated = bool(args.dir) and private_view(root / args.dir.lstrip("/"), args.dir)
    try:
        run = container_command(command, root, args.dir, isolated)
    except ValueError as exc:
        print(f"spotguard local run: {exc}", file=sys.stderr)
        return 2
    # the image's PATH: this checkout's environment first (torchrun, spotguard-agent, python)
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    sys.stdout.flush()
    os.execvp(run[0], run)
    return 127  # not reached: exec replaces this process


if __name__ == "__main__":
    raise SystemExit(main())
