"""Which tasks SpotGuard manages, how it knows a GPU task, and the SSM signal command it builds."""

from __future__ import annotations

import pytest

from spotguard.adapters.ecs import task_info
from spotguard.domain.tasks import (
    ManageMode,
    TaskInfo,
    managed_tasks,
    task_definition_has_gpu,
)

ARN = "arn:aws:ecs:us-west-2:123456789012:task/gpu-spot/9f1e2d3c4b5a69788796a5b4c3d2e1f0"


def _task(**kw):
    base = {
        "task_arn": ARN,
        "cluster_arn": "arn:aws:ecs:us-west-2:123456789012:cluster/gpu-spot",
        "task_definition_arn": "arn:aws:ecs:us-west-2:123456789012:task-definition/train:1",
        "containers": (("train", None),),
    }
    return TaskInfo(**{**base, **kw})


@pytest.mark.parametrize(
    ("definition", "gpu"),
    [
        ({"containerDefinitions": [{"resourceRequirements": [{"type": "GPU", "value": "8"}]}]}, True),
        ({"containerDefinitions": [{"resourceRequirements": [{"type": "GPU", "value": "0"}]}]}, False),
        (
            {
                "containerDefinitions": [
                    {"resourceRequirements": [{"type": "InferenceAccelerator", "value": "a"}]}
                ]
            },
            False,
        ),
        (
            {"containerDefinitions": [{"linuxParameters": {"devices": [{"hostPath": "/dev/nvidia0"}]}}]},
            True,
        ),
        ({"containerDefinitions": [{"linuxParameters": {"devices": [{"hostPath": "/dev/fuse"}]}}]}, False),
        ({"containerDefinitions": [{"name": "app"}]}, False),
    ],
)
def test_gpu_task_definitions(definition, gpu):
    assert task_definition_has_gpu(definition) is gpu


def test_task_info_sees_gpus_in_assigned_ids_and_overrides():
    raw = {
        "taskArn": ARN,
        "clusterArn": "arn:aws:ecs:us-west-2:123456789012:cluster/gpu-spot",
        "taskDefinitionArn": "td",
        "containers": [{"name": "train", "runtimeId": "abc", "gpuIds": ["GPU-1"]}],
        "tags": [{"key": "spotguard:managed", "value": "true"}],
    }
    t = task_info(raw)
    assert t.gpu is True and t.tagged_managed and t.containers == (("train", "abc"),)
    raw["containers"][0]["gpuIds"] = []
    assert task_info(raw).gpu is None  # unknown from the task: ask the definition
    raw["overrides"] = {
        "containerOverrides": [{"name": "train", "resourceRequirements": [{"type": "GPU", "value": "4"}]}]
    }
    assert task_info(raw).gpu is True


def test_managed_tasks_by_mode():
    ours = _task(started_by="spotguard")
    job = _task(tags={"spotguard:job-id": "j-1"})
    tagged = _task(tags={"spotguard:managed": "TRUE"})
    gpu_by_definition = _task(task_definition_arn="gpu-td")
    gpu_by_ids = _task(gpu=True)
    cpu = _task(task_definition_arn="cpu-td")
    not_managed = _task(tags={"spotguard:managed": "false"}, task_definition_arn="cpu-td")
    lookups: list[str] = []

    def has_gpu(arn: str) -> bool:
        lookups.append(arn)
        return arn == "gpu-td"

    everything = [ours, job, tagged, gpu_by_definition, gpu_by_ids, cpu, not_managed]
    assert managed_tasks(everything, ManageMode.TAGGED, has_gpu) == [ours, job, tagged]
    assert lookups == []  # the tagged mode never needs a task definition
    assert managed_tasks(everything, ManageMode.ALL_GPU, has_gpu) == [
        ours,
        job,
        tagged,
        gpu_by_definition,
        gpu_by_ids,
    ]
