"""Job specs through the CLI into the stack, over moto: `spotguard jobs submit job.yaml` registers the
task definition (once: a job submitted again makes no new revision), and the jobs function launches it
as the spec says, for the 1-, 4- and 8-GPU examples."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from spotguard_cli.emulator.world import JobsWorld, make_jobs_world
from spotguard_cli.jobs.command import run
from spotguard_cli.main import build_parser

from .conftest import fresh_aws

pytestmark = pytest.mark.slow  # every test deploys the stack into moto

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "jobs"


@pytest.fixture
def world() -> Iterator[JobsWorld]:
    with fresh_aws():
        yield make_jobs_world()


def _submit(w: JobsWorld, *argv: str) -> tuple[int, str, str]:
    args = build_parser().parse_args(["jobs", "--region", "us-east-1", "submit", *argv])
    out, err = io.StringIO(), io.StringIO()
    import contextlib

    with contextlib.redirect_stderr(err):
        code = run(args, invoke=w.invoke, out=out, aws=lambda service, region=None: w.stack.client(service))
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("gpus", [1, 4, 8])
def test_a_job_spec_registers_its_task_definition_and_runs_as_it_says(world: JobsWorld, gpus: int):
    spec = EXAMPLES / f"train-{gpus}gpu.yaml"
    code, _, err = _submit(world, str(spec), "--job-id", f"spec-{gpus}")
    assert code == 0, err
    ecs = world.stack.client("ecs")
    (arn,) = ecs.list_task_definitions(familyPrefix=f"spotguard-train-{gpus}gpu")["taskDefinitionArns"]
    td = ecs.describe_task_definition(taskDefinition=arn)["taskDefinition"]
    (c,) = td["containerDefinitions"]
    assert c["resourceRequirements"] == [{"type": "GPU", "value": str(gpus)}]
    assert c["logConfiguration"]["options"]["awslogs-group"] == "/spotguard/jobs"
    assert td["taskRoleArn"].endswith(":role/spotguard/training-task")
    status = world.status(f"spec-{gpus}")
    assert status["request"]["taskDefinition"] == td["taskDefinitionArn"]
    assert status["options"]["work_hours"] == 24 and status["options"]["deadline"]
    request = world.scheduler.requests[-1]
    assert request["taskDefinition"] == td["taskDefinitionArn"]
    placed = world.task(status["attempts"][0]["task_arn"])
    host = next(h for h in world.cluster.hosts if h.container_instance_arn == placed["containerInstanceArn"])
    assert host.instance_type == {1: "g5.xlarge", 4: "g5.12xlarge", 8: "g5.48xlarge"}[gpus]

    # the same spec again (another job): the same revision, none registered
    code, _, err = _submit(world, str(spec), "--job-id", f"spec-{gpus}-again")
    assert code == 0, err
    arns = ecs.list_task_definitions(familyPrefix=f"spotguard-train-{gpus}gpu")["taskDefinitionArns"]
    assert arns == [td["taskDefinitionArn"]]
    # a change (another command) is a new revision
    code, _, err = _submit(world, str(spec), "--job-id", f"spec-{gpus}-b", "--command", "python train.py")
    assert code == 0, err
    assert (
        len(ecs.list_task_definitions(familyPrefix=f"spotguard-train-{gpus}gpu")["taskDefinitionArns"]) == 2
    )


def test_a_bad_spec_registers_nothing_and_says_why_in_one_line(world: JobsWorld, tmp_path: Path):
    bad = tmp_path / "job.yaml"
    bad.write_text((EXAMPLES / "train-1gpu.yaml").read_text().replace("gpus: 1", "gpus: 16"))
    code, _, err = _submit(world, str(bad))
    assert code == 2 and err.count("\n") == 1 and "gpus: Input should be less than or equal to 8" in err
    assert (
        world.stack.client("ecs").list_task_definitions(familyPrefix="spotguard-train")["taskDefinitionArns"]
        == []
    )


def test_a_spec_naming_a_missing_task_definition_is_refused(world: JobsWorld):
    code, _, err = _submit(
        world, "--cluster", "gpu-spot", "--task-definition", "nope:1", "--command", "python t.py"
    )
    assert code == 2 and "task_definition: nope:1" in err
