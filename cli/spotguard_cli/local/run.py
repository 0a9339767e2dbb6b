"""`spotguard local run job.yaml` (or `-- python my_train.py`): your own job on the local stack, through
the real functions, the real agent and its wrapper, interrupted once and resumed, before you build an
image and deploy.

The job spec is the one `spotguard jobs submit` takes (cli/spotguard_cli/jobs/spec.py); its image is not
pulled: the command runs on this machine, in the directory you run from, each attempt in a container of
its own (`local/container.py`: the checkpoint directory fresh per attempt, `python` this checkout's).
Two simulated GPU spot instances; once the job runs, a spot warning for its instance at `--interrupt-at`
(seconds after it started, or once a checkpoint of a step is committed); SpotGuard drains, makes it
commit, resubmits it on the other instance from that checkpoint, and it runs to its end. Prints the
timeline, each attempt's output, and the proof; exit status 0 only when the proof holds.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from spotguard.domain.jobs.commands import CommandError
from spotguard.domain.jobs.model import TERMINAL
from spotguard_cli.arguments import number
from spotguard_cli.local.shared import STATE_DIR, first_step, first_step_line

INSTANCE_TYPES = {1: "g5.xlarge", 2: "g5.12xlarge", 3: "g5.12xlarge", 4: "g5.12xlarge"}  # else g5.48xlarge
DEFAULT_INTERRUPT_SECONDS = 10.0
SPEC_SUFFIXES = (".yaml", ".yml", ".json")
OUTPUT_LINES = 8  # of each attempt's output, printed beside the proof


def add_parser(actions: Any) -> None:
    r = actions.add_parser(
        "run", help="your own job on the local stack: interrupted, checkpointed, resumed, and proved so"
    )
    r.add_argument(
        "job",
        nargs="*",
        metavar="SPEC | -- CMD",
        help="a job spec, YAML or JSON (as for spotguard jobs submit), or -- and a command to run "
        "(e.g. -- python my_train.py)",
    )
    r.add_argument(
        "--checkpoint-dir",
        help="with -- CMD: the directory the script saves to (the agent's wrapper restores and commits it)",
    )
    r.add_argument(
        "--interrupt-at",
        help="when the spot warning comes: SECONDS after the job started running, or step:N, once a "
        f"checkpoint of step N or later is committed (default {DEFAULT_INTERRUPT_SECONDS:g} seconds)",
    )
    r.add_argument(
        "--timeout",
        type=number(1, 86400, unit="seconds"),
        default=600.0,
        help="the longest the job may take, start to end (default 600 seconds)",
    )
    r.add_argument("--json", action="store_true", help="print the timeline and the proof as JSON")
    r.set_defaults(run=run_local)


def _interrupt(text: str | None) -> tuple[str, float]:
    """("seconds", s) or ("step", n)."""
    if text is None:
        return "seconds", DEFAULT_INTERRUPT_SECONDS
    m = re.fullmatch(r"\s*step[:=]?\s*(\d{1,9})\s*", text)
    if m:
        return "step", float(m.group(1))
    m = re.fullmatch(r"\s*(\d{1,6}(?:\.\d+)?)\s*s?\s*", text)
    if m:
        return "seconds", float(m.group(1))
    raise CommandError(
        "BadRequest", f"--interrupt-at: SECONDS (e.g. 20) or step:N (e.g. step:40), not {text!r}"
    )


def job_of(args: argparse.Namespace) -> Any:
    """The job spec to run: the file, or one made of `-- CMD`."""
    from spotguard_cli.jobs.spec import load_spec

    given = list(args.job)
    if not given:
        raise CommandError("BadRequest", "give a job spec (job.yaml) or -- CMD (e.g. -- python my_train.py)")
    is_spec = len(given) == 1 and given[0].endswith(SPEC_SUFFIXES)
    spec_file, command = (given[0], []) if is_spec else ("", given)
    if spec_file:
        if args.checkpoint_dir:
            raise CommandError("BadRequest", "--checkpoint-dir: give checkpoint_dir in the spec")
        spec = load_spec(spec_file, {})
        if spec.image is None:
            raise CommandError("BadRequest", "task_definition: a local run needs image and command")
        return spec
    return load_spec(
        "",
        {
            "name": "local-run",
            "cluster": "gpu-spot",
            "image": "local",
            "command": command,
            "checkpoint_dir": args.checkpoint_dir,
        },
    )


class EndedEarly(RuntimeError):
    """The job ended before the warning: one line, and the last lines of its attempt's output."""

    def __init__(self, line: str, tail: list[str]) -> None:
        super().__init__(line)
        self.tail = tail


def _ended_early(system: Any, job_id: str, work: Path) -> EndedEarly:
    status = system.job_status(job_id)
    attempt = status.attempts[-1] if status.attempts else None
    log = work / f"task-{attempt.task_arn.rsplit('/', 1)[-1][:8]}.log" if attempt is not None else None
    text = log.read_text(errors="replace") if log is not None and log.exists() else ""
    tail = text.splitlines()[-OUTPUT_LINES:]
    if status.state == "succeeded":
        return EndedEarly("the job finished before the warning came: give an earlier --interrupt-at", tail)
    return EndedEarly(f"the job {status.state} before the warning came: {status.last_reason}", tail)


def run_local(args: argparse.Namespace) -> int:
    try:
        spec = job_of(args)
        when = _interrupt(args.interrupt_at)
        if when[0] == "step" and spec.checkpoint_dir:
            raise CommandError(
                "BadRequest",
                "--interrupt-at step:N: with checkpoint_dir the agent's wrapper commits the directory and "
                "does not know the script's training step; give SECONDS (e.g. --interrupt-at 20)",
            )
    except CommandError as exc:
        print(f"spotguard local run: {exc}", file=sys.stderr)
        return 2
    try:
        result = _run(spec, when, args.timeout, quiet=args.json)
    except RuntimeError as exc:  # the run did not happen as it should: said in a line
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"spotguard local run: {why}", file=sys.stderr)
        if isinstance(exc, EndedEarly) and exc.tail:  # what the script said last (a traceback, mostly)
            print("its last lines:", file=sys.stderr)
            for line in exc.tail:
                print(f"  | {line}", file=sys.stderr)
        if args.json:
            print(json.dumps({"ok": False, "error": why}))
        return 1
    if args.json:
        print(json.dumps(result))
    else:
        _print(result)
    return 0 if result["ok"] else 1


def _run(spec: Any, when: tuple[str, float], timeout: float, quiet: bool) -> dict[str, Any]:
    from spotguard_cli.emulator.motoserver import MotoServer
    from spotguard_cli.emulator.system import LocalSystem
    from spotguard_cli.emulator.timeline import Timeline, record_calls
    from spotguard_cli.jobs.spec import spec_payload

    say: Callable[..., None] = (lambda *_: None) if quiet else print
    work = STATE_DIR / "run"
    work.mkdir(parents=True, exist_ok=True)
    for old in work.glob("*.log"):
        old.unlink()
    # each rehearsal starts from nothing: the last one's containers (their checkpoint directories) go
    if (work / "containers").exists():
        shutil.rmtree(work / "containers")
        say(f"a fresh rehearsal: the last run's containers under {work / 'containers'} removed")
    timeline, calls = Timeline(), []
    job_id = spec.name or "local-run"
    started = time.monotonic()
    with MotoServer(log_path=str(work / "moto.log")) as moto:
        system = LocalSystem(moto.endpoint, work, on_change=timeline.add)
        try:
            record_calls(timeline, calls)
            kind = INSTANCE_TYPES.get(spec.gpus, "g5.48xlarge")
            a, b = system.add_host(kind, "us-east-1a"), system.add_host(kind, "us-east-1b")
            say(f"local stack on {moto.endpoint}: spot instances {a.instance_id} (1a), {b.instance_id} (1b)")
            system.pump()
            td = _task_definition(system, spec, work)
            answer = system.invoke_jobs(spec_payload(spec, td))
            if not answer.get("ok"):
                raise RuntimeError(
                    f"the jobs function refused the job: {(answer.get('error') or {}).get('message')}"
                )
            say(f"job {job_id} submitted; its output: {work}/task-*.log")

            def left() -> float:
                return max(1.0, timeout - (time.monotonic() - started))

            def running() -> bool:
                s = system.job_status(job_id)
                return bool(s.attempts and s.attempts[0].started_at) or s.state in TERMINAL

            if not system.run_until(running, timeout=left(), every=0.2):
                raise RuntimeError(f"the job did not start running within --timeout {timeout:g} s")
            first = system.job_status(job_id).attempts[0]
            if system.job_status(job_id).state in TERMINAL:
                raise _ended_early(system, job_id, work)
            run_since = time.monotonic()

            def warn_now() -> bool:
                s = system.job_status(job_id)
                if s.state in TERMINAL:
                    return True
                if when[0] == "seconds":
                    return time.monotonic() - run_since >= when[1]
                return any(c.step >= when[1] for c in s.checkpoints)

            if not system.run_until(warn_now, timeout=left(), every=0.2):
                raise RuntimeError(
                    f"the job reached no checkpoint of step {when[1]:g} in time (see its output)"
                )
            if system.job_status(job_id).state in TERMINAL:
                raise _ended_early(system, job_id, work)
            timeline.mark_zero()
            warned_at = system.clock.now()
            system.notice("spot-interruption", first.instance_id or a.instance_id)
            timeline.add(f"SPOT INTERRUPTION WARNING for {first.instance_id} put on the default bus")
            say(f"spot interruption warning sent for {first.instance_id}; waiting for the job to end ...")
            if not system.run_until(
                lambda: system.job_status(job_id).state in TERMINAL, timeout=left(), every=0.2
            ):
                raise RuntimeError(f"the job did not end within --timeout {timeout:g} s (see its output)")
            status = system.job_status(job_id)
            timeline.add(f"job {job_id} {status.state} after {len(status.attempts)} attempt(s)")
            return _result(system, status, warned_at, timeline, work, wrapped=bool(spec.checkpoint_dir))
        finally:
            system.close()


def _task_definition(system: Any, spec: Any, work: Path) -> str:
    """The spec's task definition as the local stack runs it: its command in a container of its own."""
    from spotguard_cli.jobs.spec import command_of, task_definition

    registered = task_definition(spec, system.stack.region)
    (container,) = registered["containerDefinitions"]
    local = [
        sys.executable,
        "-m",
        "spotguard_cli.local.container",
        "--root",
        str((work / "containers").resolve()),
    ]
    if spec.checkpoint_dir:
        local += ["--dir", spec.checkpoint_dir]
    container["command"] = [*local, "--", *(command_of(spec) or [])]
    container.pop("logConfiguration", None)  # the output stays in .local-stack/run/task-*.log
    registered["containerDefinitions"] = [container]
    for key in ("taskRoleArn", "executionRoleArn"):
        registered.pop(key, None)  # no IAM to assume here
    arn = system.cluster.ecs.register_task_definition(**registered)["taskDefinition"]["taskDefinitionArn"]
    return str(arn)


def _result(
    system: Any, status: Any, warned_at: datetime, timeline: Any, work: Path, wrapped: bool = True
) -> dict[str, Any]:
    attempts, checkpoints = status.attempts, status.checkpoints
    before_second = [
        c
        for c in checkpoints
        if len(attempts) > 1
        and c.created_at is not None
        and attempts[1].launched_at is not None
        and c.created_at <= attempts[1].launched_at
    ]
    newest = max(before_second, key=lambda c: c.sequence, default=None)
    warned_commit = [
        c for c in checkpoints if c.attempt == 1 and c.created_at is not None and c.created_at >= warned_at
    ]
    lost = (
        (attempts[0].stopped_at - newest.created_at).total_seconds()
        if newest is not None and newest.created_at and attempts[0].stopped_at
        else None
    )
    dead = system.dead_letters()
    proof = [
        ("the job succeeded", status.state == "succeeded"),
        (
            "interrupted once and resumed on the other instance (2 attempts)",
            len(attempts) == 2 and attempts[0].instance_id != attempts[1].instance_id,
        ),
        ("it committed a checkpoint when warned", bool(warned_commit)),
        (
            "the second attempt resumed from the newest committed checkpoint",
            newest is not None and attempts[1].resume_from == newest.manifest_uri,
        ),
        ("nothing in any dead-letter queue", not any(dead.values())),
        ("every AWS call allowed by its function's role", not system.guard.denied),
    ]
    starts = [_started_with(work, status.job_id, x.number) for x in attempts]
    if any(found is not None for found in starts):  # a checkpoint_dir: each container says what it found
        proof.append(
            (
                "each attempt's checkpoint directory held nothing but what SpotGuard restored",
                all(found == [] for found in starts),
            )
        )
    outputs = [_output(work, x.number, x.task_arn) for x in attempts]
    hint = None
    if status.state == "succeeded" and len(attempts) == 1 and not wrapped:
        # issue 45, item 18: "[ok] the job succeeded" beside "run FAILED", and nothing said why
        hint = (
            "the command exited 0 after SpotGuard's SIGTERM, so SpotGuard took the job as finished: a "
            "script that saves to a directory needs --checkpoint-dir DIR (the agent's wrapper then commits "
            "DIR and resumes it); one that uses the agent's library exits 75 once its checkpoint is committed"
        )
    return {
        "ok": all(p for _, p in proof),
        "hint": hint,
        "timeline": [{"seconds": round(t, 3), "what": w} for t, w in timeline.rows],
        "proof": [{"check": c, "passed": p} for c, p in proof],
        "facts": {
            "job_id": status.job_id,
            "state": status.state,
            "attempts": len(attempts),
            "resumed_from": attempts[1].resume_from if len(attempts) > 1 else None,
            "resumed_at_step": newest.step if newest is not None else None,
            "resumed_at": newest.step_label if newest is not None else None,  # step N | wrapper commit N
            "seconds_lost": lost,
            "dead_letters": dead,
        },
        "output": outputs,
    }


def _output(work: Path, number: int, task_arn: str) -> dict[str, Any]:
    """An attempt's output: its log, its last lines, and (the agent's library says it after a restore,
    issue 47) its container start to first training step, with the restore's share."""
    log = work / f"task-{task_arn.rsplit('/', 1)[-1][:8]}.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    first = first_step(text)
    return {
        "attempt": number,
        "log": str(log),
        "tail": text.splitlines()[-OUTPUT_LINES:],
        "first_step_seconds": first[0] if first else None,
        "restore_seconds": first[1] if first else None,
    }


def _started_with(work: Path, job_id: str, attempt: int) -> list[str] | None:
    """What the attempt's checkpoint directory held when its container started, before the agent restored
    anything (local/container.py); None without a checkpoint directory (or a record)."""
    from spotguard_cli.local.container import START_RECORD

    record = work / "containers" / f"{job_id}-attempt-{attempt}" / START_RECORD
    try:
        return list(json.loads(record.read_text())["found"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _print(result: dict[str, Any]) -> None:
    print("\ntimeline (seconds since the warning was put on the bus):")
    for row in result["timeline"]:
        print(f"  {row['seconds']:+8.3f}s  {row['what']}")
    for out in result["output"]:
        print(f"\nattempt {out['attempt']}'s output (last lines; all of it in {out['log']}):")
        for line in out["tail"]:
            print(f"  | {line}")
    facts = result["facts"]
    print("\nproof:")
    for p in result["proof"]:
        print(f"  [{'ok' if p['passed'] else 'FAILED'}] {p['check']}")
    for out in result["output"]:
        if out.get("first_step_seconds") is not None:
            print("\n" + first_step_line(out["attempt"], (out["first_step_seconds"], out["restore_seconds"])))
    if facts["resumed_from"]:
        lost = facts["seconds_lost"]
        ran_on = f"; the first attempt stopped {lost:.1f} s after its last commit" if lost is not None else ""
        print(f"\nresumed from {facts['resumed_from']} (its {facts['resumed_at']}){ran_on}")
    print(f"logs: {STATE_DIR / 'run'}/ (functions.log, task-*.log, moto.log)")
    if result.get("hint"):
        print(f"\nwhat is missing: {result['hint']}")
    print("moto server and every task process stopped.\n" + ("run passed" if result["ok"] else "run FAILED"))
