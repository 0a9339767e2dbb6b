"""`spotguard local soak`: many jobs through spot availability traces, the whole system in this process on
a virtual clock (emulator/vclock.py), and what must never happen counted.

The stack's functions run over moto in this process (`make_jobs_world`, no hosts of its own). Each trace is a
spot pool (g5.xlarge in a zone of its own) of `--hosts-per-pool` instances: when the trace says spot is gone,
every instance of the pool gets its spot warning through the interruption function and is taken back two
minutes later; when it is back, as many new instances are launched, and each joins the cluster
`--boot-seconds` later (the local stack's boot model, emulator/boot.py), or never if spot goes first. `--jobs`
one-GPU jobs are submitted over the first hours, each `--job-hours` of work. Their tasks are modelled, not
run: a task placed by RunTask runs `RESTART_MINUTES` later from the checkpoint SpotGuard gave it, makes a step
every `STEP_MINUTES`, commits every `COMMIT_MINUTES` (a manifest in the checkpoint bucket and its event, as
the agent writes it), exits 0 when its work is done, and when SpotGuard stops it (StopTask: a warning, a
cancel, a stray) commits and exits 75 `STOP_SECONDS` later, unless its instance is taken back first (then it
is gone without a word). Every SQS delay, visibility timeout, retry and reconcile sweep (every 5 minutes) runs
on the virtual clock, which jumps from one thing due to the next. Each invocation of SpotGuard's functions
takes virtual time, as on Lambda: every AWS call its modelled latency, and an execution environment's start
its init duration (emulator/latency.py).

`--faults RATE` plays, each with chance RATE where it can happen, drawn from the seed:
- task events delivered twice, or held back so that a later one overtakes them, or a RUNNING event lost
  for good (reconcile must take the start from ECS); instances taken back without a warning; a stopped
  task's last commit that takes longer than the warning, so that the instance goes mid-commit (its data
  files in S3, no manifest: SpotGuard must resume from the one before); a job cancelled by its user
  (`jobs cancel`) an hour or three after its submit, whose StopTask may then meet the call faults below (the
  cancel must still end: the job cancelled, or succeeded if it finished first);
- at every AWS call SpotGuard's functions make (`--call-faults RATE`, default the same; the soak's own
  calls are never faulted): throttled or failed with a 5xx (once: botocore's retry absorbs it; every
  attempt: SpotGuard sees the error), its answer lost after it took effect (SpotGuard sees a timeout, or
  botocore sends the call again), a DynamoDB conditional write raced by a twin, or the invocation cut
  there (timed out or crashed: what it did so far stands; an SQS batch comes back after the visibility
  timeout, the reconcile runs again at its next schedule, and the soak, as a user's CLI, submits again
  the same job after a failed submit).

It prints what must be zero: jobs lost (not succeeded by the end), attempts of one job running at once,
committed steps lost (a task started from an older checkpoint than the newest committed before it was
placed), messages in dead-letter queues, jobs stuck (neither running, nor waiting with a retry due, nor
ended) at the end, and cancels not done (a job its user cancelled that still runs long after); and a
digest of the run. The same seed gives the same run, byte for byte. A long
run prints a line a virtual day; Ctrl-C ends it at its next step and prints what it found so far (a
second Ctrl-C stops it at once).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from spotguard_cli import arguments
from spotguard_cli.emulator.soak.loop import Soak
from spotguard_cli.emulator.soak.model import START, ZONES, Result, SoakPlan
from spotguard_cli.emulator.soak.system import virtual_system

STATE_DIR = Path(".local-stack") / "soak"  # the functions' logs and the run's timeline


def add_parser(actions: Any) -> None:
    s = actions.add_parser(
        "soak",
        help="many jobs through spot traces on a virtual clock: what must never happen, counted",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument(
        "--trace", action="append", required=True, metavar="FILE", help="a spot pool; repeat (1-6)"
    )
    s.add_argument("--jobs", type=arguments.count, default=50, metavar="N", help="jobs (default 50)")
    s.add_argument(
        "--job-hours", type=arguments.positive("--job-hours"), default=24.0, metavar="C", help="work per job"
    )
    s.add_argument(
        "--hours",
        type=arguments.positive("--hours"),
        default=None,
        metavar="H",
        help="the traces' hours to play (default: all of the shortest)",
    )
    s.add_argument(
        "--hosts-per-pool", type=arguments.count, default=None, metavar="K", help="instances a pool has"
    )
    s.add_argument(
        "--boot-seconds",
        type=arguments.number(0, 3600),
        default=None,
        metavar="S",
        help="from spot coming back to the pool's new instances joining the cluster (default: the local "
        "stack's boot model's, emulator/boot.py; 0: at once)",
    )
    s.add_argument(
        "--faults",
        type=arguments.number(0, 1),
        default=0.0,
        metavar="RATE",
        help="the chance of each fault where it can happen (0-1): events duplicated or reordered, "
        "instances gone without a warning, a last commit cut by the reclaim, and at each of SpotGuard's "
        "AWS calls: throttled, a 5xx, its answer lost, a conditional write raced, the invocation cut",
    )
    s.add_argument(
        "--call-faults",
        type=arguments.number(0, 1),
        default=None,
        metavar="RATE",
        help="the chance of a fault at each of SpotGuard's AWS calls (default: --faults)",
    )
    s.add_argument("--seed", type=arguments.seed, default=1, metavar="S")
    s.add_argument("--json", action="store_true", help="the result as JSON")
    s.set_defaults(run=run)
    arguments.one_line_errors(s, "spotguard local soak")


def soak(plan: SoakPlan, say: Callable[[str], None], log: TextIO | None = None) -> Result:
    """One soak, start to end, in this process; the functions' logs to `log`."""
    from spotguard_cli.emulator.vclock import VirtualClock

    clock = VirtualClock(START)
    with virtual_system(clock, plan.seed, log) as (world, denied, cold):
        run = Soak(world, clock, plan, say)
        run.run()
        result = run.result()
        result.denied = sorted({str(d) for g in denied() for d in g.denied})
        result.cold_starts = cold.starts
        return result


def run(args: argparse.Namespace) -> int:
    from spotguard_cli.emulator.boot import BOOT_SECONDS
    from spotguard_cli.local.shared import quiet_moto, same_hash_seed
    from spotguard_cli.simulator import TraceError, load_trace

    quiet_moto()
    same_hash_seed()  # the same seed, the same run: string hashing too
    try:
        traces = [load_trace(p) for p in args.trace]
    except TraceError as exc:
        print(f"spotguard local soak: {exc}", file=sys.stderr)
        return 2
    if len(traces) > len(ZONES):
        print(f"spotguard local soak: at most {len(ZONES)} traces (a pool a zone)", file=sys.stderr)
        return 2
    if len({t.gap_hours for t in traces}) > 1:
        print("spotguard local soak: the traces must have one gap_seconds", file=sys.stderr)
        return 2
    shortest = min(len(t.available) for t in traces) * traces[0].gap_hours
    hours = min(args.hours or shortest, shortest)
    hosts = args.hosts_per_pool or max(1, math.ceil(args.jobs * 0.6 / len(traces)))
    # a line a virtual day, seen at once also through a pipe (`| tee`): a long run says how far it got
    say = (lambda _: None) if args.json else functools.partial(print, flush=True)
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with (STATE_DIR / "functions.log").open("w") as log:
        plan = SoakPlan(
            traces,
            args.jobs,
            args.job_hours,
            hours,
            hosts,
            args.seed,
            args.faults,
            args.call_faults,
            boot_seconds=BOOT_SECONDS if args.boot_seconds is None else args.boot_seconds,
        )
        result = soak(plan, say, log)
        (STATE_DIR / "timeline.log").write_text("\n".join(result.timeline) + "\n")
    if args.json:
        shown = {k: v for k, v in result.__dict__.items() if k != "timeline"}
        print(json.dumps(shown | {"ok": result.ok}, indent=2))
    else:
        print(render(result))
    return 0 if result.ok else 1


def render(r: Result) -> str:
    lines = [
        f"soak: {r.jobs} jobs, {r.virtual_hours} h of traces, {r.interruptions} spot warnings, "
        f"{r.tasks} tasks, faults {', '.join(f'{k} {n}' for k, n in r.faults.items()) or 'none'}",
        f"  jobs succeeded             {r.succeeded}",
        f"  jobs still at work         {r.unfinished}  (running or waiting when the "
        + ("run was stopped (Ctrl-C))" if r.stopped_early else "hours ran out)"),
        f"  jobs lost                  {len(r.lost)}",
        f"  jobs cancelled by the user {r.cancelled}",
        f"  cancels not done           {len(r.cancels_undone)}",
        f"  attempts running at once   {len(r.twice_at_once)}",
        f"  committed steps lost       {r.steps_lost}",
        f"  dead letters               {r.dead_letters}",
        f"  jobs stuck                 {len(r.stuck)}",
        f"  calls refused by a role    {len(r.denied)}",
        f"  cold starts                {r.cold_starts}",
        f"  run digest                 {r.digest}",
    ]
    lines += [f"    lost: {x}" for x in r.lost[:10]] + [f"    at once: {x}" for x in r.twice_at_once[:10]]
    lines += [f"    stuck: {x}" for x in r.stuck[:10]] + [f"    refused: {x}" for x in r.denied[:10]]
    lines += [f"    cancel not done: {x}" for x in r.cancels_undone[:10]]
    lines += [f"    dead letter: {x}" for x in r.dead_letter_lines[:10]]
    lines.append(
        f"timeline: {STATE_DIR / 'timeline.log'}; the functions' logs: {STATE_DIR / 'functions.log'}"
    )
    return "\n".join(lines)
