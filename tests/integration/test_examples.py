"""The example task definitions are valid RegisterTaskDefinition requests that SpotGuard manages."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.stub import Stubber

from spotguard.domain.tasks import task_definition_has_gpu

from ..conftest import REPO

TASKDEFS = sorted((REPO / "examples" / "taskdefs").glob("*.json"))


@pytest.mark.parametrize("path", TASKDEFS, ids=lambda p: p.name)
def test_task_definitions_are_valid_requests(path):
    td = json.loads(path.read_text())
    ecs = boto3.client("ecs", region_name="us-west-2")
    with Stubber(ecs) as stub:  # botocore validates the request against the ECS model; nothing is sent
        stub.add_response("register_task_definition", {"taskDefinition": {"family": td["family"]}}, td)
        ecs.register_task_definition(**td)
    (container,) = td["containerDefinitions"]
    assert container["stopTimeout"] == 120
    assert {"key": "spotguard:managed", "value": "true"} in td["tags"]
    assert task_definition_has_gpu(td)


def test_one_example_per_gpu_count_and_one_wrapped():
    gpus = sorted(
        int(json.loads(p.read_text())["containerDefinitions"][0]["resourceRequirements"][0]["value"])
        for p in TASKDEFS
        if "wrapped" not in p.name and "ebs" not in p.name
    )
    assert gpus == [1, 4, 8]
    wrapped = json.loads((REPO / "examples" / "taskdefs" / "train-wrapped-1gpu.json").read_text())
    assert wrapped["containerDefinitions"][0]["command"][:2] == ["spotguard-agent", "run"]


def test_the_ebs_example_mounts_a_volume_configured_at_launch():
    td = json.loads((REPO / "examples" / "taskdefs" / "train-ebs-1gpu.json").read_text())
    (volume,) = td["volumes"]
    assert volume["configuredAtLaunch"] is True
    (mount,) = td["containerDefinitions"][0]["mountPoints"]
    assert mount["sourceVolume"] == volume["name"]
