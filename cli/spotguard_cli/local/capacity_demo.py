"""`spotguard local demo --scenario capacity`: the capacity policy deciding every launch of a deadline job
on the local stack, on a clock that runs `--time-scale` times faster than the wall clock (60 by default: a
second is a minute for SpotGuard, so a job of hours and its deadline play out in a few minutes).

The cluster has three pools (emulator.pools.LOCAL_POOLS): spot in us-east-1a, spot in us-east-1b, and
on-demand over both. The job (examples/train.py with the agent, committing every few minutes of its time)
has a deadline, and:

1. while it runs, its spot pool runs out of capacity and its instance gets the spot warning: it
   checkpoints, stops, and the policy puts it in the other spot pool;
2. that pool runs out too and its instance is warned: with no spot anywhere and the deadline near, the
   policy puts it on-demand;
3. the first pool's capacity comes back (a new instance): reconcile asks the policy again, which moves
   the job back to spot (SIGUSR1, the checkpoint it asks for, a stop, a relaunch from that checkpoint);
4. it finishes by its deadline.

The proof: each attempt where the story says, every resume from the newest committed checkpoint, 0 steps
redone, final weights equal to an uninterrupted run, finished before the deadline, no dead letters.
Exit status 0 only when every check holds.
"""

from __future__ import annotations

import argparse
import re
import signal
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from spotguard.domain.jobs.model import TERMINAL
from spotguard.domain.jobs.spend import Spend
from spotguard_cli.answers import AttemptView, DecisionView, StatusView
from spotguard_cli.emulator.timeline import Timeline
from spotguard_cli.local.shared import (
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


def run(args: argparse.Namespace, work: Path, say: Any) -> int:
    """The scenario, its arguments checked (demo.py) and `work` emptied; the exit status."""
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
        print_end(work, ok)
    return 0 if ok else 1


def _log_of(work: Path, attempt: AttemptView) -> Path:
    return work / f"task-{attempt.task_arn.rsplit('/', 1)[-1][:8]}.log"


def run_capacity_demo(args: argparse.Namespace, work: Path, say: Any) -> tuple[list, list, dict, Timeline]:
    """Run the scenario; (proof, decisions, facts, timeline)."""
    from spotguard_cli.emulator.motoserver import MotoServer
    from spotguard_cli.emulator.system import LocalSystem
    from spotguard_cli.emulator.timeline import record_calls

    timeline: Timeline = Timeline()
    proof: list[tuple[str, bool]] = []
    facts: dict[str, Any] = {}
    decisions: list[DecisionView] = []
    with MotoServer(log_path=str(work / "moto.log")) as moto:
        say(f"moto server on {moto.endpoint} (pid {moto.proc.pid if moto.proc else '?'})")
        system = LocalSystem(moto.endpoint, work, on_change=timeline.add, time_scale=args.time_scale)
        reference = None
        try:
            record_calls(timeline, [])
            hosts = _add_pools(system, args, say)
            out, ref_out = work / "final-job.pt", work / "final-reference.pt"
            td = task_definition(
                system, out, args.steps, args.step_seconds, checkpoint_seconds=args.checkpoint_seconds
            )
            reference = reference_run(system, ref_out, args.steps, work / "reference.log")
            submitted = system.clock.now()
            deadline = submitted + timedelta(hours=args.deadline_hours)
            _submit(system, td, deadline, args)
            story = _play_story(system, args, work, hosts, timeline, say)
            if reference.wait(timeout=120) != 0:
                raise RuntimeError(f"the reference run failed; see {work / 'reference.log'}")

            decisions = story.final.decisions
            proof, facts = capacity_proof(system, story, deadline, args, work)
            facts["pids"] = [p for p in (moto.proc.pid if moto.proc else None, reference.pid) if p]
            facts["pids"] += system.runner.pids
            facts["submitted_at"] = submitted.isoformat()
        finally:
            system.close()
            if reference is not None and reference.poll() is None:
                reference.send_signal(signal.SIGKILL)
                reference.wait(timeout=10)
    return proof, decisions, facts, timeline


def _add_pools(system: Any, args: argparse.Namespace, say: Any) -> dict[str, Any]:
    """The cluster's three pools, an instance in each, discovered by reconcile; the instances by pool."""
    system.add_pools()
    hosts = {cp: system.add_pool_host(cp) for cp in ("gpu-spot-a", "gpu-spot-b", "gpu-od")}
    system.pump()
    counts = system.functions["ReconcileFunction"].invoke({"id": "local-schedule"})
    say(
        f"cluster {system.cluster.name}: {counts['pools']} pools discovered (spot in us-east-1a and "
        f"us-east-1b, on-demand in both); SpotGuard's clock runs {args.time_scale:g}x"
    )
    return hosts


def _submit(system: Any, td: str, deadline: datetime, args: argparse.Namespace) -> None:
    """Submit the deadline job, with its estimate of work."""
    answer = system.invoke_jobs(
        {
            "action": "submit",
            "job_id": "capacity-demo",
            "request": {"cluster": "gpu-spot", "taskDefinition": td},
            "options": {
                "deadline": deadline.isoformat(),
                "work_hours": args.work_hours,
                "min_move_interval_seconds": 900,
            },
        }
    )
    if not answer.get("ok"):
        raise RuntimeError(f"submit failed: {answer}")


@dataclass(frozen=True)
class Story:
    """How the scenario went: the job's final status, its two spot pools (the first it ran in, the other),
    and when it finished (SpotGuard's time)."""

    final: StatusView
    first_pool: str
    other_pool: str
    finished_at: datetime


def _play_story(
    system: Any, args: argparse.Namespace, work: Path, hosts: dict[str, Any], timeline: Timeline, say: Any
) -> Story:
    """The story's four steps, each waited for: two pools run dry in turn, the first's spot comes back,
    and the job finishes."""

    def status() -> StatusView:
        return system.job_status("capacity-demo")

    def attempts_running(n: int) -> bool:
        s = status()
        return (len(s.attempts) >= n and s.attempts[n - 1].last_status == "RUNNING") or s.state in TERMINAL

    def at_step(n: int, step: int) -> bool:
        s = status()
        if s.state in TERMINAL or len(s.attempts) < n:
            return s.state in TERMINAL
        return max(steps_done(_log_of(work, s.attempts[n - 1])), default=-1) >= step

    timeline.mark_zero()
    timeline.add(
        f"job capacity-demo submitted: {args.work_hours:g} h of work by its estimate, deadline in "
        f"{args.deadline_hours:g} h"
    )
    spot_pools = ["gpu-spot-a", "gpu-spot-b"]
    # 1. its pool runs dry and its instance is warned
    if not system.run_until(lambda: at_step(1, args.first_warning_step), timeout=180):
        raise RuntimeError("the first attempt did not reach its warning step")
    first = status().attempts[0]
    first_pool = (first.pool or "").split("/")[0]
    if first_pool not in spot_pools:
        raise RuntimeError(f"the job did not start on spot: {first}")
    other_pool = next(p for p in spot_pools if p != first_pool)
    system.capacity_shortage(first_pool, seconds=3600)
    system.notice("spot-interruption", hosts[first_pool].instance_id)
    timeline.add(f"{first_pool} has no spot capacity; SPOT WARNING for {hosts[first_pool].instance_id}")
    say(f"{first_pool} out of capacity and its instance warned; the job should go to {other_pool}")
    if not system.run_until(lambda: attempts_running(2), timeout=120):
        raise RuntimeError("the job was not resubmitted after the first warning")
    # 2. the other pool runs dry too, and its instance is warned
    last = max(steps_done(_log_of(work, status().attempts[0])), default=0)
    if not system.run_until(lambda: at_step(2, last + args.second_warning_after), timeout=180):
        raise RuntimeError("the second attempt did not reach its warning step")
    system.capacity_shortage(other_pool, seconds=3600)
    system.notice("spot-interruption", hosts[other_pool].instance_id)
    timeline.add(
        f"{other_pool} has no spot capacity either; SPOT WARNING for {hosts[other_pool].instance_id}"
    )
    say(f"{other_pool} out of capacity too and its instance warned; waiting for the job to finish ...")
    if not system.run_until(lambda: attempts_running(3), timeout=120):
        raise RuntimeError("the job was not resubmitted after the second warning")
    # 3. the first pool's capacity comes back a while later (Auto Scaling launches an instance)
    system.capacity_back_in(first_pool, system.clock.seconds(args.back_after_minutes * 60))
    # 4. the policy moves it back to spot, and it finishes
    system.run_until(lambda: status().state in TERMINAL, timeout=args.timeout, every=0.2)
    final = status()
    finished_at = system.clock.now()
    timeline.add(f"job capacity-demo {final.state} after {len(final.attempts)} attempt(s)")
    return Story(final, first_pool, other_pool, finished_at)


def capacity_proof(
    system: Any, story: Story, deadline: datetime, args: argparse.Namespace, work: Path
) -> tuple[list[tuple[str, bool]], dict[str, Any]]:
    """The checks of the story, from the job's attempts and its task logs; (proof, facts)."""
    final, finished_at = story.final, story.finished_at
    out, ref_out = work / "final-job.pt", work / "final-reference.pt"
    attempts = final.attempts
    texts = [_log_of(work, a).read_text() if _log_of(work, a).exists() else "" for a in attempts]
    executed = [len(re.findall(r"^step \d+ loss", t, re.MULTILINE)) for t in texts]
    saved = [re.search(r"checkpointed after step (\d+): exit 75", t) for t in texts]
    resumed = [re.search(r"resumed after step (\d+)", t) for t in texts]
    handovers = [
        (int(s.group(1)), int(r.group(1)))
        for s, r in zip(saved[:-1], resumed[1:], strict=True)
        if s is not None and r is not None
    ]
    where = [(a.market, (a.pool or "").split("/")[0]) for a in attempts]
    facts: dict[str, Any] = {
        "attempts": where,
        "steps_executed": executed,
        "handovers": handovers,
        "moves_made": final.moves_made,
        "deadline": deadline.isoformat(),
        "finished_at": finished_at.isoformat(),
        "spend": final.spend.model_dump(mode="json") if final.spend is not None else None,
        "dead_letters": system.dead_letters(),
        "time_scale": args.time_scale,
    }
    market = [m for m, _ in where]
    proof = [
        ("the job finished: succeeded", final.state == "succeeded"),
        ("first on spot, in its first pool", where[:1] == [("spot", story.first_pool)]),
        ("after its pool ran dry: spot in the other pool", where[1:2] == [("spot", story.other_pool)]),
        ("with no spot left and the deadline near: on-demand", "on-demand" in market[2:3]),
        (
            "spot back: moved from on-demand to spot at a checkpoint",
            bool(final.moves_made) and market[-1] == "spot" and "on-demand" in market,
        ),
        (
            "every attempt resumed where the last one checkpointed",
            all(s == r for s, r in handovers) and len(handovers) == len(attempts) - 1,
        ),
        ("0 steps lost", sum(executed) == args.steps),
        ("final weights equal to an uninterrupted run", out.exists() and same_weights(out, ref_out)),
        ("finished by its deadline", final.state == "succeeded" and finished_at <= deadline),
        ("nothing in any dead-letter queue", not any(facts["dead_letters"].values())),
        ("every AWS call allowed by its function's role", not system.guard.denied),
        ("its timeline drawn, a bar for every attempt", picture(final, work, facts)),
    ]
    return proof, facts


PRICES_NOTE = "with on-demand at its list price and moto's placeholder spot prices, not what spot costs"


def decision_line(d: DecisionView, start: datetime) -> str:
    """A capacity decision: SpotGuard's time since submit, what asked, where, and why (said once)."""
    since = (d.at or start) - start
    h, m = divmod(int(since.total_seconds() // 60), 60)
    where = {"spot": f"spot in {d.pool}", "on-demand": f"on-demand in {d.pool}"}.get(
        d.placement or "", "wait"
    )
    why = d.reason.removeprefix(f"{where}: ").removeprefix(f"{d.placement}: ")
    cost = f" (${d.expected_cost:.2f} to finish)" if d.expected_cost is not None else ""
    return f"  {h:d}:{m:02d}  {d.trigger or '':<9} {where}: {why}{cost}"


def spend_line(spend: Spend | dict[str, Any]) -> str:
    """What the job spent (a status's, or its JSON), in words, and what its dollars are worth here."""
    from spotguard_cli.jobs.render import spend_text

    spend = spend if isinstance(spend, Spend) else Spend.model_validate(spend)
    note = f", {PRICES_NOTE}" if spend.dollars is not None else ""
    return f"{spend_text(spend)}{note}"


def print_capacity_demo(
    proof: list, decisions: list[DecisionView], facts: dict, timeline: Timeline, as_json: bool
) -> bool:
    ok = passed(proof)
    if as_json:
        print_json(ok, timeline, proof, facts, decisions=[d.model_dump(mode="json") for d in decisions])
        return ok
    print_timeline(timeline, "wall-clock seconds since the job was submitted")
    if decisions and facts.get("submitted_at"):
        start = datetime.fromisoformat(facts["submitted_at"])
        print("\ncapacity decisions (SpotGuard's time since submit, and why):")
        for d in decisions:
            print(decision_line(d, start))
    print_proof(proof)
    if facts.get("spend"):
        print(f"\n{spend_line(facts['spend'])}")
    return ok
