"""moto in this process for the contract tests of the ports on AWS: boto3 clients made once per module
(making one costs a few tenths of a second), a fresh `mock_aws()` for each case, ECS tasks held where they
are as in a real cluster (moto's default moves a task on at every DescribeTasks), and `one_side`, the
`side` fixture every module's cases take: the fake's side or the adapters' on moto."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import boto3
import pytest
from moto import mock_aws
from moto.moto_api import state_manager

from spotguard.adapters.clients import URGENT

REGION = "us-east-1"
S = TypeVar("S")
Clients = dict[str, Any]  # a boto3 client by service name

# A cheap call per service, made once per module: moto loads a service's backend at its first call (over a
# second for ECS with EC2), which would otherwise land in the first case.
WARM_UP = {
    "ecs": lambda c: c.list_clusters(),
    "ec2": lambda c: c.describe_instances(),
    "ssm": lambda c: c.send_command(InstanceIds=["i-0123456789abcdef0"], DocumentName="AWS-RunShellScript"),
    "s3": lambda c: c.list_buckets(),
    "sqs": lambda c: c.list_queues(),
    "sns": lambda c: c.list_topics(),
    "events": lambda c: c.list_rules(),
    "autoscaling": lambda c: c.describe_auto_scaling_groups(),
}


def aws_clients(*services: str) -> Clients:
    """One client per service, as the functions make them (standard retries, short timeouts), each
    called once; moto, imported above, answers them while a `fresh_moto()` is open."""
    session = boto3.session.Session()
    made = {service: session.client(service, region_name=REGION, config=URGENT) for service in services}
    with fresh_moto():
        for service, c in made.items():
            WARM_UP[service](c)
    return made


@contextlib.contextmanager
def fresh_moto() -> Iterator[None]:
    """An empty moto for one case: a task runs until it is stopped, as in ECS."""
    with mock_aws():
        state_manager.set_transition(
            model_name="ecs::task", transition={"progression": "manual", "times": 10**9}
        )
        try:
            yield
        finally:
            state_manager.unset_transition("ecs::task")


def one_side(
    request: pytest.FixtureRequest,
    services: Iterable[str],
    fake: Callable[[], S],
    moto: Callable[[Clients], S],
    within: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
) -> Iterator[S]:
    """The side a case is parametrized with (`request.param`), for a module's `side` fixture to yield from:
    "fake" is `fake()`; any other id (the module's name for its moto side) is `moto(clients)` in a
    `fresh_moto()` entered inside `within()` (queues: the virtual clock, installed before moto starts),
    with the module's clients of `services` (`aws_clients`, made at the module's first moto case and kept
    for its others in conftest.py's module-scoped `moto_clients`)."""
    if request.param == "fake":
        yield fake()
        return
    clients: Clients = request.getfixturevalue("moto_clients")
    missing = [service for service in services if service not in clients]
    if missing:
        clients.update(aws_clients(*missing))
    with within(), fresh_moto():
        yield moto(clients)
