"""What the interruption function will send with SpotGuard's own SSM document: values its patterns
admit, for the checkpoint container only, and nothing else."""

from __future__ import annotations

import re

import pytest

from spotguard.adapters.ssm import SIGNALS, signal_document_parameters
from spotguard.domain.tasks import TaskInfo
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
