"""Which tasks SpotGuard manages, how it knows a GPU task, and what the interruption function sends with
SpotGuard's own SSM document: values its patterns admit, for the checkpoint container only."""

from __future__ import annotations

import re

import pytest

from spotguard.adapters.ecs import task_info
from spotguard.adapters.ssm import SIGNALS, signal_document_parameters
from spotguard.domain.tasks import (
    ManageMode,
    TaskInfo,
    managed_tasks,
    task_definition_has_gpu,
)
from spotguard_cli.emulator.template import load

ARN = "arn:aws:ecs:us-west-2:123456789012:task/gpu-spot/9f1e2d3c4b5a69788796a5b4c3d2e1f0"
OLD_ARN = "arn:aws:ecs:us-west-2:123456789012:task/9f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"


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


def _document_parameters():
    return load()["Resources"]["SignalDocument"]["Properties"]["Content"]["parameters"]


def test_the_signals_are_the_documents():
    assert set(SIGNALS) == set(_document_parameters()["signal"]["allowedValues"])


def test_runtime_ids_of_the_checkpoint_containers_and_pairs_for_the_rest():
    tasks = [
        _task(containers=(("train", "0123456789ab" * 2), ("log-router", "fedcba987654"))),
        _task(
            task_arn=OLD_ARN,
            containers=(("sidecar", "aaaaaaaaaaaa"), ("train", None)),
            tags={"spotguard:checkpoint-container": "train"},
        ),
    ]
    params = signal_document_parameters(tasks, "SIGUSR1")
    assert params == {
        "signal": ["SIGUSR1"],
        "containerIds": ["0123456789ab" * 2],
        "taskContainers": [f"{OLD_ARN}=train"],
    }
    # every value is one the document's own patterns admit (SSM checks them again)
    doc = _document_parameters()
    for name in ("containerIds", "taskContainers"):
        (value,) = params[name]
        assert re.fullmatch(doc[name]["allowedPattern"], value), name


def test_fifty_of_each_fit_the_document_and_more_are_refused():
    doc = _document_parameters()
    many = [_task(task_arn=ARN[:-2] + f"{i:02x}", containers=(("train", f"{i:012x}"),)) for i in range(50)]
    params = signal_document_parameters(many, "SIGTERM")
    assert re.fullmatch(doc["containerIds"]["allowedPattern"], params["containerIds"][0])
    unknown = [_task(task_arn=ARN[:-2] + f"{i:02x}") for i in range(50)]
    params = signal_document_parameters(unknown, "SIGTERM")
    assert re.fullmatch(doc["taskContainers"]["allowedPattern"], params["taskContainers"][0])
    with pytest.raises(ValueError, match="more than 50"):
        signal_document_parameters([*many, many[0]], "SIGTERM")


@pytest.mark.parametrize(
    "bad",
    [
        {"task_arn": ARN + "; rm -rf /"},
        {"containers": (("train; reboot", None),)},
        {"containers": (("train", "0123456789ab; reboot"),), "task_arn": "not-an-arn"},
        {"containers": ()},
    ],
)
def test_anything_that_is_not_a_plain_id_is_refused(bad):
    with pytest.raises(ValueError):
        signal_document_parameters([_task(**bad)], "SIGUSR1")


def test_unknown_signals_are_refused():
    with pytest.raises(ValueError):
        signal_document_parameters([_task()], "SIGKILL")


@pytest.mark.parametrize(
    ("started_by", "ref"),
    [
        ("spotguard/job-1/2", ("job-1", 2)),
        ("spotguard/job-1/2\n", None),  # `$` let a trailing newline through
        ("spotguard/job-1/2/x", None),
    ],
)
def test_a_task_is_spotguards_only_when_started_by_says_so_whole(started_by, ref):
    from spotguard.domain.tasks import TaskEvent

    task = TaskEvent(
        task_arn="arn:aws:ecs:us-east-1:123456789012:task/c/t",
        cluster_arn="c",
        last_status="RUNNING",
        started_by=started_by,
    )
    assert task.job_ref == ref


def test_only_a_manifest_key_whole_is_a_checkpoint():
    from spotguard.domain.checkpoints import manifest_location

    assert manifest_location("b", "run/checkpoints/3/MANIFEST.json") == ("s3://b/run/", 3)
    assert manifest_location("b", "run/checkpoints/3/MANIFEST.json\n") is None
