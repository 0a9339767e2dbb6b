"""The gang scenario's nodes: torchrun's command line for each, the uninterrupted reference gang, and the
job's tasks as ECS and the local stack's runner know them (`local demo --scenario gang`, gang.py)."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spotguard_cli.emulator.template import REPO
from spotguard_cli.local.shared import train_args

DDP = REPO / "examples" / "train_ddp.py"
NODES = 2
JOB_ID = "gang"
FIRST_PORT = 29500  # torchrun's own default; the first free one from here is the rendezvous port
STARTED_BY = re.compile(r"^spotguard/(?P<job>[^/]+)/(?P<attempt>\d+)(?:/(?P<node>\d+))?$")


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
