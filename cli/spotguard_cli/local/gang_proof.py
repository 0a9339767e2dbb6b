"""The gang scenario's proof (`local demo --scenario gang`, gang.py): its checks, read from what ECS, the
runner, the task logs and the bucket say.

The proof: both nodes stopped on one checkpoint at the same step, exactly one relaunch of both (attempt 2
with 2 tasks, attempt 1's 2 tasks stopped), 0 steps lost, final weights equal to the uninterrupted
2-node run, nothing dead-lettered. Exit status 0 only when every check holds.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from spotguard_cli.local.gang_nodes import NODES, NodeTask, of_attempt
from spotguard_cli.local.shared import picture, same_weights

# what each node's wrapper says once its ranks stopped on a committed checkpoint
STOPPED_ON = re.compile(r"stopped on committed checkpoint (\d+) \(step (\d+); [^)]*\): exit 75")


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


@dataclass(frozen=True)
class GangReadings:
    """What the run left to check: its tasks by attempt, what each node was told, the checkpoint the first
    gang stopped on and the second resumed from, and the steps run and lost."""

    first: list[NodeTask]
    second: list[NodeTask]
    attempts: list[int]
    addresses: dict[int, str | None]  # each attempt's node 0's private address
    rendezvous_ok: bool
    stops: list[re.Match[str] | None]  # what each node of the first gang said it stopped on
    stopped_on: set[tuple[int, int]]
    sequence: int | None
    step: int | None
    resume_from: str
    manifest: dict[str, Any] | None
    executed: list[int]
    lost: int | None


def read_gang(system: Any, tasks: list[NodeTask], port: int) -> GangReadings:
    """The readings of the story, from what ECS, the runner, the task logs and the bucket say."""
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
    rendezvous_ok = _rendezvous_told(tasks, addresses, port)
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
    return GangReadings(
        first=first,
        second=second,
        attempts=attempts,
        addresses=addresses,
        rendezvous_ok=rendezvous_ok,
        stops=stops,
        stopped_on=stopped_on,
        sequence=sequence,
        step=step,
        resume_from=resume_from,
        manifest=manifest,
        executed=executed,
        lost=lost,
    )


def _rendezvous_told(tasks: list[NodeTask], addresses: dict[int, str | None], port: int) -> bool:
    """Whether each node 1 was told its node 0's private address and the port, and every node the gang's
    size and its rank (node 0, hosting the rendezvous, no address)."""
    peers = [t for t in tasks if t.node > 0]
    return (
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
    r = read_gang(system, tasks, port)
    first, second, attempts, manifest, sequence = r.first, r.second, r.attempts, r.manifest, r.sequence
    out, ref_out = work / "final-job.pt", work / "final-reference.pt"
    dead = system.dead_letters()
    facts = _gang_facts(r, tasks, warned, port, dead)
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
        ("each node 1 was told its node 0's private address and the rendezvous port", r.rendezvous_ok),
        (
            "both nodes checkpointed at the same step: one manifest of both ranks",
            len(r.stops) == NODES
            and all(r.stops)
            and sequence is not None
            and manifest is not None
            and manifest.get("step") == r.step
            and ranks_in(manifest) == set(range(NODES))
            and r.resume_from.endswith(f"/checkpoints/{sequence:010d}/MANIFEST.json"),
        ),
        ("attempt 1's 2 tasks stopped, both with exit 75", [t.exit_code for t in first] == [75] * NODES),
        (
            "one relaunch of both: attempt 2 with 2 tasks, from that checkpoint",
            attempts == [1, 2] and len(second) == NODES and bool(r.resume_from),
        ),
        (
            "attempt 2 away from the warned instance and its pool (the other zone)",
            bool(second)
            and warned.instance_id not in {t.instance_id for t in second}
            and zone.get(warned.instance_id) not in {zone.get(t.instance_id) for t in second},
        ),
        ("0 steps lost", r.lost == 0 and sum(r.executed) == args.steps),
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


def _gang_facts(
    r: GangReadings, tasks: list[NodeTask], warned: NodeTask, port: int, dead: dict[str, int]
) -> dict[str, Any]:
    """The scenario's facts (its --json): the tasks, what was told and checkpointed, the steps."""
    return {
        "tasks": [
            {k: v for k, v in asdict(t).items() if k in ("attempt", "node", "instance_id", "exit_code")}
            for t in tasks
        ],
        "warned_instance": warned.instance_id,
        "rendezvous": {
            "port": port,
            "node0_private_addresses": {str(a): ip for a, ip in r.addresses.items()},
        },
        "stopped_on": sorted(r.stopped_on),
        "resume_from": r.resume_from,
        "manifest_step": (r.manifest or {}).get("step"),
        "manifest_ranks": sorted(ranks_in(r.manifest)),
        "steps_executed": r.executed,
        "steps_lost": r.lost,
        "dead_letters": dead,
    }
