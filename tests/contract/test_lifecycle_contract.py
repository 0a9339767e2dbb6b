"""The lifecycle port's contract (adapters/autoscaling.py LifecycleAdapter: heartbeat, complete), held by
its fake (tests/fakes.py FakeLifecycle): a heartbeat and the completion reach the lifecycle action; an
action completed already (a repeated notice) or timed out leaves nothing to answer, which is no error;
any other failure is raised, for the notice to be tried again.

moto cannot hold the adapter to these cases: its Auto Scaling lacks RecordLifecycleActionHeartbeat and
CompleteLifecycleAction (moto 5.2: "has not been implemented"), and gives an instance no lifecycle action
to answer. The moto side is skipped for that reason, and `test_moto_still_lacks_lifecycle_actions` fails
once a moto has them, for the side to be written. Until then the adapter's calls and its reading of AWS's
answers are held by tests/integration/test_lifecycle_adapter.py (botocore's Stubber)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from spotguard.adapters.clients import URGENT
from spotguard.domain.interruption.notices import LifecycleRef
from tests.contract.moto_aws import Clients, one_side
from tests.fakes import FakeLifecycle

REGION = "us-east-1"
HOST = "i-0b662ef9931388ba0"
REF = LifecycleRef(group="gpu-spot-asg", hook="spotguard-drain", token="87654321-4321-4321-4321-210987654321")
MISSING = "RecordLifecycleActionHeartbeat and CompleteLifecycleAction"


@dataclass
class Side:
    name: str
    lifecycle: Any  # LifecycleAdapter | FakeLifecycle
    answered: Callable[[], list[tuple[str, LifecycleRef, str]]]  # what reached the action, in order
    fail_next: Callable[[Exception], None]  # the next call fails so (not "No active Lifecycle Action")


def _moto_lacks_lifecycle_actions(client: Any) -> bool:
    try:
        client.complete_lifecycle_action(
            LifecycleHookName=REF.hook,
            AutoScalingGroupName=REF.group,
            LifecycleActionToken=REF.token,
            InstanceId=HOST,
            LifecycleActionResult="CONTINUE",
        )
    except NotImplementedError:
        return True
    except ClientError:
        return False
    return False


def fake_side() -> Side:
    fake = FakeLifecycle()
    return Side("fake", fake, lambda: list(fake.answered), fake.failures.append)


def moto_side(aws: Clients) -> Side:
    if _moto_lacks_lifecycle_actions(aws["autoscaling"]):
        pytest.skip(f"moto's Auto Scaling lacks {MISSING}")
    pytest.fail("moto answers lifecycle actions now: write this side (LifecycleAdapter on moto)")


@pytest.fixture(params=["fake", "autoscaling"])
def side(request: pytest.FixtureRequest) -> Iterator[Side]:
    yield from one_side(request, ("autoscaling",), fake_side, moto_side)


def test_moto_still_lacks_lifecycle_actions():
    """When this fails, moto has the lifecycle actions: give the cases below their moto side."""
    with mock_aws():
        assert _moto_lacks_lifecycle_actions(boto3.client("autoscaling", region_name=REGION, config=URGENT))


def test_a_heartbeat_and_the_completion_reach_the_lifecycle_action(side: Side):
    side.lifecycle.heartbeat(REF, HOST)
    side.lifecycle.heartbeat(REF, HOST)
    side.lifecycle.complete(REF, HOST)
    assert side.answered() == [("heartbeat", REF, HOST), ("heartbeat", REF, HOST), ("complete", REF, HOST)]


def test_an_action_completed_already_is_no_error_and_nothing_more(side: Side):
    """A repeated notice heartbeats and completes again an action that is gone: AWS answers "No active
    Lifecycle Action", which is no failure."""
    side.lifecycle.complete(REF, HOST)
    side.lifecycle.complete(REF, HOST)
    side.lifecycle.heartbeat(REF, HOST)
    assert side.answered() == [("complete", REF, HOST)]


def test_any_other_failure_is_raised(side: Side):
    side.fail_next(ClientError({"Error": {"Code": "Throttling", "Message": "Rate exceeded"}}, "Heartbeat"))
    with pytest.raises(ClientError):
        side.lifecycle.heartbeat(REF, HOST)
    side.lifecycle.complete(REF, HOST)  # tried again: answered
    assert side.answered() == [("complete", REF, HOST)]
