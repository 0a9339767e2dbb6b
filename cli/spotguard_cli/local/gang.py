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

The proof: both nodes stopped on one checkpoint at the same step, exactly one relaunch of both (attempt 2
with 2 tasks, attempt 1's 2 tasks stopped), 0 steps lost, final weights equal to the uninterrupted
2-node run, nothing dead-lettered. Exit status 0 only when every check holds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from spotguard.domain.jobs.model import TERMINAL
from spotguard_cli.emulator.template import REPO
from spotguard_cli.emulator.timeline import Timeline, checkpoint_name
from spotguard_cli.local.shared import (
    passed,
    picture,
    print_end,
    print_json,
    print_proof,
    print_timeline,
    same_weights,
    steps_done,
    train_args,
)

DDP = REPO / "examples" / "train_ddp.py"
NODES = 2
JOB_ID = "gang"
FIRST_PORT = 29500  # torchrun's own default; the first free one from here is the rendezvous port
STARTED_BY = re.compile(r"^spotguard/(?P<job>[^/]+)/(?P<attempt>\d+)(?:/(?P<node>\d+))?$")
# what each node's wrapper says once its ranks stopped on a committed checkpoint
STOPPED_ON = re.compile(r"stopped on committed checkpoint (\d+) \(step (\d+); [^)]*\): exit 75")


@dataclass(frozen=True)
class NodeTask:
    """A task of the gang, as ECS and the local stack's runner know it."""

    arn: str
    attempt: int
    node: int
    instance_id: str
    environment: dict[str, str]  # the SpotGuard (and torchrun) environment RunTask gave it
    exit_code: int | None  # None while it runs
    log: Path

    @property
    def short(self) -> str:
        return self.arn.rsplit("/", 1)[-1][:8]


def free_port(start: int = FIRST_PORT, taken: tuple[int, ...] = ()) -> int:
    """The first port from `start` that nothing listens on at 127.0.0.1 (below the ephemeral range, so
    no connection's own port takes it while the demo runs)."""
    for port in range(start, start + 1000):
        if port in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port from {start} to {start + 999} on 127.0.0.1")


def ddp_torchrun(
    out: Path, steps: int, step_seconds: float | None = None, rendezvous: tuple[int, int] | None = None
) -> list[str]:
    """torchrun of examples/train_ddp.py, one process a node, its final weights written to `out`. With
    `rendezvous` (a node's rank, a port) its command line says the gang: that node of NODES, node 0 hosting
    the rendezvous at 127.0.0.1:port; without, torchrun reads all that from the PET_ environment SpotGuard
    sets."""
    gang: list[str] = []
    if rendezvous is not None:
        node, port = rendezvous
        gang = ["--nnodes", str(NODES), "--node-rank", str(node)]
        gang += ["--master-addr", "127.0.0.1", "--master-port", str(port)]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *gang,
        "--nproc-per-node",
        "1",
        str(DDP),
        *train_args(steps, out, step_seconds),
    ]


def node_command(out: Path, steps: int, step_seconds: float) -> list[str]:
    """The task's command: the agent's wrapper over torchrun, with nothing about the gang in it:
    torchrun reads the node count, its rank and the rendezvous from the PET_ environment SpotGuard sets."""
    wrapper = [sys.executable, "-m", "spotguard_agent.wrapper", "run", "--"]
    return [*wrapper, *ddp_torchrun(out, steps, step_seconds)]


def reference_gang(
    system: Any, out: Path, steps: int, port: int, work: Path
) -> list[subprocess.Popen[bytes]]:
    """The same 2-node training, never interrupted: two torchruns on this machine (node 0 hosting the
    rendezvous at 127.0.0.1:port), with a checkpoint prefix of their own."""
    from spotguard_cli.emulator.runner import local_environment

    env = {
        **local_environment(system.stack.endpoint, system.stack.region),
        "SPOTGUARD_CHECKPOINT_URI": f"s3://{system.stack.outputs['CheckpointBucketName']}/reference/",
        "SPOTGUARD_JOB_ID": "reference",
        "OMP_NUM_THREADS": "1",
    }
    procs = []
    for node in range(NODES):
        procs.append(
            subprocess.Popen(
                ddp_torchrun(out, steps, rendezvous=(node, port)),
                stdout=(work / f"reference-node{node}.log").open("wb"),
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group: torchrun's workers end with it
            )
        )
    return procs


def gang_tasks(system: Any) -> list[NodeTask]:
    """Every task of the job that the local stack placed, by attempt and node (from its startedBy:
    spotguard/<job>/<attempt> for node 0, .../<attempt>/<k> for node k), whatever the job's status says."""
    arns = list(system.scheduler.placed)
    hosts = {h.container_instance_arn: h.instance_id for h in system.cluster.hosts}
    out: list[NodeTask] = []
    for i in range(0, len(arns), 100):
        for arn, task in system.cluster.tasks(arns[i : i + 100]).items():
            m = STARTED_BY.fullmatch(task.get("startedBy") or "")
            if not m or m["job"] != JOB_ID:
                continue
            env = {
                e["name"]: e.get("value", "")
                for c in (task.get("overrides") or {}).get("containerOverrides") or []
                for e in c.get("environment") or []
            }
            out.append(
                NodeTask(
                    arn=arn,
                    attempt=int(m["attempt"]),
                    node=int(m["node"] or 0),
                    instance_id=hosts.get(system.scheduler.placed[arn], "?"),
                    environment=env,
                    exit_code=system.runner.finished.get(arn),
                    log=system.log_dir / f"task-{arn.rsplit('/', 1)[-1][:8]}.log",
                )
            )
    return sorted(out, key=lambda t: (t.attempt, t.node))


def of_attempt(tasks: list[NodeTask], attempt: int) -> list[NodeTask]:
    return [t for t in tasks if t.attempt == attempt]


def private_address(system: Any, instance_id: str) -> str | None:
    """The instance's private address, as SpotGuard reads it (EC2 DescribeInstances)."""
    ec2 = system.stack.client("ec2")
    for r in ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]:
        for i in r["Instances"]:
            return str(i.get("PrivateIpAddress") or "") or None
    return None


def read_manifest(system: Any, uri: str) -> dict[str, Any] | None:
    """A checkpoint's MANIFEST.json from the stack's bucket (s3://bucket/key), None when it is not there."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    if not bucket or not key:
        return None
    try:
        body = system.stack.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
    except Exception:  # a missing key is the check's failure, said by the proof
        return None
    manifest = json.loads(body)
    return manifest if isinstance(manifest, dict) else None


def ranks_in(manifest: dict[str, Any] | None) -> set[int]:
    """The ranks whose DCP files (__<rank>_<n>.distcp) a manifest lists."""
    out = set()
    for f in (manifest or {}).get("files") or []:
        m = re.fullmatch(r"__(\d+)_\d+\.distcp", str(f.get("path", "")).rsplit("/", 1)[-1])
        if m:
            out.add(int(m.group(1)))
    return out


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
            hosts = [system.add_host("g5.xlarge", zone) for zone in ("us-east-1a",) * 2 + ("us-east-1b",) * 2]
            names = {h.instance_id: f"{h.instance_id} ({h.availability_zone[-2:]})" for h in hosts}
            say(f"cluster {system.cluster.name}: spot instances {', '.join(names.values())}, one GPU each")
            system.pump()
            port = free_port()
            reference_port = free_port(port + 1)
            out, ref_out = work / "final-job.pt", work / "final-reference.pt"
            td = system.task_definition(
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
            reference = reference_gang(system, ref_out, args.steps, reference_port, work)
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
            say(
                f"job submitted ({NODES} nodes, rendezvous port {port}); "
                f"training until step {args.interrupt_at} ..."
            )

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
            timeline.add(
                f"SPOT INTERRUPTION WARNING for {warned.instance_id} (node 1 of attempt 1) put on the bus"
            )
            say(f"spot interruption warning sent for {warned.instance_id} (node 1)")

            def over() -> bool:  # finished, or a second relaunch, which the story has not (fail fast)
                ended = system.job_status(JOB_ID).state in TERMINAL
                return ended or any(t.attempt > 2 for t in gang_tasks(system))

            system.run_until(over, timeout=300, every=0.2)
            status = system.job_status(JOB_ID)
            timeline.add(f"job {JOB_ID} {status.state}")
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
            for p in reference:
                if p.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(p.pid, signal.SIGKILL)
                    p.wait(timeout=10)
    return proof, facts, timeline


def gang_proof(
    system: Any,
    tasks: list[NodeTask],
    warned: NodeTask,
    status: Any,
    args: argparse.Namespace,
    port: int,
    work: Path,
) -> tuple[list[tuple[str, bool]], dict[str, Any]]:
    """The checks of the story, from what ECS, the runner, the task logs and the bucket say."""
    first, second = of_attempt(tasks, 1), of_attempt(tasks, 2)
    attempts = sorted({t.attempt for t in tasks})
    texts = {t.arn: t.log.read_text() if t.log.exists() else "" for t in tasks}
    # each attempt's node 1 was told its node 0's private address (moto's EC2) and the port asked for
    addresses = {
        a: private_address(system, t.instance_id)
        for a in attempts
        for t in of_attempt(tasks, a)
        if t.node == 0
    }
    peers = [t for t in tasks if t.node > 0]
    rendezvous_ok = (
        bool(peers)
        and all(
            addresses.get(t.attempt)
            and t.environment.get("PET_MASTER_ADDR") == addresses[t.attempt]
            and t.environment.get("SPOTGUARD_RENDEZVOUS") == f"{addresses[t.attempt]}:{port}"
            for t in peers
        )
        and all(
            t.environment.get("PET_MASTER_PORT") == str(port)
            and t.environment.get("PET_NNODES") == str(NODES)
            and t.environment.get("PET_NODE_RANK") == str(t.node)
            and (t.node > 0 or "PET_MASTER_ADDR" not in t.environment)  # node 0 hosts it
            for t in tasks
        )
    )
    # each node's wrapper says which checkpoint (and step) its ranks stopped on
    stops = [STOPPED_ON.search(texts[t.arn]) for t in first]
    stopped_on = {(int(m.group(1)), int(m.group(2))) for m in stops if m}
    sequence, step = next(iter(stopped_on)) if len(stopped_on) == 1 else (None, None)
    resumes = {t.environment.get("SPOTGUARD_RESUME_FROM", "") for t in second}
    resume_from = next(iter(resumes)) if len(resumes) == 1 else ""
    manifest = read_manifest(system, resume_from) if resume_from else None
    node0 = [texts[t.arn] for t in tasks if t.node == 0]
    executed = [len(re.findall(r"^step \d+ loss", t, re.MULTILINE)) for t in node0]
    saved = re.search(r"checkpointed after step (\d+): exit 75", node0[0]) if node0 else None
    resumed = re.search(r"resumed after step (\d+) on 2 rank", node0[1]) if len(node0) > 1 else None
    lost = int(saved.group(1)) - int(resumed.group(1)) if saved and resumed else None
    out, ref_out = work / "final-job.pt", work / "final-reference.pt"
    dead = system.dead_letters()
    facts: dict[str, Any] = {
        "tasks": [
            {k: v for k, v in asdict(t).items() if k in ("attempt", "node", "instance_id", "exit_code")}
            for t in tasks
        ],
        "warned_instance": warned.instance_id,
        "rendezvous": {"port": port, "node0_private_addresses": {str(a): ip for a, ip in addresses.items()}},
        "stopped_on": sorted(stopped_on),
        "resume_from": resume_from,
        "manifest_step": (manifest or {}).get("step"),
        "manifest_ranks": sorted(ranks_in(manifest)),
        "steps_executed": executed,
        "steps_lost": lost,
        "dead_letters": dead,
    }
    zone = {h.instance_id: h.availability_zone for h in system.cluster.hosts}
    one_zone = all(
        len({t.instance_id for t in of_attempt(tasks, a)}) == NODES
        and len({zone.get(t.instance_id) for t in of_attempt(tasks, a)}) == 1
        for a in attempts
    )
    proof = [
        ("the job finished: succeeded", status.state == "succeeded"),
        (
            "a gang of 2 each attempt: 2 tasks on 2 instances of one zone",
            len(first) == NODES and len(second) == NODES and one_zone,
        ),
        ("each node 1 was told its node 0's private address and the rendezvous port", rendezvous_ok),
        (
            "both nodes checkpointed at the same step: one manifest of both ranks",
            len(stops) == NODES
            and all(stops)
            and sequence is not None
            and manifest is not None
            and manifest.get("step") == step
            and ranks_in(manifest) == set(range(NODES))
            and resume_from.endswith(f"/checkpoints/{sequence:010d}/MANIFEST.json"),
        ),
        ("attempt 1's 2 tasks stopped, both with exit 75", [t.exit_code for t in first] == [75] * NODES),
        (
            "one relaunch of both: attempt 2 with 2 tasks, from that checkpoint",
            attempts == [1, 2] and len(second) == NODES and bool(resume_from),
        ),
        (
            "attempt 2 away from the warned instance and its pool (the other zone)",
            bool(second)
            and warned.instance_id not in {t.instance_id for t in second}
            and zone.get(warned.instance_id) not in {zone.get(t.instance_id) for t in second},
        ),
        ("0 steps lost", lost == 0 and sum(executed) == args.steps),
        ("final weights equal to an uninterrupted 2-node run", out.exists() and same_weights(out, ref_out)),
        (
            "the warned instance was drained",
            any(
                h.instance_id == warned.instance_id
                and system.cluster.describe_host(h)["status"] == "DRAINING"
                for h in system.cluster.hosts
            ),
        ),
        ("nothing in any dead-letter queue", not any(dead.values())),
        ("every AWS call allowed by its function's role", not system.guard.denied),
        ("its timeline drawn, a bar for every attempt", picture(status, work, facts)),
    ]
    return proof, facts


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
