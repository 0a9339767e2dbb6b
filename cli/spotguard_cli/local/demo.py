"""`spotguard local demo | up | inject`: the whole system on this machine (see emulator/system.py).

demo    two simulated GPU spot instances, a managed job running examples/train.py (small, CPU) with the
        agent, a spot interruption warning for the job's instance: SpotGuard drains, checkpoints,
        resubmits on the other instance from the checkpoint, and the job finishes. Prints a timeline and
        the proof (steps lost, final weights equal to an uninterrupted run, what spot saves); exit
        status 0 only when the proof holds.
up      the stack with two instances, kept running until Ctrl-C; prints the endpoint and names.
inject  a notice of any kind for an instance, into a running `spotguard local up`.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from spotguard.domain.prices import PAPER_ON_DEMAND_PRICE, PAPER_SPOT_PRICE, on_demand_price
from spotguard_cli.arguments import number, whole
from spotguard_cli.emulator.inject import KINDS
from spotguard_cli.emulator.template import REPO
from spotguard_cli.emulator.timeline import Timeline

STATE_DIR = Path(".local-stack")
STATE_FILE = STATE_DIR / "up.json"
SHORTAGE = "capacity-shortage"
SHORTAGES = STATE_DIR / "shortages"  # `inject capacity-shortage` asks the running `up` through files here
TRAIN = REPO / "examples" / "train.py"
MAX_STEPS = 100_000
INTERRUPT_AT = 25  # the interruption scenario's default warning step
TIME_SCALE = 60.0  # the capacity scenario's default clock


def add_parser(sub: Any) -> None:
    p = sub.add_parser("local", help="run the whole system on this machine (moto server on 127.0.0.1)")
    actions = p.add_subparsers(dest="local_action", required=True, metavar="ACTION")
    d = actions.add_parser("demo", help="a training job interrupted, checkpointed, resumed and finished")
    d.add_argument(
        "--scenario",
        choices=["interruption", "capacity"],
        default="interruption",
        help="interruption (default): one warning, resumed on the other instance; capacity: a deadline "
        "job moved between spot pools, on-demand and back by the capacity policy",
    )
    d.add_argument("--steps", type=whole(1, MAX_STEPS), help="training steps (default 60; capacity: 300)")
    d.add_argument(
        "--step-seconds",
        type=number(0, 60, unit="seconds"),
        help="pause per step (default 0.1; capacity: 0.4)",
    )
    d.add_argument(
        "--interrupt-at",
        type=whole(0, MAX_STEPS),
        help=f"interruption: warn when this step is reached (default {INTERRUPT_AT}; steps count from 0)",
    )
    d.add_argument(
        "--time-scale",
        type=number(0, 100_000, low_open=True),
        help=f"capacity: SpotGuard's clock runs this many times faster than the wall clock "
        f"(default {TIME_SCALE:g})",
    )
    d.add_argument("--json", action="store_true", help="print the timeline and the proof as JSON")
    d.set_defaults(run=run_demo)
    u = actions.add_parser("up", help="keep the local stack running until Ctrl-C")
    u.add_argument(
        "--instances", type=whole(1, 50), default=2, help="simulated GPU spot instances (default 2)"
    )
    u.add_argument(
        "--reconcile-every",
        type=number(0, 3600, low_open=True, unit="seconds"),
        help="seconds between reconcile runs (default: the template's schedule)",
    )
    u.set_defaults(run=run_up)
    i = actions.add_parser("inject", help="send a notice into a running `spotguard local up`")
    i.add_argument(
        "kind",
        choices=sorted(
            [k for k in KINDS if k not in ("checkpoint-manifest", "task-state-change", "ebs-snapshot")]
            + [SHORTAGE]
        ),
    )
    i.add_argument("--instance", help="the EC2 instance id (see `spotguard local up`)")
    i.add_argument("--pool", help=f"{SHORTAGE}: the pool's capacity provider (see `spotguard local up`)")
    i.add_argument(
        "--for",
        dest="seconds",
        type=number(0, 100_000, low_open=True, unit="seconds"),
        default=300.0,
        help=f"{SHORTAGE}: seconds until the pool can launch again (default 300)",
    )
    i.set_defaults(run=run_inject)
    from spotguard_cli.local.replay.command import add_parser as add_replay

    add_replay(actions)


# ============================================================================================ demo
def _task_definition(
    system: Any, out: Path, steps: int, step_seconds: float, checkpoint_seconds: float = 2
) -> str:
    command = [
        sys.executable,
        str(TRAIN),
        "--steps",
        str(steps),
        "--out",
        str(out),
        "--step-seconds",
        str(step_seconds),
    ]
    return str(
        system.task_definition(
            command,
            gpus=1,
            environment={"SPOTGUARD_CHECKPOINT_INTERVAL_SECONDS": f"{checkpoint_seconds:g}"},
            family="train",
        )
    )


def _steps_done(log: Path) -> list[int]:
    if not log.exists():
        return []
    return [int(m.group(1)) for m in re.finditer(r"^step (\d+) loss", log.read_text(), re.MULTILINE)]


def _reference_run(system: Any, out: Path, steps: int, log: Path) -> subprocess.Popen[bytes]:
    """The same training, never interrupted, with a checkpoint prefix of its own."""
    from spotguard_cli.emulator.runner import local_environment

    env = {
        **local_environment(system.stack.endpoint, system.stack.region),
        "SPOTGUARD_CHECKPOINT_URI": f"s3://{system.stack.outputs['CheckpointBucketName']}/reference/",
        "SPOTGUARD_JOB_ID": "reference",
    }
    return subprocess.Popen(
        [sys.executable, str(TRAIN), "--steps", str(steps), "--out", str(out)],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )


PLACEHOLDER_PRICES = "moto's placeholder prices"


def _picture(status: dict[str, Any], work: Path, facts: dict[str, Any]) -> bool:
    """Draw the job's timeline (as `spotguard jobs status --plot` does) to work/timeline.png; True when
    the picture has one bar per attempt. Its dollars are moto's placeholder prices, and it says so."""
    from spotguard_cli.timeline_plot import plot_job

    path = work / "timeline.png"
    drawn = plot_job(status, str(path), prices_note=PLACEHOLDER_PRICES)
    facts["timeline_png"] = str(path)
    return path.exists() and len(drawn.bars) == len(status["attempts"])


def _same_weights(a: Path, b: Path) -> bool:
    import torch

    wa, wb = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


CAPACITY_MIN_STEPS = 10  # the capacity scenario warns at a fifth of the steps and again a fifth later


def demo_arguments(args: argparse.Namespace) -> str | None:
    """Fill in the scenario's defaults, and say in one line what cannot work (None: everything can), so
    that an impossible demo is refused at once rather than after minutes."""
    if args.scenario == "interruption":
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
        return "argument --interrupt-at: is for --scenario interruption (capacity warns at fifths of --steps)"
    args.steps = args.steps or 300
    args.step_seconds = 0.4 if args.step_seconds is None else args.step_seconds
    args.time_scale = TIME_SCALE if args.time_scale is None else args.time_scale
    if args.steps < CAPACITY_MIN_STEPS:
        return (
            f"argument --steps: the capacity scenario warns at a fifth of the steps and again a fifth later: "
            f"at least {CAPACITY_MIN_STEPS}, not {args.steps}"
        )
    return None


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
    work = STATE_DIR / ("demo" if args.scenario == "interruption" else "demo-capacity")
    work.mkdir(parents=True, exist_ok=True)
    for old in work.glob("*"):
        old.unlink()
    if args.scenario == "capacity":
        return _run_capacity(args, work, say)
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
            td = _task_definition(system, out, args.steps, args.step_seconds)
            reference = _reference_run(system, ref_out, args.steps, work / "reference.log")

            answer = system.invoke_jobs(
                {
                    "action": "submit",
                    "job_id": "demo",
                    "request": {"cluster": "gpu-spot", "taskDefinition": td},
                }
            )
            if not answer.get("ok"):
                raise RuntimeError(f"submit failed: {answer}")
            job = answer["job"]
            first_task = job["task_arn"]
            timeline.add(f"job demo submitted: task {first_task.rsplit('/', 1)[-1][:8]} on {a.instance_id}")
            say("job submitted; training until step", args.interrupt_at, "...")
            log1 = work / f"task-{first_task.rsplit('/', 1)[-1][:8]}.log"
            if not system.run_until(
                lambda: max(_steps_done(log1), default=-1) >= args.interrupt_at, timeout=120
            ):
                raise RuntimeError(f"the job did not reach step {args.interrupt_at}; see {log1}")

            timeline.mark_zero()
            system.notice("spot-interruption", a.instance_id)
            timeline.add(f"SPOT INTERRUPTION WARNING for {a.instance_id} put on the default bus")
            say("spot interruption warning sent for", a.instance_id)

            def finished() -> bool:
                return system.invoke_jobs({"action": "status", "job_id": "demo"})["job"]["state"] in (
                    "succeeded",
                    "failed",
                    "gave-up",
                    "cancelled",
                )

            system.run_until(finished, timeout=300, every=0.2)
            status = system.invoke_jobs({"action": "status", "job_id": "demo"})["job"]
            timeline.add(f"job demo {status['state']} after {len(status['attempts'])} attempt(s)")
            if reference.wait(timeout=120) != 0:
                raise RuntimeError(f"the reference run failed; see {work / 'reference.log'}")

            attempts = status["attempts"]
            log_texts = [
                (work / f"task-{x['task_arn'].rsplit('/', 1)[-1][:8]}.log").read_text() for x in attempts
            ]
            executed = [len(re.findall(r"^step \d+ loss", t, re.MULTILINE)) for t in log_texts]
            saved_after = re.search(r"checkpointed after step (\d+): exit 75", log_texts[0])
            resumed_after = (
                re.search(r"resumed after step (\d+)", log_texts[1]) if len(log_texts) > 1 else None
            )
            lost = (
                int(saved_after.group(1)) - int(resumed_after.group(1))
                if saved_after and resumed_after
                else None
            )
            hosts = [x.get("instance_id") for x in attempts]
            facts = {
                "attempts": len(attempts),
                "hosts": hosts,
                "instance_types": [x.get("instance_type") for x in attempts],
                "steps_executed": executed,
                "steps_lost": lost,
                "resume_from": attempts[1].get("resume_from") if len(attempts) > 1 else None,
                "gpu_hours": status["spend"]["gpu_hours"],
                "gpu_hours_lost": status["spend"]["gpu_hours_lost"],
                "dead_letters": system.dead_letters(),
                "pids": [p for p in (moto.proc.pid if moto.proc else None, reference.pid) if p]
                + system.runner.pids,
            }
            proof += [
                ("the job finished: succeeded", status["state"] == "succeeded"),
                (
                    "interrupted once, resubmitted once (2 attempts)",
                    len(attempts) == 2 and len(system.scheduler.requests) == 2,
                ),
                ("the second attempt ran on the other instance", hosts == [a.instance_id, b.instance_id]),
                ("it resumed from the committed checkpoint", bool(facts["resume_from"]) and lost is not None),
                ("0 steps lost", lost == 0 and sum(executed) == args.steps),
                ("final weights equal to an uninterrupted run", out.exists() and _same_weights(out, ref_out)),
                ("host A was drained", system.cluster.describe_host(a)["status"] == "DRAINING"),
                ("nothing in any dead-letter queue", not any(facts["dead_letters"].values())),
                ("every AWS call allowed by its function's role", not system.guard.denied),
                ("its timeline drawn, a bar for every attempt", _picture(status, work, facts)),
            ]
        finally:
            system.close()
            if reference is not None and reference.poll() is None:
                reference.send_signal(signal.SIGKILL)
                reference.wait(timeout=10)

    ok = bool(proof) and all(p for _, p in proof)
    if args.json:
        print(
            json.dumps(
                {
                    "ok": ok,
                    "timeline": [{"seconds": round(t, 3), "what": w} for t, w in timeline.rows],
                    "proof": [{"check": c, "passed": p} for c, p in proof],
                    "facts": facts,
                }
            )
        )
        return 0 if ok else 1
    print("\ntimeline (seconds since the warning was put on the bus):")
    for t, what in timeline.rows:
        print(f"  {t:+8.3f}s  {what}")
    print("\nproof:")
    for c, passed in proof:
        print(f"  [{'ok' if passed else 'FAILED'}] {c}")
    if "gpu_hours" in facts:
        print(f"\n{savings_text(facts)}")
    print(f"logs: {work}/ (functions.log, task-*.log, reference.log, moto.log, timeline.png)")
    print("moto server and every task process stopped.\n" + ("demo passed" if ok else "demo FAILED"))
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


def _run_capacity(args: argparse.Namespace, work: Path, say: Any) -> int:
    from spotguard_cli.local.capacity import print_capacity_demo, run_capacity_demo

    # in SpotGuard's time (x time_scale): checkpoints every few minutes, a job of hours, its deadline
    args.checkpoint_seconds = 3.0
    run_hours = args.steps * (args.step_seconds + 0.01) * args.time_scale / 3600
    args.work_hours = round(run_hours, 2)
    args.deadline_hours = round(run_hours * 1.5, 2)
    args.first_warning_step = args.steps // 5
    args.second_warning_after = args.steps // 5
    args.back_after_minutes = 20.0  # SpotGuard's time on on-demand before the first pool has spot again
    args.timeout = 600.0
    proof, decisions, facts, timeline = run_capacity_demo(args, work, say)
    ok = print_capacity_demo(proof, decisions, facts, timeline, args.json)
    if not args.json:
        print(f"logs: {work}/ (functions.log, task-*.log, reference.log, moto.log, timeline.png)")
        print("moto server and every task process stopped.\n" + ("demo passed" if ok else "demo FAILED"))
    return 0 if ok else 1


# ============================================================================================== up
def run_up(args: argparse.Namespace) -> int:
    from spotguard_cli.emulator.assembly import CLUSTER
    from spotguard_cli.emulator.motoserver import MotoServer
    from spotguard_cli.emulator.system import LocalSystem

    STATE_DIR.mkdir(exist_ok=True)
    stop = {"now": False}

    def on_signal(signum: int, _frame: Any) -> None:
        stop["now"] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    with MotoServer(log_path=str(STATE_DIR / "moto.log")) as moto:
        printer = _Printer()
        system = LocalSystem(
            moto.endpoint, STATE_DIR / "up", on_change=printer.add, reconcile_every=args.reconcile_every
        )
        from spotguard_cli.emulator.timeline import record_calls

        record_calls(printer, [])  # SpotGuard's own calls, as they happen
        try:
            # the pools of examples/gpu-cluster: spot in two zones and on-demand (one instance)
            system.add_pools()
            spot = ["gpu-spot-a", "gpu-spot-b"]
            hosts = [system.add_pool_host(spot[i % 2]) for i in range(args.instances)]
            hosts.append(system.add_pool_host("gpu-od"))
            system.pump()
            SHORTAGES.mkdir(parents=True, exist_ok=True)
            for old in SHORTAGES.glob("*.json"):
                old.unlink()
            state = {
                "endpoint": moto.endpoint,
                "region": system.stack.region,
                "moto_pid": moto.proc.pid if moto.proc else None,
                "cluster": system.cluster.name,
                "instances": [h.instance_id for h in hosts],
                "pools": {h.instance_id: h.capacity_provider for h in hosts},
                "capacity_providers": sorted(system.pools),
                "outputs": system.stack.outputs,
            }
            STATE_FILE.write_text(json.dumps(state, indent=2))
            print(f"SpotGuard runs locally against moto server at {moto.endpoint} ({system.stack.region})")
            print(f"  cluster {system.cluster.name}, instances (pool):")
            for h in hosts:
                print(f"    {h.instance_id} ({h.capacity_provider}, {h.availability_zone})")
            for k in ("JobsFunctionName", "LedgerTableName", "CheckpointBucketName", "NotificationsTopicArn"):
                print(f"  {k}: {system.stack.outputs.get(k)}")
            print(f"  state: {STATE_FILE}; logs: {STATE_DIR / 'up'}/")
            print(try_lines(state, CLUSTER))
            print("Ctrl-C stops everything.")
            while not stop["now"]:
                _take_shortages(system)
                system.pump()
                time.sleep(0.2)
        finally:
            system.close()
            STATE_FILE.unlink(missing_ok=True)
    print("stopped: moto server and every task process.")
    return 0


def try_lines(state: dict[str, Any], cluster: str) -> str:
    """What to try against a running `local up`, as commands that work pasted into another shell: the
    AWS CLI and boto3 need the endpoint, a region and credentials (moto's), or they stop at
    NoRegionError or NoCredentialsError."""
    from spotguard_cli.emulator.motoserver import FAKE_CREDENTIALS

    env = {
        "AWS_ENDPOINT_URL": state["endpoint"],
        "AWS_DEFAULT_REGION": state["region"],
        "AWS_ACCESS_KEY_ID": FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    }
    return "\n".join(
        [
            "  try, in another shell (the local stack's endpoint, region and credentials):",
            "       export " + " ".join(f"{k}={v}" for k, v in env.items()),
            f"       aws ecs list-tasks --cluster {cluster}",
            f"       spotguard local inject spot-interruption --instance {state['instances'][0]}",
            f"       spotguard local inject {SHORTAGE} --pool gpu-spot-a --for 600",
        ]
    )


def _take_shortages(system: Any) -> None:
    """Carry out the capacity shortages `spotguard local inject capacity-shortage` asked for."""
    for path in sorted(SHORTAGES.glob("*.json")):
        try:
            ask = json.loads(path.read_text())
            system.capacity_shortage(str(ask["pool"]), float(ask["seconds"]))
            system.on_change(f"{ask['pool']}: no capacity for {float(ask['seconds']):g} s (injected)")
        except (OSError, ValueError, KeyError) as exc:
            system.on_change(f"capacity shortage {path.name} not carried out: {exc}")
        path.unlink(missing_ok=True)


class _Printer:
    """A timeline that prints each line as it comes (for `spotguard local up`)."""

    def add(self, what: str) -> None:
        # the terminal itself: while a handler runs, stdout is its log (EMF metrics go there)
        print(f"{time.strftime('%H:%M:%S')} {what}", file=sys.__stdout__, flush=True)


def run_inject(args: argparse.Namespace) -> int:
    import boto3

    from spotguard_cli.emulator.inject import make_event, put_entry
    from spotguard_cli.emulator.motoserver import FAKE_CREDENTIALS

    if not STATE_FILE.exists():
        print(
            "spotguard local inject: no local stack is up (start one with `spotguard local up`)",
            file=sys.stderr,
        )
        return 2
    state = json.loads(STATE_FILE.read_text())
    if args.kind == SHORTAGE:
        providers = state.get("capacity_providers") or []
        if args.pool not in providers:
            print(
                f"spotguard local inject: --pool must be one of the local pools ({', '.join(providers)})",
                file=sys.stderr,
            )
            return 2
        SHORTAGES.mkdir(parents=True, exist_ok=True)
        ask = {"pool": args.pool, "seconds": args.seconds}
        (SHORTAGES / f"{time.time_ns()}.json").write_text(json.dumps(ask))
        print(f"{args.pool}: no capacity for {args.seconds:g} s (the running stack takes it within a second)")
        return 0
    if not args.instance:
        print(f"spotguard local inject: {args.kind} needs --instance", file=sys.stderr)
        return 2
    if args.instance not in state["instances"]:
        print(
            f"spotguard local inject: {args.instance} is not one of the local instances "
            f"({', '.join(state['instances'])})",
            file=sys.stderr,
        )
        return 2
    events = boto3.client(
        "events",
        endpoint_url=state["endpoint"],
        region_name=state["region"],
        aws_access_key_id=FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        aws_session_token=FAKE_CREDENTIALS["AWS_SESSION_TOKEN"],
    )
    event = make_event(args.kind, args.instance, region=state["region"])
    resp = events.put_events(Entries=[put_entry(event)])
    if resp.get("FailedEntryCount"):
        print(f"spotguard local inject: refused: {resp['Entries']}", file=sys.stderr)
        return 1
    print(f"{args.kind} for {args.instance} put on the bus (event {event['id']})")
    return 0
