"""Benchmark of the time to resume (issue 31, item 5): for a job interrupted by a spot warning, the time
from the warning to the first training step of its next attempt, with the early replacement off
(SpareCapacityGroups empty) and on (both pools' groups listed), in one run.

Each case is the whole local stack (moto server, every function in this process) with the boot model
(emulator/boot.py: instances come from the pools' Auto Scaling groups and join `--boot-seconds` after
their launch; a RunTask no instance fits waits PROVISIONING and ECS managed scaling raises the group
`--scale-out-seconds` later). Two spot pools, gpu-spot-a (us-east-1a) and gpu-spot-b (us-east-1b), one
g5.xlarge (1 GPU) each at most at the start. The job is examples/train.py with the agent (as
`spotguard local demo` runs it), its output lines stamped with the time; it starts on gpu-spot-a's
instance, and at step `--warn-at` that instance gets the spot warning. SpotGuard stops the task, the
task commits a checkpoint and exits 75, and SpotGuard launches the next attempt in gpu-spot-b (the
capacity policy's choice, the warned pool being avoided):

- "boot": gpu-spot-b has no instance, so one must boot. Off: the RunTask waits PROVISIONING, managed
  scaling adds the instance. On: SpotGuard raised gpu-spot-b's group at the warning.
- "free": gpu-spot-b has a free instance already (the pool has capacity: no boot in the way). On, the
  spare SpotGuard asked for at the warning is not needed and is given back.
- "boot" with SpareOnRebalance (`--rebalance-lead`, default 180 s): the rebalance recommendation comes
  that long before the warning and asks the spare; the lead is a modelled wait (AWS gives no figure for
  it; the goal needs about the boot less the checkpoint and 30 s).

How it counts. The stack runs on a clock `--time-scale` times faster than the wall clock (SpotGuard's
functions, the agent's manifests and the boot model all read it), so that a boot of minutes takes
seconds. On that clock, what runs for real (SpotGuard's path, moto, the task's checkpoint and restore,
Python's start) lasts `--time-scale` times its wall time. So each row is given twice: as measured on the
stack's clock, and projected to real time, where every measured segment counts for its wall time and the
modelled waits (managed scaling's reaction, the boot) for their figures: the instance the next attempt
runs on is ready at its launch (its real time) plus the boot, and the attempt is placed at its RunTask or
then, whichever is later. With `--time-scale 1` the two are the same measurement.

The task's own times: checkpoint = SIGTERM to its "checkpointed after step N" line (the commit done);
restore = its process started to its first step line (Python and PyTorch's import, the restore of the
checkpoint from S3 on moto). The goal (issue 31): with the early replacement, where the chosen pool has
capacity, warning -> first step of the next attempt <= checkpoint + restore + 30 s, in real time.

    .venv/bin/python bench/resume.py [--boot-seconds 180] [--scale-out-seconds 60] [--time-scale 10]
                                     [--only boot|free] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import runpy
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parent.parent
TRAIN = REPO / "examples" / "train.py"
WORK = REPO / ".local-stack" / "bench-resume"
GOAL_MARGIN = 30.0  # seconds beyond the task's own checkpoint and restore (issue 31)
SPARE_GROUPS = "gpu-spot-a-group,gpu-spot-b-group"


# ================================================================================= the job, stamped
class Stamped:
    """A text stream that writes each line with the wall-clock time it was written before it."""

    def __init__(self, out: IO[str]) -> None:
        self.out, self.partial = out, ""

    def write(self, text: str) -> int:
        self.partial += text
        *lines, self.partial = self.partial.split("\n")
        for line in lines:
            self.out.write(f"{time.time():.6f} {line}\n")
        self.out.flush()
        return len(text)

    def flush(self) -> None:
        self.out.flush()


def run_task(argv: list[str]) -> None:
    """`resume.py task -- ARGS`: examples/train.py ARGS in this process, its stdout stamped (the bench
    reads when each step and the checkpoint happened from it). Exits as the training does."""
    sys.path.insert(0, str(TRAIN.parent))
    sys.argv = [str(TRAIN), *argv]
    sys.stdout = Stamped(sys.__stdout__)  # type: ignore[assignment]
    runpy.run_path(str(TRAIN), run_name="__main__")


def stamped_lines(log: Path) -> list[tuple[float, str]]:
    """(wall time, line) for each stamped line of a task's log (the agent's own lines are not)."""
    if not log.exists():
        return []
    out = []
    for line in log.read_text(errors="replace").splitlines():
        m = re.match(r"^(\d+\.\d+) (.*)$", line)
        if m:
            out.append((float(m.group(1)), m.group(2)))
    return out


# ====================================================================================== one case
@dataclass
class Case:
    pool: str  # "boot": the next pool has no instance; "free": it has a free one
    early: bool  # the early replacement on
    # SpareOnRebalance: the rebalance recommendation this long (real time) before the warning, and when
    # it was put on the bus (seconds since the warning, on the stack's clock)
    lead: float = 0.0
    rebalanced: float | None = None
    # seconds since the warning on the stack's clock (None: did not happen)
    sigterm: float | None = None
    committed: float | None = None
    runtask: float | None = None
    placed: float | None = None
    started: float | None = None
    first_step: float | None = None
    launched_by: str = ""  # what launched the instance the next attempt ran on ("" : there already)
    launched: float | None = None  # when that instance's group launched it
    spare_given_back: bool = False
    resumed_after: int | None = None
    checkpointed_after: int | None = None
    next_pool: str = ""
    notes: list[str] = field(default_factory=list)
    # derived
    scaled: dict[str, float] = field(default_factory=dict)
    real: dict[str, float] = field(default_factory=dict)
    goal: bool | None = None


class Recorder:
    """The local system's lines, each with the stack's clock when it was said."""

    def __init__(self) -> None:
        self.clock: Any = None
        self.rows: list[tuple[datetime, str]] = []

    def add(self, what: str) -> None:
        self.rows.append((self.clock.now() if self.clock is not None else datetime.now(UTC), what))

    def first(self, pattern: str, after: datetime) -> datetime | None:
        return next((t for t, w in self.rows if t >= after and re.search(pattern, w)), None)


def on_clock(clock: Any, wall: float) -> datetime:
    """A wall-clock time read on the stack's ScaledClock."""
    return clock.at + (datetime.fromtimestamp(wall, UTC) - clock.origin) * clock.scale


def run_case(pool: str, early: bool, args: argparse.Namespace, say: Any, lead: float = 0.0) -> Case:
    from spotguard.adapters import clients
    from spotguard.domain.jobs.model import TERMINAL
    from spotguard_cli.answers import read_answer
    from spotguard_cli.emulator.gpucluster import PoolGroup
    from spotguard_cli.emulator.motoserver import MotoServer
    from spotguard_cli.emulator.system import LocalSystem

    case = Case(pool=pool, early=early, lead=lead)
    work = WORK / f"{pool}-{'on' if early else 'off'}{'-rebalance' if lead else ''}"
    work.mkdir(parents=True, exist_ok=True)
    for old in work.glob("*"):
        old.unlink()
    pools = [
        PoolGroup("gpu-spot-a", "gpu-spot-a-group", "g5.xlarge", ("us-east-1a",), spot=True),
        PoolGroup("gpu-spot-b", "gpu-spot-b-group", "g5.xlarge", ("us-east-1b",), spot=True),
    ]
    recorder = Recorder()
    with MotoServer(log_path=str(work / "moto.log")) as moto:
        system = LocalSystem(
            moto.endpoint,
            work,
            parameters=(
                {"SpareCapacityGroups": SPARE_GROUPS, "SpareOnRebalance": "true" if lead else "false"}
                if early
                else None
            ),
            on_change=recorder.add,
            time_scale=args.time_scale,
            boot_seconds=args.boot_seconds,
            scale_out_seconds=args.scale_out_seconds,
        )
        recorder.clock = system.clock
        runtasks: list[datetime] = []
        clients.on_event("after-call.ecs.RunTask", lambda **_: runtasks.append(system.clock.now()))
        try:
            system.add_pools(pools)
            a = system.add_pool_host("gpu-spot-a")
            if pool == "free":
                system.add_pool_host("gpu-spot-b")
            system.pump()
            system.functions["ReconcileFunction"].invoke({"id": "local-schedule"})  # the pools discovered
            command = [
                sys.executable,
                str(Path(__file__).resolve()),
                "task",
                "--",
                "--steps",
                # the steps the rebalance's lead takes too, so the job is still training at the warning
                str(args.steps + math.ceil(lead / args.time_scale / max(args.step_seconds, 0.01))),
            ]
            command += ["--out", str(work / "final.pt"), "--step-seconds", f"{args.step_seconds:g}"]
            td = system.task_definition(
                command, gpus=1, environment={"SPOTGUARD_CHECKPOINT_INTERVAL_SECONDS": "2"}, family="train"
            )
            answer = read_answer(
                system.invoke_jobs(
                    {
                        "action": "submit",
                        "job_id": "resume",
                        "request": {"cluster": "gpu-spot", "taskDefinition": td},
                    }
                )
            )
            if not answer.ok or answer.job is None or not answer.job.task_arn:
                raise RuntimeError(f"submit failed: {answer}")
            first_log = work / f"task-{answer.job.task_arn.rsplit('/', 1)[-1][:8]}.log"

            def steps(log: Path) -> list[int]:
                return [
                    int(m.group(1)) for _, w in stamped_lines(log) if (m := re.match(r"step (\d+) loss", w))
                ]

            if not system.run_until(
                lambda: max(steps(first_log), default=-1) >= args.warn_at, timeout=180, every=0.05
            ):
                raise RuntimeError(f"the job did not reach step {args.warn_at}; see {first_log}")
            status = system.job_status("resume")
            if status.attempts[0].instance_id != a.instance_id:
                raise RuntimeError(
                    f"the first attempt ran on {status.attempts[0].instance_id}, not on gpu-spot-a"
                )

            if lead:  # SpareOnRebalance: the recommendation first, the warning `lead` s later
                rebalanced = system.clock.now()
                system.notice("rebalance-recommendation", a.instance_id)
                system.run_until(lambda: False, timeout=lead / args.time_scale, every=0.05)
            warned = system.clock.now()
            system.notice("spot-interruption", a.instance_id)
            say(f"  {pool}, early replacement {'on' if early else 'off'}: warning at step {args.warn_at}")

            def next_attempt_log() -> Path | None:
                s = system.job_status("resume")
                if len(s.attempts) < 2 or not s.attempts[1].task_arn:
                    return None
                return work / f"task-{s.attempts[1].task_arn.rsplit('/', 1)[-1][:8]}.log"

            def resumed() -> bool:
                log = next_attempt_log()
                return log is not None and bool(steps(log))

            timeout = 120 + (args.boot_seconds + 2 * args.scale_out_seconds) / args.time_scale
            if not system.run_until(resumed, timeout=timeout, every=0.05):
                raise RuntimeError(f"no step of a next attempt within {timeout:.0f}s; see {work}")
            # the rest of the job, and the spare given back (the early replacement's, where not needed)
            system.run_until(lambda: system.job_status("resume").state in TERMINAL, timeout=120, every=0.1)
            system.run_until(
                lambda: False, timeout=2 * args.scale_out_seconds / args.time_scale + 1, every=0.1
            )

            status = system.job_status("resume")
            second = status.attempts[1]
            case.next_pool = second.pool or ""
            short1 = status.attempts[0].task_arn.rsplit("/", 1)[-1][:8]
            short2 = second.task_arn.rsplit("/", 1)[-1][:8]
            log1, log2 = first_log, next_attempt_log()
            assert log2 is not None

            def since(t: datetime | None) -> float | None:
                return None if t is None else round((t - warned).total_seconds(), 3)

            lines1, lines2 = stamped_lines(log1), stamped_lines(log2)
            done = next(((t, w) for t, w in lines1 if w.startswith("checkpointed after step")), None)
            resumed_line = next(((t, w) for t, w in lines2 if w.startswith("resumed after step")), None)
            first = next((t for t, w in lines2 if re.match(r"step \d+ loss", w)), None)
            if lead:
                case.rebalanced = since(rebalanced)
            case.sigterm = since(recorder.first(rf"SIGTERM -> {short1}", warned))
            case.committed = since(on_clock(system.clock, done[0])) if done else None
            case.checkpointed_after = int(done[1].split()[3].rstrip(":")) if done else None
            case.resumed_after = int(resumed_line[1].split()[-1]) if resumed_line else None
            relaunches = [t for t in runtasks if t >= warned]
            case.runtask = since(relaunches[0]) if relaunches else None
            case.placed = since(recorder.first(rf"task {short2} placed on", warned)) or case.runtask
            case.started = since(recorder.first(rf"task {short2} started as", warned))
            case.first_step = since(on_clock(system.clock, first)) if first is not None else None
            assert system.boot is not None
            host = next(
                (h for h, b in system.boot.joined.values() if h.instance_id == second.instance_id), None
            )
            boot = next((b for b in system.boot.launched if b.instance_id == second.instance_id), None)
            if boot is not None and boot.why != "pool host":
                case.launched_by, case.launched = boot.why, since(boot.launched_at)
            spares = [b for b in system.boot.launched if b.why == "SpotGuard"]
            left = {iid for _, iid, _ in system.boot.left}
            case.spare_given_back = any(b.instance_id in left for b in spares)
            if host is None and boot is None:
                case.notes.append(f"the next attempt ran on {second.instance_id}, not a pool instance")
            if early and not spares:
                case.notes.append("SpotGuard asked no spare instance (SetDesiredCapacity) at the warning")
            if system.guard.denied:
                case.notes.append(
                    f"calls a role does not allow: {sorted({str(d) for d in system.guard.denied})}"
                )
            if any(system.dead_letters().values()):
                case.notes.append(f"dead letters: {system.dead_letters()}")
        finally:
            system.close()
    derive(case, args)
    return case


def derive(case: Case, args: argparse.Namespace) -> None:
    """The segments on the stack's clock, and projected to real time (the module's docstring)."""
    need = (case.sigterm, case.committed, case.runtask, case.placed, case.started, case.first_step)
    if any(v is None for v in need):
        names = ("sigterm", "committed", "runtask", "placed", "started", "first_step")
        missing = ", ".join(n for n, v in zip(names, need, strict=True) if v is None)
        case.notes.append(f"not seen: {missing}; no figures")
        return
    sigterm, committed, runtask, placed, started, first = (float(v) for v in need)  # type: ignore[arg-type]
    s = args.time_scale
    case.scaled = {
        "total": first,
        "checkpoint": committed - sigterm,
        "restore": first - started,
        "wait_for_instance": placed - runtask,
    }
    # real time: executed segments at their wall length, modelled waits at their figures
    runtask_real = runtask / s
    if case.launched_by == "SpotGuard" and case.launched is not None and case.rebalanced is not None:
        # the spare, launched at the rebalance recommendation: the lead is a modelled wait (its figure),
        # SpotGuard's path from the recommendation to the launch a measured one
        ready = -case.lead + (case.launched - case.rebalanced) / s + args.boot_seconds
    elif case.launched_by == "SpotGuard" and case.launched is not None:  # the spare, launched at the warning
        ready = case.launched / s + args.boot_seconds
    elif case.launched_by == "managed scaling":  # launched a managed scaling period after the RunTask
        ready = runtask_real + args.scale_out_seconds + args.boot_seconds
    else:
        ready = runtask_real  # an instance there already
    placed_real = max(runtask_real, ready)
    checkpoint, restore = (committed - sigterm) / s, (first - started) / s
    total = placed_real + (started - placed) / s + restore
    case.real = {
        "total": round(total, 2),
        "checkpoint": round(checkpoint, 2),
        "restore": round(restore, 2),
        "wait_for_instance": round(placed_real - runtask_real, 2),
        "spotguard_and_local_stack": round(total - checkpoint - restore - (placed_real - runtask_real), 2),
    }
    case.goal = total <= checkpoint + restore + GOAL_MARGIN


# ========================================================================================= report
def print_report(cases: list[Case], args: argparse.Namespace) -> None:
    print(
        f"\nboot (launch -> ECS registration) {args.boot_seconds:g} s, managed scaling's reaction "
        f"{args.scale_out_seconds:g} s, the stack's clock x{args.time_scale:g}; the warning at step "
        f"{args.warn_at}"
    )
    print("\nwarning -> first training step of the next attempt (seconds)")
    head = f"{'next pool':<48} {'early repl.':<12} {'real time':>9} {'on clock':>9}"
    head += f" {'ckpt':>6} {'restore':>8} {'instance':>9} {'other':>7}  goal (<= ckpt + restore + 30 s)"
    print(head)
    for c in cases:
        where = "gpu-spot-b, boots one" if c.pool == "boot" else "gpu-spot-b, a free instance"
        where += f", rebalance {c.lead:g} s before" if c.lead else ""
        if not c.real:
            print(f"{where:<48} {'on' if c.early else 'off':<12} {'-':>9}  {'; '.join(c.notes)}")
            continue
        r = c.real
        goal = (
            "met"
            if c.goal
            else f"missed by {r['total'] - r['checkpoint'] - r['restore'] - GOAL_MARGIN:.1f} s"
        )
        print(
            f"{where:<48} {'on' if c.early else 'off':<12} {r['total']:>9.1f} {c.scaled['total']:>9.1f}"
            f" {r['checkpoint']:>6.1f} {r['restore']:>8.1f} {r['wait_for_instance']:>9.1f}"
            f" {r['spotguard_and_local_stack']:>7.1f}  {goal}"
        )
    print(
        "\nreal time: each measured segment at its wall time, the modelled waits at their figures; on clock: "
        f"as measured on the stack's clock (x{args.time_scale:g}). ckpt: SIGTERM -> checkpoint committed; "
        "restore: the process started -> its first step; instance: the next attempt's RunTask -> placed "
        "(waiting PROVISIONING for an instance); other: the rest (SpotGuard's path from the warning to the "
        "SIGTERM and from the exit to the RunTask, the local agent's start), on this machine."
    )
    for c in cases:
        facts = [
            f"{c.pool}/{'on' if c.early else 'off'}{'/rebalance' if c.lead else ''}: next attempt in "
            f"{c.next_pool or '?'}",
            f"checkpointed after step {c.checkpointed_after}, resumed after step {c.resumed_after}",
        ]
        if c.launched_by:
            facts.append(f"its instance launched by {c.launched_by} at {c.launched:+.1f} s (stack's clock)")
        if c.early:
            facts.append("the spare given back" if c.spare_given_back else "no spare given back")
        print("  " + "; ".join(facts) + ("; " + "; ".join(c.notes) if c.notes else ""))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["task"]:
        run_task(argv[2:] if argv[1:2] == ["--"] else argv[1:])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--boot-seconds", type=float, default=180.0, help="launch -> ECS registration (default 180)"
    )
    p.add_argument(
        "--scale-out-seconds", type=float, default=60.0, help="managed scaling's reaction (default 60)"
    )
    p.add_argument(
        "--time-scale", type=float, default=10.0, help="the stack's clock, x the wall clock (default 10)"
    )
    p.add_argument("--steps", type=int, default=40, help="training steps (default 40)")
    p.add_argument("--step-seconds", type=float, default=0.1, help="pause per step, wall clock (default 0.1)")
    p.add_argument("--warn-at", type=int, default=15, help="the warning at this step (default 15)")
    p.add_argument("--only", choices=["boot", "free"], help="one of the two pools' cases")
    p.add_argument(
        "--rebalance-lead",
        type=float,
        default=180.0,
        help="the boot case with SpareOnRebalance: the recommendation this long (real seconds) before the "
        "warning (default 180; 0: no such case)",
    )
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.time_scale <= 0 or args.boot_seconds < 0 or args.scale_out_seconds < 0:
        p.error("--time-scale must be positive, the seconds not negative")
    if not 0 <= args.warn_at < args.steps - 1:
        p.error("--warn-at must leave a step after it")
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        os.environ.setdefault(k, v)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    say = (lambda *_: None) if args.json else print
    cases = []
    t0 = time.monotonic()
    runs = [
        (pool, early, 0.0)
        for pool in (["boot", "free"] if args.only is None else [args.only])
        for early in (False, True)
    ]
    if args.rebalance_lead > 0 and args.only in (None, "boot"):
        runs.insert(2 if args.only is None else len(runs), ("boot", True, args.rebalance_lead))
    for pool, early, lead in runs:
        try:
            cases.append(run_case(pool, early, args, say, lead))
        except RuntimeError as exc:
            cases.append(Case(pool=pool, early=early, lead=lead, notes=[f"FAILED: {exc}"]))
    if args.json:
        print(json.dumps({"args": vars(args), "cases": [asdict(c) for c in cases]}, default=str))
    else:
        print_report(cases, args)
        print(f"\n{time.monotonic() - t0:.0f} s in all; logs in {WORK}/")
    return 0 if all(c.real for c in cases) else 1


if __name__ == "__main__":
    sys.exit(main())
