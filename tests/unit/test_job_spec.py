"""Job specs (spotguard_cli.jobs.spec): what a user writes becomes the task definition SpotGuard registers
and the RunTask request the jobs function takes; every bad field is one line naming it."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from spotguard.domain.jobs.commands import CommandError, parse_command
from spotguard_cli.jobs.payload import job_spec
from spotguard_cli.jobs.spec import (
    command_of,
    family,
    load_spec,
    run_task_request,
    spec_payload,
    task_definition,
)
from spotguard_cli.main import build_parser

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "jobs"
MINIMAL = {"cluster": "gpu-spot", "image": "repo/train:1", "command": "python train.py --epochs 3"}


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["jobs", "submit", *argv])


@pytest.mark.parametrize("gpus", [1, 4, 8])
def test_the_examples_become_their_task_definitions_and_a_valid_submit(gpus):
    spec = load_spec(str(EXAMPLES / f"train-{gpus}gpu.yaml"), {})
    td = task_definition(spec, "us-west-2")
    (c,) = td["containerDefinitions"]
    assert td["family"] == f"spotguard-train-{gpus}gpu"
    assert c["resourceRequirements"] == [{"type": "GPU", "value": str(gpus)}]
    assert (c["cpu"], c["memory"], c["linuxParameters"]["sharedMemorySize"]) == (
        4096 * gpus,
        15000 * gpus,
        8192 * gpus,
    )
    seed = json.loads((EXAMPLES.parent / "taskdefs" / f"train-{gpus}gpu.json").read_text())
    assert c["command"] == seed["containerDefinitions"][0]["command"]  # the seeds' trainings, as specs
    assert c["stopTimeout"] == 120 and c["logConfiguration"]["logDriver"] == "awslogs"
    assert c["logConfiguration"]["options"]["awslogs-region"] == "us-west-2"
    assert {"key": "spotguard:managed", "value": "true"} in td["tags"]
    body = spec_payload(spec, f"arn:aws:ecs:us-west-2:123456789012:task-definition/{td['family']}:1")
    cmd = parse_command(body)  # what the jobs function accepts
    assert cmd.job_id == f"train-{gpus}gpu" and cmd.options.work_hours == 24
    assert cmd.options.deadline is not None and cmd.options.deadline > datetime.now(UTC)


def test_a_checkpoint_directory_makes_the_agent_s_wrapper_the_first_process():
    spec = load_spec(str(EXAMPLES / "train-wrapped-1gpu.yaml"), {})
    assert command_of(spec)[:5] == ["spotguard-agent", "run", "--dir", "/opt/checkpoints", "--"]
    assert command_of(spec)[5:7] == ["python", "train_plain.py"]


def test_an_existing_task_definition_with_a_command_override():
    spec = load_spec("", {"cluster": "gpu-spot", "task_definition": "train-1gpu:3", "command": "python x.py"})
    assert task_definition(spec, "us-east-1") is None
    request = run_task_request(spec, "train-1gpu:3", container="main")
    assert request["overrides"] == {"containerOverrides": [{"name": "main", "command": ["python", "x.py"]}]}


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"gpus": 9}, "gpus: Input should be less than or equal to 8"),
        ({"gpus": "four"}, "gpus: Input should be a valid integer"),
        ({"nodes": 65}, "nodes: Input should be less than or equal to 64"),
        ({"nodes": 0}, "nodes: Input should be greater than or equal to 1"),
        ({"rendezvous_port": 29500}, "rendezvous_port: for a multi-node job (nodes: 2 or more)"),
        (
            {"nodes": 2, "rendezvous_port": 80},
            "rendezvous_port: Input should be greater than or equal to 1024",
        ),
        ({"checkpoint_dir": "ckpt"}, "checkpoint_dir: must be an absolute path in the container"),
        ({"checkpoint_dir": "//"}, "checkpoint_dir: '//' is the container's root"),
        ({"checkpoint_dir": "/."}, "checkpoint_dir: '/.' is the container's root"),
        ({"checkpoint_dir": "/./"}, "checkpoint_dir: '/./' is the container's root"),
        ({"checkpoint_dir": "/ck/../.."}, "checkpoint_dir: an absolute path without .."),
        ({"checkpoint_dir": "/ck\n"}, "checkpoint_dir: a path without control characters"),
        ({"nodes": True}, "nodes: Input should be a valid integer"),
        ({"gpus": True}, "gpus: Input should be a valid integer"),
        ({"nodes": "2"}, "nodes: Input should be a valid integer"),
        ({"nodes": " 2"}, "nodes: Input should be a valid integer"),
        ({"nodes": "2.0"}, "nodes: Input should be a valid integer"),
        ({"nodes": 2.0}, "nodes: Input should be a valid integer"),
        ({"max_attempts": "3"}, "max_attempts: Input should be a valid integer"),
        ({"environment": {"SPOTGUARD_ATTEMPT": "1"}}, "SPOTGUARD_ATTEMPT is set by SpotGuard"),
        (
            {"nodes": 2, "environment": {"PET_MASTER_ADDR": "10.0.0.1"}},
            "environment: PET_MASTER_ADDR set by SpotGuard for each node",
        ),
        ({"environment": {"1BAD": "x"}}, "'1BAD' is not an environment variable's name"),
        ({"task_role_arn": "training-task"}, "task_role_arn: String should match pattern"),
        ({"deadline": "tomorrow"}, "deadline: expected an ISO 8601 time with a time zone"),
        # issue 45, item 20: refused here, not after the whole local stack started (exit 1)
        ({"deadline": "2020-01-01T00:00:00Z"}, "deadline: 2020-01-01T00:00:00+00:00 has passed"),
        ({"name": "-x"}, "name: 1-64 letters, digits"),
        ({"colour": "blue"}, "colour: Extra inputs are not permitted"),
        (
            {"task_definition": "train:1"},
            "give image (SpotGuard registers the task definition) or task_definition",
        ),
        ({"image": None, "task_definition": "t:1", "cpu": 1024}, "cpu: set in the task definition itself"),
        ({"command": None}, "command: required with image"),
        ({"security_groups": ["sg-1"]}, "security_groups: needs subnets"),
    ],
)
def test_every_bad_field_is_one_line_naming_it(fields, said):
    with pytest.raises(CommandError) as err:
        load_spec("", {**MINIMAL, **fields})
    message = str(err.value)
    assert said in message and "\n" not in message, message


def test_a_checkpoint_directory_is_normalised_at_the_door():
    assert (
        load_spec("", {**MINIMAL, "checkpoint_dir": "//opt/./checkpoints/"}).checkpoint_dir
        == "/opt/checkpoints"
    )


@pytest.mark.parametrize(
    ("name", "content", "said"),
    [
        ("latin1.yaml", "cluster: gpu-spot\nimage: caf\xe9\n".encode("latin-1"), "not UTF-8 text (byte 28)"),
        ("utf16.yaml", "cluster: gpu-spot\n".encode("utf-16"), "not UTF-8 text"),
        ("deep.json", b"[" * 100_000 + b"]" * 100_000, "nested deeper than a job spec can be"),
        ("deep.yaml", b"[" * 20_000 + b"]" * 20_000, "nested deeper than a job spec can be"),
        ("deep2.json", b'{"a":' * 70 + b"1" + b"}" * 70, "nested deeper than 64 levels"),
        ("big.yaml", b"x: " + b"a" * (2 << 20), "larger than 1024 KiB: not a job spec"),
        ("laughs.yaml", b"a: &a [x, x, x]\nb: &b [*a, *a, *a]\n", "aliases (*name) are not accepted"),
    ],
)
def test_a_spec_file_that_cannot_be_one_is_refused_in_one_line_without_a_traceback(
    tmp_path, name, content, said
):
    """Issue 45, item 6: Latin-1 and UTF-16 files, deep nesting and huge files were tracebacks (or 21 s and
    570 MB); each is now one line, and a file over the bound is not read whole."""
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(CommandError) as err:
        load_spec(str(path), {})
    message = str(err.value)
    assert said in message and "\n" not in message, message


def test_a_file_that_is_not_a_spec_is_said_in_one_line(tmp_path):
    bad = tmp_path / "job.yaml"
    bad.write_text("cluster: [unclosed\n")
    with pytest.raises(CommandError, match=r"job.yaml: not valid YAML: "):
        load_spec(str(bad), {})
    bad.write_text("- a list\n")
    with pytest.raises(CommandError, match="a mapping of fields"):
        load_spec(str(bad), {})
    with pytest.raises(CommandError, match=r"missing\.yaml: cannot read it"):
        load_spec(str(tmp_path / "missing.yaml"), {})


def test_flags_override_the_file_and_make_a_spec_alone():
    spec = job_spec(
        _args(str(EXAMPLES / "train-1gpu.yaml"), "--gpus", "2", "--env", "LR=0.1", "--job-id", "mine")
    )
    assert (spec.gpus, spec.name) == (2, "mine")
    assert spec.environment == {  # --env adds to the file's environment
        "SPOTGUARD_CHECKPOINT_INTERVAL_SECONDS": "1800",
        "SPOTGUARD_KEEP_CHECKPOINTS": "3",
        "LR": "0.1",
    }
    alone = job_spec(
        _args("--cluster", "c", "--image", "img:1", "--command", "python t.py", "--checkpoint-dir", "/ck")
    )
    assert alone.checkpoint_dir == "/ck" and family(alone) == "spotguard-img-1-1gpu"
    assert job_spec(_args("--cluster", "c", "--task-definition", "t:1")) is None  # a RunTask request
    with pytest.raises(CommandError, match="--launch-type: not for a job spec"):
        job_spec(_args(str(EXAMPLES / "train-1gpu.yaml"), "--launch-type", "EC2"))
    with pytest.raises(CommandError, match="--env: NAME=VALUE"):
        job_spec(_args(str(EXAMPLES / "train-1gpu.yaml"), "--env", "LR"))
    with pytest.raises(CommandError, match="not both"):
        job_spec(_args(str(EXAMPLES / "train-1gpu.yaml"), "--request", "{}"))


# ---------------------------------------------------------------------------------- multi-node jobs
def test_the_two_node_example_becomes_a_host_networked_task_definition_and_a_gang_submit():
    spec = load_spec(str(EXAMPLES / "train-2node.yaml"), {})
    td = task_definition(spec, "us-west-2")
    (c,) = td["containerDefinitions"]
    assert td["family"] == "spotguard-train-2node-8gpu" and td["networkMode"] == "host"
    assert c["resourceRequirements"] == [{"type": "GPU", "value": "8"}]
    # torchrun finds the others from SpotGuard's PET_ variables: no node flags, and not --standalone
    assert c["command"][:5] == ["spotguard-agent", "run", "--", "torchrun", "--nproc-per-node"]
    assert not any(
        a.startswith(("--nnodes", "--node-rank", "--master", "--standalone")) for a in c["command"]
    )
    body = spec_payload(
        spec, "arn:aws:ecs:us-west-2:123456789012:task-definition/spotguard-train-2node-8gpu:1"
    )
    assert body["options"]["nodes"] == 2 and body["options"]["rendezvous_port"] == 29500
    cmd = parse_command(body)
    assert (cmd.options.nodes, cmd.options.rendezvous_port) == (2, 29500)


def test_nodes_from_a_flag_and_one_node_specs_as_before():
    spec = job_spec(_args("--cluster", "c", "--image", "img:1", "--command", "python t.py", "--nodes", "4"))
    assert spec.nodes == 4 and spec.network_mode == "host" and family(spec) == "spotguard-img-1-1gpu-host"
    assert spec_payload(spec, "t:1")["options"] == {"nodes": 4}
    with_port = job_spec(_args(str(EXAMPLES / "train-2node.yaml"), "--rendezvous-port", "29600"))
    assert with_port.rendezvous_port == 29600 and with_port.nodes == 2
    # one node: no nodes in the payload, bridge networking, the family as it was
    one = load_spec(str(EXAMPLES / "train-8gpu.yaml"), {})
    assert (
        "nodes" not in spec_payload(one, "t:1")["options"]
        and task_definition(one, "us-west-2")["networkMode"] == "bridge"
    )
    # awsvpc stays awsvpc for a gang (SpotGuard gives node 0's interface address)
    vpc = load_spec("", {**MINIMAL, "nodes": 2, "subnets": ["subnet-1"], "security_groups": ["sg-1"]})
    assert vpc.network_mode == "awsvpc" and family(vpc) == "spotguard-train-1-1gpu"
    with pytest.raises(CommandError, match="rendezvous_port: for a multi-node job"):
        job_spec(_args(str(EXAMPLES / "train-1gpu.yaml"), "--rendezvous-port", "29600"))


@pytest.mark.parametrize("name", ["nodes", "rendezvous_port"])
def test_a_spec_bounds_nodes_and_the_port_as_the_jobs_function_does(name):
    from spotguard.domain.jobs.submission import JobOptions
    from spotguard_cli.jobs.payload import option_bounds
    from spotguard_cli.jobs.spec import JobSpec

    def bounds(field):
        meta = field.metadata
        return next(m.ge for m in meta if hasattr(m, "ge")), next(m.le for m in meta if hasattr(m, "le"))

    assert bounds(JobSpec.model_fields[name]) == bounds(JobOptions.model_fields[name]) == option_bounds(name)
