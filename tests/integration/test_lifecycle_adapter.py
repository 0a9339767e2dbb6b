"""Completing a lifecycle action that is already gone is not an error; other failures are."""

from __future__ import annotations

import boto3
import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber

from spotguard.adapters.autoscaling import LifecycleAdapter
from spotguard.domain.interruption.notices import LifecycleRef

REF = LifecycleRef(group="gpu-spot-asg", hook="spotguard-drain", token="87654321-4321-4321-4321-210987654321")
ACTION = {
    "LifecycleHookName": "spotguard-drain",
    "AutoScalingGroupName": "gpu-spot-asg",
    "LifecycleActionToken": "87654321-4321-4321-4321-210987654321",
    "InstanceId": "i-0b662ef9931388ba0",
}


@pytest.fixture
def asg():
    return boto3.client("autoscaling", region_name="us-east-1")


def test_heartbeat_and_complete_send_the_hook_and_token(asg):
    with Stubber(asg) as stub:
        stub.add_response("record_lifecycle_action_heartbeat", {}, ACTION)
        stub.add_response("complete_lifecycle_action", {}, {**ACTION, "LifecycleActionResult": "CONTINUE"})
        adapter = LifecycleAdapter(asg)
        adapter.heartbeat(REF, "i-0b662ef9931388ba0")
        adapter.complete(REF, "i-0b662ef9931388ba0")
        stub.assert_no_pending_responses()


def test_an_action_that_is_gone_is_fine(asg):
    with Stubber(asg) as stub:
        stub.add_client_error(
            "complete_lifecycle_action",
            service_error_code="ValidationError",
            service_message=f"No active Lifecycle Action found with token {REF.token}",
        )
        LifecycleAdapter(asg).complete(REF, "i-0b662ef9931388ba0")
        stub.assert_no_pending_responses()  # the call was made: its error, not silence, was taken


def test_other_errors_are_raised(asg):
    with Stubber(asg) as stub:
        stub.add_client_error("record_lifecycle_action_heartbeat", service_error_code="Throttling")
        with pytest.raises(ClientError):
            LifecycleAdapter(asg).heartbeat(REF, "i-0b662ef9931388ba0")
        stub.assert_no_pending_responses()
