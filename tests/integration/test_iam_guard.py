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


@pytest.mark.parametrize(
    ("service", "operation", "params", "also"),
    [
        ("ecs", "RunTask", {"tags": [{"key": "spotguard:job-id", "value": "j"}]}, ["ecs:TagResource"]),
        ("ecs", "RunTask", {"overrides": {"taskRoleArn": "arn:aws:iam::1:role/r"}}, ["iam:PassRole"]),
        (
            "ecs",
            "RunTask",
            {
                "volumeConfigurations": [
                    {"name": "ckpt", "managedEBSVolume": {"roleArn": "arn:aws:iam::1:role/e"}}
                ]
            },
            ["iam:PassRole"],
        ),
        ("ec2", "CreateSnapshot", {"TagSpecifications": [{"ResourceType": "snapshot"}]}, ["ec2:CreateTags"]),
        ("sns", "Publish", {}, ["kms:GenerateDataKey", "kms:Decrypt"]),
    ],
)
def test_a_call_needs_the_actions_its_parameters_add(service, operation, params, also):
    needed = actions_of(_model(service, operation), params, encrypted_topics=True)
    assert needed == [f"{service}:{operation}", *also]


def test_the_stack_s_topic_is_encrypted_so_a_publish_needs_kms(guard: RoleGuard):
    assert guard.encrypted_topics
    for action in ("sns:Publish", "kms:GenerateDataKey", "kms:Decrypt", "ecs:TagResource", "iam:PassRole"):
        assert guard.allows("JobsFunction", action), action


def test_without_tagging_at_launch_a_job_s_run_task_is_refused():
    """What the guard is for: a statement taken from a role makes the call that needs it fail locally,
    as it would on AWS (here the jobs policy's TagJobTasksAtLaunch, which RunTask's tags need)."""
    cfn = translate(parameters=PARAMS)
    statements = cfn["Resources"]["JobsPolicy"]["Properties"]["PolicyDocument"]["Statement"]
    cfn["Resources"]["JobsPolicy"]["Properties"]["PolicyDocument"]["Statement"] = [
        s for s in statements if s.get("Sid") != "TagJobTasksAtLaunch"
    ]
    narrowed = RoleGuard.of(cfn, PARAMS, PSEUDO)
    needed = actions_of(_model("ecs", "RunTask"), {"tags": [{"key": "k", "value": "v"}]})
    assert not all(narrowed.allows("JobsFunction", a) for a in needed)
    assert not narrowed.allows("JobsFunction", "ecs:TagResource")


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
