"""Every RunTask/StartTask error ECS documents, classed: capacity and transient ones wait, access and
request ones end the job; the adapter turns the API's answer into that class."""

from __future__ import annotations

import boto3
import pytest
from botocore.stub import Stubber

from spotguard.adapters.job_ecs import JobEcsAdapter
from spotguard.domain.jobs.run_errors import classify_run_error, pool_refused

DOCUMENTED = [
    ("AccessDeniedException", "User is not authorized to perform: iam:PassRole", "access"),
    ("BlockedException", "Your account is blocked", "access"),
    ("ClientException", "TaskDefinition is inactive", "request"),
    ("ClusterNotFoundException", "Cluster not found.", "request"),
    ("ConflictException", "The clientToken is already in use with a different request", "transient"),
    ("InvalidParameterException", "No Container Instances were found in your cluster.", "capacity"),
    ("InvalidParameterException", "No Container Instances were found in your capacity provider.", "capacity"),
    ("InvalidParameterException", "Task definition does not support launch_type FARGATE.", "request"),
    ("PlatformTaskDefinitionIncompatibilityException", "needs platform 1.4.0", "request"),
    ("PlatformUnknownException", "The specified platform version does not exist.", "request"),
    ("ServerException", "Service unavailable. Please try again later.", "transient"),
    ("UnsupportedFeatureException", "not supported in this Region", "request"),
    ("ThrottlingException", "Rate exceeded", "transient"),
    ("ClientException", "Tasks provisioning capacity limit exceeded.", "capacity"),
    (
        "InvalidParameterException",
        "Error retrieving security group information for [sg-1]: Request limit exceeded.",
        "transient",
    ),
]


@pytest.mark.parametrize(("code", "message", "kind"), DOCUMENTED)
def test_every_documented_error_has_a_class(code, message, kind):
    assert classify_run_error(code, message) == kind


PROVIDER_GONE = [
    (
        "InvalidParameterException",
        "The specified capacity provider strategy cannot contain a capacity provider that is not associated "
        "with the cluster. Associate the capacity provider with the cluster or specify a valid capacity "
        "provider and try again.",
    ),
    (
        "InvalidParameterException",
        "The specified capacity provider 'gpu-spot-a' is not in an ACTIVE state. Specify a valid capacity "
        "provider and try again.",
    ),
    ("ClientException", "The specified capacity provider does not exist."),
]


@pytest.mark.parametrize(("code", "message"), PROVIDER_GONE)
def test_a_refused_capacity_provider_is_a_request_error_about_the_pool(code, message):
    """A request error (the job fails when its request named the provider), which a launch SpotGuard
    placed in a pool takes as that pool gone (usecases.jobs.engine)."""
    assert classify_run_error(code, message) == "request"
    assert pool_refused(f"{code}: {message}")


@pytest.mark.parametrize(
    "reason",
    [
        "InvalidParameterException: No Container Instances were found in your capacity provider.",
        "InvalidParameterException: Task definition does not support launch_type FARGATE.",
        "ClusterNotFoundException: The specified capacity provider does not exist.",  # not its code
        "AccessDeniedException: not authorized on capacity provider gpu-spot that is not in an ACTIVE state",
    ],
)
def test_other_errors_are_not_a_refused_provider(reason):
    assert not pool_refused(reason)


def test_the_adapter_says_a_refused_provider_as_code_and_message():
    adapter, stub = _adapter()
    code, message = PROVIDER_GONE[0]
    stub.add_client_error("run_task", code, message)
    with stub:
        result = adapter.run_task({"cluster": "gpu-spot", "taskDefinition": "train:1"})
    assert result.failure == "request" and pool_refused(result.reason)


def test_an_undocumented_error_is_not_guessed():
    assert classify_run_error("ValidationException", "something new") is None


def _adapter():
    client = boto3.client("ecs", region_name="us-east-1")
    return JobEcsAdapter(client), Stubber(client)


def test_an_empty_cluster_is_capacity_not_a_bad_request():
    """It failed the job for good: InvalidParameterException was taken as a bad request."""
    adapter, stub = _adapter()
    stub.add_client_error(
        "run_task", "InvalidParameterException", "No Container Instances were found in your cluster."
    )
    with stub:
        result = adapter.run_task({"cluster": "gpu-spot", "taskDefinition": "train:1"})
    assert result.task_arn is None and result.failure == "capacity"
    assert "No Container Instances" in result.reason


def test_failures_in_the_answer_are_capacity_and_an_unknown_error_is_raised():
    adapter, stub = _adapter()
    stub.add_response(
        "run_task",
        {"tasks": [], "failures": [{"reason": "RESOURCE:GPU", "arn": "arn:aws:ecs:us-east-1:1:ci/x"}]},
    )
    stub.add_client_error("run_task", "SomethingNew", "a code ECS does not document for RunTask")
    with stub:
        placed_none = adapter.run_task({"cluster": "gpu-spot", "taskDefinition": "train:1"})
        with pytest.raises(Exception, match="SomethingNew"):
            adapter.run_task({"cluster": "gpu-spot", "taskDefinition": "train:1"})
    assert placed_none.failure == "capacity" and placed_none.reason == "RESOURCE:GPU"


def test_a_conflict_over_the_client_token_is_the_task_that_token_started():
    """A repeated launch whose parameters moved on (a newer checkpoint) gets ConflictException naming
    the task its token started: that task is the attempt; retrying with a new token would start a
    second one beside it."""
    adapter, stub = _adapter()
    arn = "arn:aws:ecs:us-east-1:123456789012:task/gpu-spot/0123456789abcdef0123456789abcdef"
    stub.add_client_error(
        "run_task",
        "ConflictException",
        "The clientToken is already in use with a different request",
        modeled_fields={"resourceIds": [arn]},
    )
    with stub:
        result = adapter.run_task({"cluster": "gpu-spot", "taskDefinition": "train:1", "clientToken": "t"})
    assert result.task_arn == arn and result.failure is None
