"""The Signaller port (adapters/ssm.py SsmSignaller), the same cases against its fake (tests/fakes.py
FakeSignaller) and against the adapter on moto: a signal goes to the host's tasks' checkpoint containers
through SpotGuard's own SSM document (the one template.yaml declares, made in moto from its content), one
Run Command per 50 tasks, the command ids as the answer, and a bad signal or task refused before anything
is sent. What SSM was sent is read on moto with ListCommands (only the document's commands count), on the
fake from its `commands`.

What moto cannot do: check a command against its document (moto takes any document name and any
parameters; tests/unit/test_tasks_and_signals.py holds the adapter's checks to the document's patterns),
or run it on an instance (no command reaches a container)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from spotguard.adapters.ssm import SsmSignaller
from spotguard.domain.tasks import CHECKPOINT_CONTAINER_TAG, TaskInfo
from spotguard_cli.emulator import template
from tests.contract.moto_aws import Clients, one_side
from tests.fakes import AWS_ACCOUNT, AWS_REGION, FakeSignaller

HOST = "i-0b662ef9931388ba0"
CLUSTER = f"arn:aws:ecs:{AWS_REGION}:{AWS_ACCOUNT}:cluster/gpu-spot"
DOCUMENT = "spotguard-SignalDocument-1A2B3C4D5E6F"

# (command id, instance, the document's parameters), in the order sent
Sent = list[tuple[str, str, dict[str, list[str]]]]


def task(n: int, runtime_id: str | None = None, **kw: Any) -> TaskInfo:
    base: dict[str, Any] = {
        "task_arn": f"arn:aws:ecs:{AWS_REGION}:{AWS_ACCOUNT}:task/gpu-spot/{n:032x}",
        "cluster_arn": CLUSTER,
        "task_definition_arn": f"arn:aws:ecs:{AWS_REGION}:{AWS_ACCOUNT}:task-definition/train:1",
        "containers": (("train", runtime_id),),
    }
    return TaskInfo(**{**base, **kw})


@dataclass
class Side:
    name: str
    signaller: Any  # SsmSignaller | FakeSignaller
    sent: Callable[[], Sent]


def moto_commands(ssm: Any) -> Sent:
    commands = ssm.list_commands()["Commands"]
    return [
        (c["CommandId"], instance, c["Parameters"])
        for c in commands
        if c["DocumentName"] == DOCUMENT
        for instance in c["InstanceIds"]
    ]


def fake_side() -> Side:
    fake = FakeSignaller()
    return Side("fake", fake, lambda: list(fake.commands))


def moto_side(aws: Clients) -> Side:
    """The adapter, with SpotGuard's document made in moto from template.yaml's content."""
    ssm = aws["ssm"]
    document = template.load()["Resources"]["SignalDocument"]["Properties"]
    ssm.create_document(
        Name=DOCUMENT,
        Content=json.dumps(document["Content"]),
        DocumentType=document["DocumentType"],
        DocumentFormat=document["DocumentFormat"],
    )
    return Side("moto", SsmSignaller(ssm, DOCUMENT), lambda: moto_commands(ssm))


@pytest.fixture(params=["fake", "moto"])
def side(request: pytest.FixtureRequest) -> Iterator[Side]:
    yield from one_side(request, ("ssm",), fake_side, moto_side)


def test_a_signal_goes_to_each_tasks_checkpoint_container_in_one_command(side: Side):
    known, unknown = task(1, runtime_id="a" * 12), task(2)  # ECS reported the first's runtime id only
    answer = side.signaller.signal(HOST, [known, unknown], "SIGUSR1")
    assert side.sent() == [
        (
            answer,
            HOST,
            {
                "signal": ["SIGUSR1"],
                "containerIds": ["a" * 12],
                "taskContainers": [f"{unknown.task_arn}=train"],  # found on the host by ECS's labels
            },
        )
    ]


def test_the_checkpoint_container_is_the_one_the_task_names(side: Side):
    named = task(
        3,
        containers=(("sidecar", "b" * 64), ("trainer", "c" * 64)),
        tags={CHECKPOINT_CONTAINER_TAG: "trainer"},
    )
    first = task(4, containers=(("train", "d" * 64), ("sidecar", "e" * 64)))
    answer = side.signaller.signal(HOST, [named, first], "SIGTERM")
    ((command, _, parameters),) = side.sent()
    assert command == answer
    assert parameters["containerIds"] == ["c" * 64 + " " + "d" * 64]  # never every container: SIGUSR1 kills


def test_more_than_fifty_tasks_go_in_a_command_per_fifty(side: Side):
    tasks = [task(n, runtime_id=f"{n:012x}") for n in range(1, 52)]
    answer = side.signaller.signal(HOST, tasks, "SIGUSR1")
    sent = side.sent()
    assert [len(p["containerIds"][0].split()) for _, _, p in sent] == [50, 1]
    assert answer == ",".join(command for command, _, _ in sent)
    assert {instance for _, instance, _ in sent} == {HOST}


def test_no_task_sends_nothing(side: Side):
    assert side.signaller.signal(HOST, [], "SIGUSR1") == ""
    assert side.sent() == []


def test_a_signal_other_than_the_three_is_refused_before_anything_is_sent(side: Side):
    with pytest.raises(ValueError, match="SIGKILL"):
        side.signaller.signal(HOST, [task(1, runtime_id="a" * 12)], "SIGKILL")
    assert side.sent() == []
    side.signaller.signal(HOST, [task(1, runtime_id="a" * 12)], "SIGUSR2")
    assert [p["signal"] for _, _, p in side.sent()] == [["SIGUSR2"]]


def test_a_task_with_no_container_to_signal_is_refused_with_its_arn(side: Side):
    nameless = task(5, containers=())
    with pytest.raises(ValueError, match=nameless.task_arn):
        side.signaller.signal(HOST, [task(1, runtime_id="a" * 12), nameless], "SIGUSR1")
    assert side.sent() == []  # the host's one command holds both: neither is signalled
