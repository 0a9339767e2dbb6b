"""The local stack's IAM guard (emulator/iam.py): each function held to the actions its role allows.

moto enforces no IAM, so a code path making a call its role lacks passed every test and failed on AWS
(the task-events function's moves sent SIGUSR1 through SSM without ssm:SendCommand). The guard reads the
roles from the translated template; the integration fixtures (fresh_aws) fail any test in which a
function made a call its role does not allow.
"""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from spotguard.adapters import clients
from spotguard_cli.emulator import iam
from spotguard_cli.emulator.iam import RUNNING, RoleGuard, actions_of
from spotguard_cli.emulator.template import PSEUDO, translate

PARAMS = {"ClusterNames": "gpu-spot"}


@pytest.fixture(scope="module")
def guard() -> RoleGuard:
    return RoleGuard.of(translate(parameters=PARAMS), PARAMS, PSEUDO)


def test_every_function_s_role_is_read_from_the_template(guard: RoleGuard):
    assert set(guard.allowed) == {
        "InterruptionFunction",
        "CheckpointsFunction",
        "TaskEventsFunction",
        "JobsFunction",
        "ReconcileFunction",
    }
    assert guard.allows("InterruptionFunction", "ecs:StopTask")
    assert guard.allows("JobsFunction", "ecs:RunTask")  # JobsPolicy, a managed policy of the stack
    assert guard.allows("CheckpointsFunction", "sqs:ReceiveMessage")  # AWS's SQS execution role
    assert not guard.allows("InterruptionFunction", "ecs:RunTask")
    assert not guard.allows("CheckpointsFunction", "ecs:StopTask")


def test_the_functions_that_start_moves_may_signal_and_the_others_may_not(guard: RoleGuard):
    # an Auto Scaling launch success starts a move in the task-events function; reconcile starts them too
    assert guard.allows("TaskEventsFunction", "ssm:SendCommand")
    assert guard.allows("ReconcileFunction", "ssm:SendCommand")
    assert not guard.allows("JobsFunction", "ssm:SendCommand")


def _model(service: str, operation: str) -> Any:
    return (
        boto3.session.Session(region_name="us-east-1")
        .client(service)
        .meta.service_model.operation_model(operation)
    )


@pytest.mark.parametrize(
    ("service", "operation", "params", "actions"),
    [
        ("ecs", "RunTask", {}, ["ecs:RunTask"]),
        ("s3", "HeadObject", {}, ["s3:GetObject"]),
        ("s3", "ListObjectsV2", {}, ["s3:ListBucket"]),
        ("sqs", "SendMessageBatch", {}, ["sqs:SendMessage"]),
        ("cloudwatch", "PutMetricData", {}, ["cloudwatch:PutMetricData"]),
        (
            "dynamodb",
            "TransactWriteItems",
            {"TransactItems": [{"Put": {}}, {"ConditionCheck": {}}]},
            ["dynamodb:ConditionCheckItem", "dynamodb:PutItem"],
        ),
    ],
)
def test_an_operation_needs_the_action_iam_authorises_it_under(service, operation, params, actions):
    assert actions_of(_model(service, operation), params) == actions


def test_a_call_the_role_lacks_is_refused_as_aws_would_and_kept(guard: RoleGuard, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    mine = RoleGuard(allowed=guard.allowed, refused=guard.refused)
    with mock_aws():
        clients.reset()
        try:
            mine.install()
            ssm = clients.client("ssm", "us-east-1")
            running = RUNNING.set("JobsFunction")
            try:
                with pytest.raises(ClientError) as refused:
                    ssm.send_command(DocumentName="AWS-RunShellScript", InstanceIds=["i-0123456789abcdef0"])
            finally:
                RUNNING.reset(running)
            assert refused.value.response["Error"]["Code"] == "AccessDeniedException"
            assert [str(d) for d in mine.denied] == [
                "JobsFunction's role does not allow ssm:SendCommand (SendCommand)"
            ]
            ssm.list_commands()  # outside a function (a test's own call): not held to any role
            assert len(mine.denied) == 1
        finally:
            clients.reset()
            iam.INSTALLED.remove(mine)
