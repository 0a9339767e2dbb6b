"""`spotguard local demo --scenario gang`: a job of 2 nodes (options.nodes 2), one process each, trained
as one (examples/train_ddp.py under `spotguard-agent run -- torchrun`, gloo over 127.0.0.1), one node's
instance warned, and the whole gang checkpointed, stopped and relaunched once.

The cluster has four simulated GPU spot instances, two in us-east-1a and two in us-east-1b (one GPU
each). SpotGuard launches node 0, then, once it runs, node 1 on another instance, told node 0's private
address (the runner makes it 127.0.0.1: every instance here is this machine). At step --interrupt-at the
spot interruption warning for node 1's instance goes on the bus: SpotGuard drains it and stops node 1's
task (SIGTERM to its first process, the agent's wrapper); the agent makes the stop every rank's, both
nodes commit one checkpoint (one manifest, written by rank 0) and both exit 75; SpotGuard relaunches the
gang once, from that checkpoint, away from the warned instance and its pool: attempt 2, two tasks in
us-east-1b. The same training never interrupted runs beside it (two torchruns on another port).

What the scenario proves, and how, is gang_proof.py's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from spotguard.domain.jobs.model import TERMINAL
from spotguard_cli.answers import StatusView
from spotguard_cli.emulator.timeline import Timeline, checkpoint_name
from spotguard_cli.local.gang_nodes import (
    JOB_ID,
    NODES,
    NodeTask,
    free_port,
    gang_tasks,
    node_command,
    of_attempt,
    reference_gang,
)
from spotguard_cli.local.gang_proof import gang_proof
from spotguard_cli.local.shared import (
    add_spot_hosts,
    passed,
    print_end,
    print_json,
    print_proof,
    print_timeline,
    steps_done,
)


def run(args: argparse.Namespace, work: Path, say: Any) -> int:
    """The scenario, its arguments checked (demo.py) and `work` emptied; the exit status."""
    started = time.monotonic()
    proof, facts, timeline = run_gang_demo(args, work, say)
    facts["wall_seconds"] = round(time.monotonic() - started, 1)
    ok = print_gang_demo(proof, facts, timeline, args.json)
    if not args.json:
        print_end(work, ok)
    return 0 if ok else 1


def run_gang_demo(
    args: argparse.Namespace, work: Path, say: Any
) -> tuple[list[tuple[str, bool]], dict[str, Any], Timeline]:
    """Run the scenario; (proof, facts, timeline)."""
    from spotguard_cli.emulator.motoserver import MotoServer
    from spotguard_cli.emulator.system import LocalSystem
    from spotguard_cli.emulator.timeline import record_calls

    timeline = Timeline()
    proof: list[tuple[str, bool]] = []
    facts: dict[str, Any] = {}
    with MotoServer(log_path=str(work / "moto.log")) as moto:
        say(f"moto server on {moto.endpoint} (pid {moto.proc.pid if moto.proc else '?'})")
        system = LocalSystem(moto.endpoint, work, on_change=timeline.add)
        reference: list[subprocess.Popen[bytes]] = []
        try:
            say(f"stack deployed from template.yaml: {', '.join(system.stack.functions)}")
            record_calls(timeline, [])
            _add_gang_hosts(system, say)
            system.pump()
            port = free_port()
            reference_port = free_port(port + 1)
            out, ref_out = work / "final-job.pt", work / "final-reference.pt"
            td = _gang_task_definition(system, out, args)
            reference = reference_gang(system, ref_out, args.steps, reference_port, work)
            _submit_gang(system, td, port, args, timeline, say)
            warned = _warn_node_1(system, args, work, timeline, say)
            status = _until_over(system, timeline)
            for p in reference:
                if p.wait(timeout=180) != 0:
                    raise RuntimeError(f"the reference run failed; see {work}/reference-node*.log")
            # the tasks' last exits are in: every process of the job has ended
            system.pump()
            tasks = gang_tasks(system)
            proof, facts = gang_proof(system, tasks, warned, status, args, port, work)
            facts["pids"] = [p for p in (moto.proc.pid if moto.proc else None,) if p]
            facts["pids"] += [p.pid for p in reference] + system.runner.pids
        finally:
            system.close()
            _kill_reference(reference)
    return proof, facts, timeline


def _add_gang_hosts(system: Any, say: Any) -> None:
    """The cluster's four spot instances, two in us-east-1a and two in us-east-1b, one GPU each."""
    _, names = add_spot_hosts(system, "g5.xlarge", 2)
    say(f"cluster {system.cluster.name}: spot instances {names}, one GPU each")


def _gang_task_definition(system: Any, out: Path, args: argparse.Namespace) -> str:
    """The nodes' task definition: the agent's wrapper over torchrun, on the instances' network."""
    td: str = system.task_definition(
        node_command(out, args.steps, args.step_seconds),
        gpus=1,
        # the stop budget is the container's stopTimeout (60 s here), as docs/agent.md says
        environment={
            "SPOTGUARD_CHECKPOINT_INTERVAL_SECONDS": "2",
            "SPOTGUARD_STOP_TIMEOUT_SECONDS": "60",
            "OMP_NUM_THREADS": "1",
        },
        family="train-gang",
        network_mode="host",  # the nodes reach each other at their instances' addresses
    )
    return td


def _submit_gang(
    system: Any, td: str, port: int, args: argparse.Namespace, timeline: Timeline, say: Any
) -> None:
    """Submit the job of NODES nodes, node 0 hosting the rendezvous on `port`."""
    answer = system.invoke_jobs(
        {
            "action": "submit",
            "job_id": JOB_ID,
            "request": {"cluster": "gpu-spot", "taskDefinition": td},
            "options": {"nodes": NODES, "rendezvous_port": port},
        }
    )
    if not answer.get("ok"):
        raise RuntimeError(f"submit failed: {answer}")
    timeline.add(f"job {JOB_ID} submitted: {NODES} nodes, rendezvous port {port}")
    say(f"job submitted ({NODES} nodes, rendezvous port {port}); training until step {args.interrupt_at} ...")


def _warn_node_1(system: Any, args: argparse.Namespace, work: Path, timeline: Timeline, say: Any) -> NodeTask:
    """Once the first gang reached step --interrupt-at, the spot warning for node 1's instance; its task."""

    def first_gang_at_step() -> bool:
        first = of_attempt(gang_tasks(system), 1)
        return (
            len(first) == NODES and max(steps_done(first[0].log), default=-1) >= args.interrupt_at
        ) or system.job_status(JOB_ID).state in TERMINAL

    if not system.run_until(first_gang_at_step, timeout=180):
        raise RuntimeError(
            f"the gang did not reach step {args.interrupt_at}: "
            f"{len(of_attempt(gang_tasks(system), 1))} of {NODES} tasks placed; see {work}"
        )
    first = of_attempt(gang_tasks(system), 1)
    if len(first) != NODES:
        raise RuntimeError(f"the job ended before its gang ran: {system.job_status(JOB_ID).state}")
    warned = first[1]  # node 1's instance: a warning for a node that is not the rendezvous host
    timeline.mark_zero()
    system.notice("spot-interruption", warned.instance_id)
    timeline.add(f"SPOT INTERRUPTION WARNING for {warned.instance_id} (node 1 of attempt 1) put on the bus")
    say(f"spot interruption warning sent for {warned.instance_id} (node 1)")
    return warned


def _until_over(system: Any, timeline: Timeline) -> StatusView:
    """Run until the job has ended (or was relaunched a second time); its status."""

    def over() -> bool:  # finished, or a second relaunch, which the story has not (fail fast)
        ended = system.job_status(JOB_ID).state in TERMINAL
        return ended or any(t.attempt > 2 for t in gang_tasks(system))

    system.run_until(over, timeout=300, every=0.2)
    status = system.job_status(JOB_ID)
    timeline.add(f"job {JOB_ID} {status.state}")
    return status


def _kill_reference(reference: list[subprocess.Popen[bytes]]) -> None:
    """End the reference gang's torchruns still running, each with its process group."""
    for p in reference:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)


def print_gang_demo(
    proof: list[tuple[str, bool]], facts: dict[str, Any], timeline: Timeline, as_json: bool
) -> bool:
    ok = passed(proof)
    if as_json:
        print_json(ok, timeline, proof, facts)
        return ok
    print_timeline(timeline, "seconds since the warning was put on the bus")
    print_proof(proof)
    if facts.get("stopped_on"):
        (sequence, step), *_ = facts["stopped_on"]
        print(
            f"\nboth nodes stopped on checkpoint {sequence} (step {step}); attempt 2 resumed from "
            f"{checkpoint_name(facts.get('resume_from'))} on {len(facts.get('manifest_ranks') or [])} ranks"
        )
    if "wall_seconds" in facts:
        print(f"scenario wall time: {facts['wall_seconds']:.0f} s")
    return ok
