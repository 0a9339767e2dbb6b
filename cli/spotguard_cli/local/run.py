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

A multi-node spec (`nodes: N`, up to LOCAL_MAX_NODES) gets N instances in each of two zones (two pools:
the gang is relaunched in the one the warning did not hit, as SpotGuard avoids the pool it lost a node
in), its rendezvous on 127.0.0.1 (a free port when the spec names none), and the warning, once all N
nodes run together, for the instance of its last node; the proof adds that every attempt ran its N nodes
together. What it cannot rehearse is refused at once, in one line.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spotguard.domain.jobs.commands import CommandError
from spotguard.domain.jobs.model import TERMINAL
from spotguard_cli.arguments import number
from spotguard_cli.local.gang_nodes import free_port
from spotguard_cli.local.run_proof import OUTPUT_LINES, formed, print_result, proved
from spotguard_cli.local.shared import STATE_DIR, add_spot_hosts

INSTANCE_TYPES = {1: "g5.xlarge", 2: "g5.12xlarge", 3: "g5.12xlarge", 4: "g5.12xlarge"}  # else g5.48xlarge
DEFAULT_INTERRUPT_SECONDS = 10.0
SPEC_SUFFIXES = (".yaml", ".yml", ".json")
LOCAL_MAX_NODES = 4  # of a multi-node spec: every node's command runs on this machine


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
        _gang_refusal(spec)
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
        print_result(result)
    return 0 if result["ok"] else 1


def _gang_refusal(spec: Any) -> None:
    """CommandError, in one line, for a multi-node spec this machine cannot rehearse."""
    if spec.nodes > LOCAL_MAX_NODES:
        raise CommandError(
            "BadRequest",
            f"nodes: {spec.nodes}: a local run rehearses at most {LOCAL_MAX_NODES} nodes (every node's "
            "command runs on this machine); rehearse the same spec with fewer nodes",
        )
    port = spec.rendezvous_port
    if spec.nodes > 1 and port is not None and free_port(port) != port:
        raise CommandError(
            "BadRequest",
            f"rendezvous_port: {port} is in use on this machine, where node 0 of the rehearsal listens on "
            "it: give a free port in the spec (or none: local run then picks one)",
        )


def _add_hosts(system: Any, spec: Any, say: Callable[..., None]) -> Any:
    """The spot instances: one in each of two zones, or for a gang N in each (a pool with room for the
    gang, and one for its relaunch); the first."""
    hosts, names = add_spot_hosts(system, INSTANCE_TYPES.get(spec.gpus, "g5.48xlarge"), spec.nodes)
    say(f"local stack on {system.stack.endpoint}: spot instances {names}")
    return hosts[0]


def _run(spec: Any, when: tuple[str, float], timeout: float, quiet: bool) -> dict[str, Any]:
    from spotguard_cli.emulator.motoserver import MotoServer
    from spotguard_cli.emulator.system import LocalSystem
    from spotguard_cli.emulator.timeline import Timeline, record_calls

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
            a = _submit(system, spec, work, say)
            say(f"job {job_id} submitted; its output: {work}/task-*.log")

            def left() -> float:
                return max(1.0, timeout - (time.monotonic() - started))

            def running() -> bool:
                s = system.job_status(job_id)
                return bool(s.attempts and formed(s.attempts[0], spec.nodes)) or s.state in TERMINAL

            if not system.run_until(running, timeout=left(), every=0.2):
                raise RuntimeError(_not_started(system.job_status(job_id), spec.nodes, timeout))
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
            first = system.job_status(job_id).attempts[0]
            node = first.tasks[-1]  # a gang's last node: not the one hosting the rendezvous
            warned = node.instance_id or a.instance_id
            whose = f" (node {node.node} of {spec.nodes})" if spec.nodes > 1 else ""
            system.notice("spot-interruption", warned)
            timeline.add(f"SPOT INTERRUPTION WARNING for {warned}{whose} put on the default bus")
            say(f"spot interruption warning sent for {warned}{whose}; waiting for the job to end ...")
            if not system.run_until(
                lambda: system.job_status(job_id).state in TERMINAL, timeout=left(), every=0.2
            ):
                raise RuntimeError(f"the job did not end within --timeout {timeout:g} s (see its output)")
            status = system.job_status(job_id)
            timeline.add(f"job {job_id} {status.state} after {len(status.attempts)} attempt(s)")
            return proved(
                system, status, (warned_at, warned), timeline, work, spec.nodes, bool(spec.checkpoint_dir)
            )
        finally:
            system.close()


def _submit(system: Any, spec: Any, work: Path, say: Callable[..., None]) -> Any:
    """The instances added, the spec's task definition registered and the job submitted; the first
    instance."""
    from spotguard_cli.jobs.spec import spec_payload

    a = _add_hosts(system, spec, say)
    system.pump()
    td = _task_definition(system, spec, work)
    payload = spec_payload(spec, td)
    if spec.nodes > 1:
        port = payload.setdefault("options", {}).setdefault("rendezvous_port", free_port())
        say(f"{spec.nodes} nodes; node 0 hosts the rendezvous at 127.0.0.1:{port} (all are here)")
    answer = system.invoke_jobs(payload)
    if not answer.get("ok"):
        raise RuntimeError(f"the jobs function refused the job: {(answer.get('error') or {}).get('message')}")
    return a


def _not_started(status: Any, nodes: int, timeout: float) -> str:
    """Why the wait for the job to run ended, in a line."""
    if nodes == 1 or not status.attempts:
        return f"the job did not start running within --timeout {timeout:g} s"
    running = sum(1 for t in status.attempts[-1].tasks if t.started_at and not t.stopped)
    return (
        f"the job's {nodes} nodes did not run together within --timeout {timeout:g} s ({running} of "
        f"{nodes} running in its attempt {status.attempts[-1].number}; see .local-stack/run/functions.log)"
    )


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
