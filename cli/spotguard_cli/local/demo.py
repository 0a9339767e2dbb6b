"""`spotguard local demo`: the scenario's arguments, and the interruption scenario.

interruption (default): two simulated GPU spot instances, a managed job running examples/train.py
(small, CPU) with the agent, a spot interruption warning for the job's instance: SpotGuard drains,
checkpoints, resubmits on the other instance from the checkpoint, and the job finishes. Prints a
timeline and the proof (steps lost, final weights equal to an uninterrupted run, what spot saves); exit
status 0 only when the proof holds.
capacity: a deadline job moved between spot pools, on-demand and back by the capacity policy
(capacity.py).
gang: a job of 2 nodes trained as one, one node's instance warned, the whole gang checkpointed and
relaunched once (gang.py).
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from spotguard.domain.jobs.model import TERMINAL
from spotguard.domain.jobs.spend import Spend
from spotguard.domain.prices import PAPER_ON_DEMAND_PRICE, PAPER_SPOT_PRICE, on_demand_price
from spotguard_cli.answers import StatusView, read_answer
from spotguard_cli.arguments import number, whole
from spotguard_cli.emulator.timeline import Timeline
from spotguard_cli.local import capacity_demo, gang
from spotguard_cli.local.shared import (
    STATE_DIR,
    first_step,
    first_step_line,
    passed,
    picture,
    print_end,
    print_json,
    print_proof,
    print_timeline,
    reference_run,
    same_weights,
    steps_done,
    task_definition,
)

MAX_STEPS = 100_000
INTERRUPT_AT = 25  # the interruption scenario's default warning step
TIME_SCALE = 60.0  # the capacity scenario's default clock
CAPACITY_MIN_STEPS = 10  # the capacity scenario warns at a fifth of the steps and again a fifth later


def add_parser(actions: Any) -> None:
    d = actions.add_parser("demo", help="a training job interrupted, checkpointed, resumed and finished")
    d.add_argument(
        "--scenario",
        choices=["interruption", "capacity", "gang"],
        default="interruption",
        help="interruption (default): one warning, resumed on the other instance; capacity: a deadline "
        "job moved between spot pools, on-demand and back by the capacity policy; gang: a job of 2 "
        "nodes, one node's instance warned, the whole gang checkpointed and relaunched once",
    )
    d.add_argument("--steps", type=whole(1, MAX_STEPS), help="training steps (default 60; capacity: 300)")
    d.add_argument(
        "--step-seconds",
        type=number(0, 60, unit="seconds"),
        help="pause per step (default 0.1; capacity: 0.4)",
    )
    d.add_argument(
        "--interrupt-at",
        type=_step,
        metavar="step:N",
        help=f"interruption, gang: warn when training step N is reached (default step:{INTERRUPT_AT}; steps "
        "count from 0; a bare N is a step too). `local run` takes step:N as well, and SECONDS",
    )
    d.add_argument(
        "--time-scale",
        type=number(0, 100_000, low_open=True),
        help=f"capacity: SpotGuard's clock runs this many times faster than the wall clock "
        f"(default {TIME_SCALE:g})",
    )
    d.add_argument("--json", action="store_true", help="print the timeline and the proof as JSON")
    d.set_defaults(run=run_demo)


def demo_arguments(args: argparse.Namespace) -> str | None:
    """Fill in the scenario's defaults, and say in one line what cannot work (None: everything can), so
    that an impossible demo is refused at once rather than after minutes."""
    if args.scenario in ("interruption", "gang"):
        if args.time_scale is not None:
            return "argument --time-scale: is for --scenario capacity"
        args.steps = args.steps or 60
        args.step_seconds = 0.1 if args.step_seconds is None else args.step_seconds
        given = args.interrupt_at is not None
        args.interrupt_at = args.interrupt_at if given else INTERRUPT_AT
        if args.steps < 2:
            return (
                "argument --steps: the warning needs a step before it and one after: "
                f"at least 2, not {args.steps}"
            )
        last = args.steps - 2  # a step must follow the warning's, or the job has nothing left to resume
        if args.interrupt_at > last:
            default = "" if given else f" (the default; give --interrupt-at 0 to {last})"
            return (
                f"argument --interrupt-at: the job's steps are 0 to {args.steps - 1} (--steps {args.steps}) "
                f"and one must follow the warning: a step from 0 to {last}, not {args.interrupt_at}{default}"
            )
        return None
    if args.interrupt_at is not None:
        return (
            "argument --interrupt-at: is for --scenario interruption or gang (capacity warns at fifths "
            "of --steps)"
        )
    args.steps = args.steps or 300
    args.step_seconds = 0.4 if args.step_seconds is None else args.step_seconds
    args.time_scale = TIME_SCALE if args.time_scale is None else args.time_scale
    if args.steps < CAPACITY_MIN_STEPS:
        return (
            f"argument --steps: the capacity scenario warns at a fifth of the steps and again a fifth later: "
            f"at least {CAPACITY_MIN_STEPS}, not {args.steps}"
        )
    return None


def _step(text: str) -> int:
    """`step:N` (or a bare N: a step, in the demo) -> N; the same words as `local run --interrupt-at`."""
    bare = text.strip().removeprefix("step:").removeprefix("step=").strip()
    return int(whole(0, MAX_STEPS)(bare))


def run_demo(args: argparse.Namespace) -> int:
    problem = demo_arguments(args)
    if problem is not None:
        print(f"spotguard local demo: {problem}", file=sys.stderr)
        return 2
    try:
        return _run_demo(args)
    except RuntimeError as exc:  # the story did not happen as it should (each case says why, in a line)
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"spotguard local demo: {why}", file=sys.stderr)
        if args.json:
            print(json.dumps({"ok": False, "error": why}))
        else:
            print("moto server and every task process stopped.\ndemo FAILED")
        return 1


def _run_demo(args: argparse.Namespace) -> int:
    from spotguard_cli.emulator.motoserver import MotoServer
    from spotguard_cli.emulator.system import LocalSystem
    from spotguard_cli.emulator.timeline import record_calls

    say = (lambda *_: None) if args.json else print
    work = STATE_DIR / ("demo" if args.scenario == "interruption" else f"demo-{args.scenario}")
    work.mkdir(parents=True, exist_ok=True)
    for old in work.glob("*"):
        old.unlink()
    if args.scenario == "capacity":
        return capacity_demo.run(args, work, say)
    if args.scenario == "gang":
        return gang.run(args, work, say)
    timeline, calls = Timeline(), []
    proof: list[tuple[str, bool]] = []
    facts: dict[str, Any] = {}
    with MotoServer(log_path=str(work / "moto.log")) as moto:
        say(f"moto server on {moto.endpoint} (pid {moto.proc.pid if moto.proc else '?'})")
        system = LocalSystem(moto.endpoint, work, on_change=timeline.add)
        reference = None
        try:
            say(f"stack deployed from template.yaml: {', '.join(system.stack.functions)}")
            record_calls(timeline, calls)
            a = system.add_host("g5.xlarge", "us-east-1a")
            b = system.add_host("g5.xlarge", "us-east-1b")
            say(f"cluster {system.cluster.name}: spot instances {a.instance_id} (1a), {b.instance_id} (1b)")
            system.pump()
            out, ref_out = work / "final-job.pt", work / "final-reference.pt"
            td = task_definition(system, out, args.steps, args.step_seconds)
            reference = reference_run(system, ref_out, args.steps, work / "reference.log")

            _submit_and_warn(system, td, a, args, work, timeline, say)
            status = _until_finished(system, timeline)
            if reference.wait(timeout=120) != 0:
                raise RuntimeError(f"the reference run failed; see {work / 'reference.log'}")

            proof, facts = _interruption_proof(system, moto, reference, status, (a, b), args, work)
        finally:
            system.close()
            if reference is not None and reference.poll() is None:
                reference.send_signal(signal.SIGKILL)
                reference.wait(timeout=10)

    return _print_interruption_demo(proof, facts, timeline, work, args.json)


def _submit_and_warn(
    system: Any, td: str, a: Any, args: argparse.Namespace, work: Path, timeline: Timeline, say: Any
) -> None:
    """Submit the job (it starts on host A) and, once it reached step --interrupt-at, warn host A."""
    answer = system.invoke_jobs(
        {
            "action": "submit",
            "job_id": "demo",
            "request": {"cluster": "gpu-spot", "taskDefinition": td},
        }
    )
    submitted = read_answer(answer)
    if not submitted.ok or submitted.job is None or not submitted.job.task_arn:
        raise RuntimeError(f"submit failed: {answer}")
    first_task = submitted.job.task_arn
    timeline.add(f"job demo submitted: task {first_task.rsplit('/', 1)[-1][:8]} on {a.instance_id}")
    say("job submitted; training until step", args.interrupt_at, "...")
    log1 = work / f"task-{first_task.rsplit('/', 1)[-1][:8]}.log"
    if not system.run_until(lambda: max(steps_done(log1), default=-1) >= args.interrupt_at, timeout=120):
        raise RuntimeError(f"the job did not reach step {args.interrupt_at}; see {log1}")

    timeline.mark_zero()
    system.notice("spot-interruption", a.instance_id)
    timeline.add(f"SPOT INTERRUPTION WARNING for {a.instance_id} put on the default bus")
    say("spot interruption warning sent for", a.instance_id)


def _until_finished(system: Any, timeline: Timeline) -> StatusView:
    """Run until the job has ended; its status."""

    def finished() -> bool:
        return system.job_status("demo").state in TERMINAL

    system.run_until(finished, timeout=300, every=0.2)
    status = system.job_status("demo")
    timeline.add(f"job demo {status.state} after {len(status.attempts)} attempt(s)")
    return status


def _interruption_proof(
    system: Any,
    moto: Any,
    reference: subprocess.Popen[bytes],
    status: StatusView,
    instances: tuple[Any, Any],
    args: argparse.Namespace,
    work: Path,
) -> tuple[list[tuple[str, bool]], dict[str, Any]]:
    """The checks of the story, from the job's attempts and its task logs; (proof, facts)."""
    a, b = instances
    out, ref_out = work / "final-job.pt", work / "final-reference.pt"
    attempts = status.attempts
    log_texts = [(work / f"task-{x.task_arn.rsplit('/', 1)[-1][:8]}.log").read_text() for x in attempts]
    executed = [len(re.findall(r"^step \d+ loss", t, re.MULTILINE)) for t in log_texts]
    saved_after = re.search(r"checkpointed after step (\d+): exit 75", log_texts[0])
    resumed_after = re.search(r"resumed after step (\d+)", log_texts[1]) if len(log_texts) > 1 else None
    lost = int(saved_after.group(1)) - int(resumed_after.group(1)) if saved_after and resumed_after else None
    hosts = [x.instance_id for x in attempts]
    spend = status.spend or Spend()
    facts: dict[str, Any] = {
        "attempts": len(attempts),
        "hosts": hosts,
        "instance_types": [x.instance_type for x in attempts],
        "steps_executed": executed,
        "steps_lost": lost,
        "resume_from": attempts[1].resume_from if len(attempts) > 1 else None,
        "gpu_hours": spend.gpu_hours,
        "gpu_hours_lost": spend.gpu_hours_lost,
        "dead_letters": system.dead_letters(),
        "pids": [p for p in (moto.proc.pid if moto.proc else None, reference.pid) if p] + system.runner.pids,
        # each attempt after the first: its container start -> first training step, and the restore's share
        "first_steps": {
            x.number: s for x, t in zip(attempts, log_texts, strict=True) if (s := first_step(t))
        },
    }
    proof = [
        ("the job finished: succeeded", status.state == "succeeded"),
        (
            "interrupted once, resubmitted once (2 attempts)",
            len(attempts) == 2 and len(system.scheduler.requests) == 2,
        ),
        ("the second attempt ran on the other instance", hosts == [a.instance_id, b.instance_id]),
        ("it resumed from the committed checkpoint", bool(facts["resume_from"]) and lost is not None),
        ("0 steps lost", lost == 0 and sum(executed) == args.steps),
        ("final weights equal to an uninterrupted run", out.exists() and same_weights(out, ref_out)),
        ("host A was drained", system.cluster.describe_host(a)["status"] == "DRAINING"),
        ("nothing in any dead-letter queue", not any(facts["dead_letters"].values())),
        ("every AWS call allowed by its function's role", not system.guard.denied),
        ("its timeline drawn, a bar for every attempt", picture(status, work, facts)),
    ]
    return proof, facts


def _print_interruption_demo(
    proof: list[tuple[str, bool]], facts: dict[str, Any], timeline: Timeline, work: Path, as_json: bool
) -> int:
    """The timeline, the proof and what spot saves (or all of it as JSON); the exit status."""
    ok = passed(proof)
    if as_json:
        print_json(ok, timeline, proof, facts)
        return 0 if ok else 1
    print_timeline(timeline, "seconds since the warning was put on the bus")
    print_proof(proof)
    for attempt, seconds in (facts.get("first_steps") or {}).items():
        print("\n" + first_step_line(attempt, seconds))
    if "gpu_hours" in facts:
        print(f"\n{savings_text(facts)}")
    print_end(work, ok)
    return 0 if ok else 1


def savings_text(facts: dict[str, Any]) -> str:
    """What spot saves, said of the instance type the job ran on (moto's spot prices say nothing, so
    the paper's measured prices give the scale, named as another type's), and what this run spent."""
    types = sorted({str(t) for t in facts.get("instance_types") or [] if t})
    listed = [
        f"${on_demand_price(t)}/h" if len(types) == 1 else f"{t} at ${on_demand_price(t)}/h"
        for t in types
        if on_demand_price(t) is not None
    ]
    ran = f"this job ran on {', '.join(types)}" if types else "this job's instance type is not known"
    if listed:
        ran += f" ({', '.join(listed)} on demand, the US East list price)"
    spot, od = PAPER_SPOT_PRICE, PAPER_ON_DEMAND_PRICE
    lost = facts.get("steps_lost")
    redone = (
        f"{lost} steps redone"
        if lost is not None
        else "steps redone not known (no checkpoint handed from one attempt to the next in the task logs)"
    )
    return (
        f"what spot saves: {ran}; moto's spot prices are placeholders, so this run's dollars mean "
        f'nothing.\nFor scale, "Can\'t Be Late" (NSDI 2024) measured p3.2xlarge (1 V100) at ${spot}/h on '
        f"spot against ${od}/h on demand: {1 - spot / od:.0%} off the GPU bill.\n"
        f"This run: {facts['gpu_hours'] * 3600:.0f} GPU-seconds, {facts['gpu_hours_lost'] * 3600:.1f} of "
        f"them after the last checkpoint (shutting down), {redone}."
    )
