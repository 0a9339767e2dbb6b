"""`spotguard jobs` for a multi-node job against the stack in moto: `submit --nodes 2` (and the 2-node
example spec), `status` as the gang forms, runs and loses a node, and `logs` with both nodes' streams
in time order, each line named by its node."""

from __future__ import annotations

import contextlib
import io
import json
import time
from pathlib import Path
from typing import Any

import pytest

from spotguard_cli import jobs as jobs_cli
from spotguard_cli.emulator.gpucluster import gpu_container
from spotguard_cli.emulator.world import JobsWorld
from spotguard_cli.main import build_parser

pytestmark = pytest.mark.slow  # every test deploys the stack into moto

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "jobs"
GROUP = "/spotguard/jobs"


def _run(jobs: JobsWorld, *argv: str) -> tuple[int, list[str], str]:
    args = build_parser().parse_args(["jobs", "--region", "us-east-1", *argv])
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):
        code = jobs_cli.run(
            args, invoke=jobs.invoke, out=out, aws=lambda service, region=None: jobs.stack.client(service)
        )
    return code, out.getvalue().splitlines(), err.getvalue()


def _env(request: dict[str, Any]) -> dict[str, str]:
    (override,) = request["overrides"]["containerOverrides"]
    return {e["name"]: e["value"] for e in override["environment"]}


def _logged_task_definition(jobs: JobsWorld) -> str:
    """A 1-GPU task definition whose container logs to CloudWatch Logs (the emulator's logs nowhere)."""
    container = gpu_container(
        1,
        logConfiguration={
            "logDriver": "awslogs",
            "options": {"awslogs-group": GROUP, "awslogs-stream-prefix": "train"},
        },
    )
    ecs = jobs.stack.client("ecs")
    td = ecs.register_task_definition(
        family="gang-1gpu", networkMode="host", containerDefinitions=[container]
    )
    jobs.stack.client("logs").create_log_group(logGroupName=GROUP)
    return str(td["taskDefinition"]["taskDefinitionArn"])


def _say(jobs: JobsWorld, arn: str, at_ms: int, message: str) -> None:
    logs = jobs.stack.client("logs")
    stream = f"train/train/{arn.rsplit('/', 1)[-1]}"
    with contextlib.suppress(logs.exceptions.ResourceAlreadyExistsException):
        logs.create_log_stream(logGroupName=GROUP, logStreamName=stream)
    logs.put_log_events(
        logGroupName=GROUP, logStreamName=stream, logEvents=[{"timestamp": at_ms, "message": message}]
    )


def _rows(lines: list[str], attempt: int) -> list[str]:
    """An attempt's row in the status table and the lines under it, up to the next attempt's row."""
    start = next(i for i, x in enumerate(lines) if x.startswith(f"{attempt}  "))
    end = next(
        (i for i, x in enumerate(lines[start + 1 :], start + 1) if not x.startswith("   ")), len(lines)
    )
    return lines[start:end]


def test_a_two_node_job_from_submit_to_status_and_logs(jobs: JobsWorld):
    jobs.hosts["a1b"] = jobs.cluster.add_host("g5.xlarge", "us-east-1a")
    jobs.hosts["b1b"] = jobs.cluster.add_host("g5.xlarge", "us-east-1b")
    td = _logged_task_definition(jobs)
    code, out, err = _run(
        jobs, "submit", "--cluster", "gpu-spot", "--task-definition", td, "--launch-type", "EC2",
        "--job-id", "gang", "--nodes", "2", "--rendezvous-port", "29600",
    )  # fmt: skip
    assert code == 0, err
    (first,) = jobs.scheduler.requests  # node 0 alone until it runs
    env = _env(first)
    assert (env["PET_NNODES"], env["PET_NODE_RANK"], env["PET_MASTER_PORT"]) == ("2", "0", "29600")

    code, out, err = _run(jobs, "status", "gang")
    assert code == 0, err
    assert out[0] == "job gang: running  (2 nodes x 1 GPU, 1 attempt(s))"
    rows = _rows(out, 1)
    assert rows[1] == "   gang of 2 nodes: forming: 0 of 2 nodes running"
    assert rows[2].split()[:2] == ["node", "0"] and rows[3].split() == [
        "node",
        "1",
        "-",
        "not",
        "launched",
        "yet",
    ]

    status = jobs.status("gang")
    arn0 = status["attempts"][0]["task_arn"]
    jobs.emit(arn0)  # node 0 runs: node 1 is launched with its address
    (peer,) = jobs.status("gang")["attempts"][0]["peers"]
    arn1 = peer["task_arn"]
    jobs.emit(arn1)
    status = jobs.status("gang")
    assert status["attempts"][0]["formed_at"]
    code, out, err = _run(jobs, "status", "gang")
    rows = _rows(out, 1)
    assert rows[1].startswith("   gang of 2 nodes: formed ")
    for k, arn in enumerate((arn0, arn1)):
        node = status["attempts"][0]["peers"][0] if k else status["attempts"][0]
        fields = rows[2 + k].split()
        assert fields[:5] == ["node", str(k), arn.rsplit("/", 1)[-1][:12], "RUNNING", node["instance_id"]]
        assert fields[5] == f"g5.xlarge/{node['availability_zone']}"

    # each node's lines, in turns a second apart: interleaved in time order, each named by its node
    now = int(time.time() * 1000) - 60_000
    for i, (arn, text) in enumerate(
        [(arn0, "rank 0: up"), (arn1, "rank 1: up"), (arn0, "rank 0: step 1"), (arn1, "rank 1: step 1")]
    ):
        _say(jobs, arn, now + 1000 * i, text)
    code, out, err = _run(jobs, "logs", "gang")
    assert code == 0, err
    assert out[0].startswith("--- attempt 1: 2 nodes, node 0's task ")
    assert out[1:5] == [
        "[node 0] rank 0: up",
        "[node 1] rank 1: up",
        "[node 0] rank 0: step 1",
        "[node 1] rank 1: step 1",
    ]
    code, out, err = _run(jobs, "logs", "gang", "--node", "1")
    assert code == 0 and out[1:3] == ["rank 1: up", "rank 1: step 1"]

    # node 1's host goes without a notice: node 0 is stopped, and the gang relaunched once
    lost = next(h for h in jobs.hosts.values() if h.container_instance_arn == jobs.scheduler.placed[arn1])
    jobs.stop(arn1, reason=f"Host EC2 (instance {lost.instance_id}) terminated.", exit_code=137)
    jobs.emit(arn1, exit_code=137)
    jobs.emit(arn0, exit_code=143)
    code, out, err = _run(jobs, "status", "gang")
    assert code == 0 and out[0] == "job gang: running  (2 nodes x 1 GPU, 2 attempt(s))"
    rows = _rows(out, 1)
    assert "resubmit" in rows[0] and "; stopped whole " in rows[1]
    assert rows[2].split()[3] == "STOPPED" and "exit 143" in rows[2]
    assert rows[3].split()[3] == "STOPPED" and "exit 137" in rows[3] and "resubmit (" in rows[3]
    assert _rows(out, 2)[1] == "   gang of 2 nodes: forming: 0 of 2 nodes running"

    code, out, err = _run(jobs, "logs", "gang")
    assert code == 0, err
    between = next(x for x in out if x.startswith("--- attempt 1 stopped"))
    assert "-> attempt 2 (2 nodes, node 0's task " in between

    code, out, err = _run(jobs, "--json", "status", "gang")
    answer = json.loads("\n".join(out))
    a1 = answer["job"]["attempts"][0]
    assert a1["nodes"] == 2 and a1["peers"][0]["exit_codes"] == {"train": 137}


def test_the_two_node_example_spec_submits_a_gang_on_host_networking(jobs: JobsWorld):
    code, _, err = _run(jobs, "submit", str(EXAMPLES / "train-2node.yaml"))
    assert code == 0, err
    ecs = jobs.stack.client("ecs")
    (arn,) = ecs.list_task_definitions(familyPrefix="spotguard-train-2node-8gpu")["taskDefinitionArns"]
    td = ecs.describe_task_definition(taskDefinition=arn)["taskDefinition"]
    assert td["networkMode"] == "host"
    status = jobs.status("train-2node")
    assert (status["options"]["nodes"], status["options"]["rendezvous_port"]) == (2, 29500)
    (request,) = jobs.scheduler.requests  # node 0, on an 8-GPU instance
    assert _env(request)["PET_NNODES"] == "2" and request["taskDefinition"] == arn
    placed = jobs.scheduler.placed[status["attempts"][0]["task_arn"]]
    assert (
        next(h for h in jobs.hosts.values() if h.container_instance_arn == placed).instance_type
        == "g5.48xlarge"
    )
