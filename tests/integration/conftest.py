"""The interruption function against moto in this process: the template's stack created in moto's
CloudFormation, a simulated GPU cluster, and the handler imported with the stack's environment."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from spotguard.adapters import clients
from spotguard_cli.emulator import iam
from spotguard_cli.emulator.gpucluster import GpuCluster, Host
from spotguard_cli.emulator.inject import container_instance_event, make_event
from spotguard_cli.emulator.lambdas import FunctionHost, QueuePoller
from spotguard_cli.emulator.stack import DeployedStack, deploy
from spotguard_cli.emulator.world import JobsWorld, make_jobs_world
from tests.contract.moto_aws import fresh_moto


@dataclass
class World:
    stack: DeployedStack
    cluster: GpuCluster
    a: Host
    b: Host
    host: FunctionHost
    poller: QueuePoller
    calls: list[str]

    @property
    def sqs(self) -> Any:
        return self.stack.client("sqs")

    def send(self, *events: dict[str, Any] | str) -> None:
        """Put records on the interruptions queue as EventBridge would deliver them."""
        for e in events:
            body = e if isinstance(e, str) else json.dumps(e)
            self.sqs.send_message(QueueUrl=self.poller.queue_url, MessageBody=body)

    def run(self) -> tuple[int, int]:
        return self.poller.drain()

    def index(self, *hosts: Host) -> None:
        self.send(*(container_instance_event(self.cluster.describe_host(h)) for h in hosts))
        self.run()
        self.calls.clear()

    def warning(self, host: Host, **kw: Any) -> dict[str, Any]:
        return make_event("spot-interruption", host.instance_id, **kw)

    def dead_letters(self) -> list[dict[str, Any]]:
        url = self.stack.outputs["InterruptionsDeadLetterQueueUrl"]
        msgs = self.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"])
        return msgs.get("Messages", [])


def make_world(parameters: dict[str, str] | None = None, env: dict[str, str] | None = None) -> World:
    params = {"ClusterNames": "gpu-spot,other-cluster", **(parameters or {})}
    stack = deploy(None, params)
    fn = stack.functions["InterruptionFunction"]
    fn.environment.update(env or {})
    cluster = GpuCluster(stack.client("ecs"), stack.client("ec2"), "gpu-spot")
    a = cluster.add_host("g5.xlarge", "us-east-1a")
    b = cluster.add_host("g5.12xlarge", "us-east-1b")
    clients.reset()
    iam.RoleGuard.installed_for(stack)
    host = FunctionHost(stack, fn)
    calls: list[str] = []
    clients.on_every_call(lambda model, **_: calls.append(model.name))
    return World(stack, cluster, a, b, host, QueuePoller(stack, host), calls)


@contextlib.contextmanager
def fresh_aws() -> Iterator[None]:
    """moto in this process, with ECS tasks held where they are. On the way out, every AWS call a
    function made that its role does not allow (emulator/iam.py: moto enforces no IAM) fails the test,
    even where the code logged the AccessDenied and went on."""
    guards = len(iam.INSTALLED)
    with fresh_moto():  # a real ECS task stays RUNNING until stopped, as there
        try:
            yield
        finally:
            clients.reset()
            denied = sorted({str(d) for g in iam.INSTALLED[guards:] for d in g.denied})
            del iam.INSTALLED[guards:]
    assert not denied, "calls a function's role does not allow: " + "; ".join(denied)


@pytest.fixture
def aws() -> Iterator[None]:
    with fresh_aws():
        yield


@pytest.fixture
def world(aws) -> World:
    return make_world(env={"SPOTGUARD_LIFECYCLE_CHECK_SECONDS": "0"})


# ------------------------------------------------------------------------------------------- jobs
@pytest.fixture
def jobs(aws) -> JobsWorld:
    return make_jobs_world()
