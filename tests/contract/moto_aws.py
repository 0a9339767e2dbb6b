"""moto in this process for the contract tests of the ECS, SSM and EC2 ports: boto3 clients made once per
module (making one costs a few tenths of a second), and a fresh `mock_aws()` for each case, ECS tasks held
where they are as in a real cluster (moto's default moves a task on at every DescribeTasks)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import boto3
from moto import mock_aws
from moto.moto_api import state_manager

from spotguard.adapters.clients import URGENT

REGION = "us-east-1"


# A cheap call per service, made once per module: moto loads a service's backend at its first call (over a
# second for ECS with EC2), which would otherwise land in the first case.
WARM_UP = {
    "ecs": lambda c: c.list_clusters(),
    "ec2": lambda c: c.describe_instances(),
    "ssm": lambda c: c.send_command(InstanceIds=["i-0123456789abcdef0"], DocumentName="AWS-RunShellScript"),
}


def aws_clients(*services: str) -> dict[str, Any]:
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
