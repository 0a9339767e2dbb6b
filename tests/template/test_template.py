"""template.yaml: cfn-lint clean, and its SAM translation wired the way SpotGuard needs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from spotguard.domain.settings import RebalanceMode
from spotguard.domain.tasks import ManageMode
from spotguard.runtime.config import InterruptionEnv
from spotguard_cli.emulator.template import TEMPLATE, load, resolve, translate

PARAMS = {"ClusterNames": "gpu-spot,train-a100"}


@pytest.fixture(scope="module")
def sam() -> dict[str, Any]:
    return load()


@pytest.fixture(scope="module")
def cfn() -> dict[str, Any]:
    return translate(parameters=PARAMS)


def _of_type(cfn, kind):
    return {k: v for k, v in cfn["Resources"].items() if v["Type"] == kind}


@pytest.mark.slow  # about 1.8 s of CPU: too near the 2 s a fast test may take (make test runs it)
def test_cfn_lint_is_clean():
    from cfnlint.api import lint_file

    matches = lint_file(TEMPLATE)
    assert [f"{m.rule.id} {m.message} (line {m.linenumber})" for m in matches] == []


def test_parameters_match_the_code(sam):
    p = sam["Parameters"]
    assert p["ClusterNames"]["Type"] == "CommaDelimitedList"
    assert set(p["RebalanceAction"]["AllowedValues"]) == {m.value for m in RebalanceMode}
    assert p["RebalanceAction"]["Default"] == "checkpoint"
    assert set(p["ManagedTasks"]["AllowedValues"]) == {m.value for m in ManageMode}
    assert p["CheckpointBucketName"]["Default"] == "" and p["NotificationEmail"]["Default"] == ""


def test_the_layer_is_built_by_sam(sam):
    layer = sam["Resources"]["CoreLayer"]
    assert layer["Metadata"]["BuildMethod"] == "python3.13"
    assert layer["Properties"]["ContentUri"] == "layers/core"


def test_every_function_reads_a_queue_with_partial_batch_responses(cfn):
    functions = _of_type(cfn, "AWS::Lambda::Function")
    mappings = _of_type(cfn, "AWS::Lambda::EventSourceMapping")
    assert functions
    for name, fn in functions.items():
        assert fn["Properties"]["Runtime"] == "python3.13"
        mine = [m for m in mappings.values() if m["Properties"]["FunctionName"] == {"Ref": name}]
        if name in ("JobsFunction", "ReconcileFunction"):  # invoked by hand / on a schedule
            assert mine == []
            continue
        assert mine, name
        for mapping in mine:
            assert mapping["Properties"]["FunctionResponseTypes"] == ["ReportBatchItemFailures"]


def test_queues_are_encrypted_and_redrive_to_an_alarmed_dead_letter_queue(cfn):
    queues = _of_type(cfn, "AWS::SQS::Queue")
    alarms = _of_type(cfn, "AWS::CloudWatch::Alarm")
    for q in queues.values():
        assert q["Properties"]["SqsManagedSseEnabled"] is True
    main = queues["InterruptionsQueue"]["Properties"]
    assert main["RedrivePolicy"]["deadLetterTargetArn"] == {
        "Fn::GetAtt": ["InterruptionsDeadLetterQueue", "Arn"]
    }
    watched = {json.dumps(a["Properties"]["Dimensions"]) for a in alarms.values()}
    assert any("InterruptionsDeadLetterQueue" in w for w in watched)
    assert all(a["Properties"]["AlarmActions"] == [{"Ref": "NotificationsTopic"}] for a in alarms.values())


def test_the_interruptions_queue_takes_only_interruption_rules(cfn):
    rules = _of_type(cfn, "AWS::Events::Rule")
    to_queue = {
        n: r
        for n, r in rules.items()
        if any(t["Arn"] == {"Fn::GetAtt": ["InterruptionsQueue", "Arn"]} for t in r["Properties"]["Targets"])
    }
    detail_types = sorted(
        dt for r in to_queue.values() for dt in r["Properties"]["EventPattern"]["detail-type"]
    )
    assert detail_types == sorted(
        [
            "EC2 Spot Instance Interruption Warning",
            "EC2 Instance Rebalance Recommendation",
            "EC2 Instance State-change Notification",
            "EC2 Instance-terminate Lifecycle Action",
            "AWS Health Event",
            "ECS Container Instance State Change",
        ]
    )
    assert "ECS Task State Change" not in detail_types  # the busy traffic never shares this queue
    for r in to_queue.values():
        (target,) = r["Properties"]["Targets"]
        assert target["DeadLetterConfig"]["Arn"] == {"Fn::GetAtt": ["InterruptionsDeadLetterQueue", "Arn"]}
    states = rules["InstanceStateRule"]["Properties"]["EventPattern"]["detail"]["state"]
    assert sorted(states) == ["shutting-down", "stopped", "stopping", "terminated"]


def test_function_environment_is_complete_for_the_code(cfn):
    env = cfn["Resources"]["InterruptionFunction"]["Properties"]["Environment"]["Variables"]
    required = {f.alias for f in InterruptionEnv.model_fields.values() if f.is_required()}
    assert required <= set(env)
    assert env["SPOTGUARD_REBALANCE"] == {"Ref": "RebalanceAction"}
    assert env["SPOTGUARD_INTERRUPTIONS_DLQ_URL"] == {"Ref": "InterruptionsDeadLetterQueue"}


def _statements(cfn, role):
    out = []
    for policy in cfn["Resources"][role]["Properties"]["Policies"]:
        if "Fn::If" in policy:
            policy = policy["Fn::If"][1]
        out += policy["PolicyDocument"]["Statement"]
    return out


def test_least_privilege(cfn):
    statements = _statements(cfn, "InterruptionFunctionRole")
    for s in statements:
        actions = s["Action"] if isinstance(s["Action"], list) else [s["Action"]]
        assert all("*" not in a for a in actions), s
        if s.get("Resource") == "*":
            assert actions == ["ecs:DescribeTaskDefinition"], (
                s
            )  # the one action without resource-level rights
    ecs = [
        s
        for s in statements
        if any(a in ("ecs:StopTask", "ecs:UpdateContainerInstancesState") for a in s["Action"])
    ]
    assert ecs and all(
        s["Condition"]["StringEquals"]["aws:ResourceAccount"] == {"Ref": "AWS::AccountId"} for s in ecs
    )
    text = json.dumps(ecs)
    assert "task/" in text and "container-instance/" in text and "ClusterNames" in text
    ssm = [s for s in statements if "ssm:SendCommand" in s["Action"]]
    assert ssm and "document/${SignalDocument}" in json.dumps(ssm)


def test_the_interruption_function_keeps_rebalance_facts_with_the_rights_it_had(cfn):
    """A rebalance recommendation on the host's pool (issue 18): DescribeContainerInstances on the
    watched clusters' container instances, then the pool's item in the ledger (GetItem and a conditional
    PutItem, or a Query of the cluster's pools); nothing wider, and nothing on another table."""
    statements = _statements(cfn, "InterruptionFunctionRole")

    def granted(action: str) -> list:
        return [s["Resource"] for s in statements if s["Effect"] == "Allow" and action in s["Action"]]

    (describe,) = granted("ecs:DescribeContainerInstances")
    assert "container-instance/" in json.dumps(describe) and "ClusterNames" in json.dumps(describe)
    for action in ("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Query"):
        assert granted(action) == [{"Fn::GetAtt": ["LedgerTable", "Arn"]}], action
    assert not granted("ec2:DescribeInstances") and not granted("autoscaling:DescribeAutoScalingInstances")


def test_ssm_rights_only_when_rebalance_checkpoints(cfn):
    policies = cfn["Resources"]["InterruptionFunctionRole"]["Properties"]["Policies"]
    conditional = [p for p in policies if "Fn::If" in p]
    assert len(conditional) == 1 and conditional[0]["Fn::If"][0] == "SignalsOverSsm"
    assert "ssm:SendCommand" in json.dumps(conditional) and "ssm:SendCommand" not in json.dumps(
        [p for p in policies if "Fn::If" not in p]
    )


def test_data_at_rest_is_encrypted_and_nothing_is_public(cfn):
    for t in _of_type(cfn, "AWS::DynamoDB::Table").values():
        assert t["Properties"]["SSESpecification"]["SSEEnabled"] is True
    bucket = cfn["Resources"]["CheckpointBucket"]["Properties"]
    assert bucket["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert all(bucket["PublicAccessBlockConfiguration"].values())
    policy = json.dumps(cfn["Resources"]["CheckpointBucketPolicy"])
    assert "aws:SecureTransport" in policy
    assert "aws:SecureTransport" in json.dumps(cfn["Resources"]["InterruptionsQueuePolicy"])
    # A key of the stack's own, which CloudWatch alarms may use (they cannot use aws/sns).
    assert cfn["Resources"]["NotificationsTopic"]["Properties"]["KmsMasterKeyId"] == {
        "Ref": "NotificationsKey"
    }
    key = cfn["Resources"]["NotificationsKey"]["Properties"]
    assert key["EnableKeyRotation"] is True
    assert "cloudwatch.amazonaws.com" in json.dumps(key["KeyPolicy"])


def test_an_existing_bucket_can_be_given(cfn):
    assert cfn["Resources"]["CheckpointBucket"]["Condition"] == "CreateCheckpointBucket"
    assert cfn["Conditions"]["CreateCheckpointBucket"] == {
        "Fn::Equals": [{"Ref": "CheckpointBucketName"}, ""]
    }


def test_the_ledger_survives_stack_deletion(cfn):
    assert cfn["Resources"]["LedgerTable"]["DeletionPolicy"] == "Retain"
    assert (
        cfn["Resources"]["LedgerTable"]["Properties"]["TimeToLiveSpecification"]["AttributeName"]
        == "expires_at"
    )


def test_checkpoint_manifests_reach_the_checkpoints_function(cfn):
    from spotguard.runtime.config import CheckpointsEnv

    bucket = cfn["Resources"]["CheckpointBucket"]["Properties"]
    assert bucket["NotificationConfiguration"]["EventBridgeConfiguration"]["EventBridgeEnabled"] is True
    rule = cfn["Resources"]["ManifestCommittedRule"]["Properties"]
    assert rule["EventPattern"]["detail"]["object"]["key"] == [{"suffix": "/MANIFEST.json"}]
    (target,) = rule["Targets"]
    assert target["Arn"] == {"Fn::GetAtt": ["CheckpointsQueue", "Arn"]}
    assert target["DeadLetterConfig"]["Arn"] == {"Fn::GetAtt": ["CheckpointsDeadLetterQueue", "Arn"]}
    env = cfn["Resources"]["CheckpointsFunction"]["Properties"]["Environment"]["Variables"]
    required = {f.alias for f in CheckpointsEnv.model_fields.values() if f.is_required()}
    assert required <= set(env)
    statements = _statements(cfn, "CheckpointsFunctionRole")
    assert all(s.get("Resource") != "*" for s in statements)
    reads = next(s for s in statements if s["Action"] == ["s3:GetObject"])
    assert "MANIFEST.json" in json.dumps(reads["Resource"])  # it reads manifests, nothing else


def test_the_layer_carries_what_tracing_needs():
    from spotguard_cli.emulator.template import REPO

    reqs = (REPO / "layers" / "core" / "requirements.txt").read_text()
    # EnableTracing=true makes the handlers create a Powertools Tracer, which imports the X-Ray SDK.
    assert "aws-lambda-powertools[tracer]" in reqs


def test_task_events_have_their_own_rule_queue_and_alarmed_dead_letter_queue(cfn):
    rule = cfn["Resources"]["TaskStateRule"]["Properties"]
    assert rule["EventPattern"]["detail-type"] == ["ECS Task State Change"]
    (target,) = rule["Targets"]
    assert target["Arn"] == {"Fn::GetAtt": ["TaskEventsQueue", "Arn"]}
    assert target["DeadLetterConfig"]["Arn"] == {"Fn::GetAtt": ["TaskEventsDeadLetterQueue", "Arn"]}
    queues = _of_type(cfn, "AWS::SQS::Queue")
    for name in ("TaskEventsQueue", "LaunchRetryQueue"):
        assert queues[name]["Properties"]["RedrivePolicy"]["deadLetterTargetArn"] == {
            "Fn::GetAtt": ["TaskEventsDeadLetterQueue", "Arn"]
        }
    alarms = json.dumps(_of_type(cfn, "AWS::CloudWatch::Alarm"))
    assert "TaskEventsDeadLetterQueue" in alarms
    policy = json.dumps(cfn["Resources"]["TaskEventsQueuePolicy"])
    assert "aws:SecureTransport" in policy and "LaunchRetryQueue" in policy


def test_job_functions_get_the_environment_the_code_needs(cfn):
    from spotguard.runtime.config import JobsEnv

    required = {f.alias for f in JobsEnv.model_fields.values() if f.is_required()}
    for name in ("TaskEventsFunction", "JobsFunction"):
        env = cfn["Resources"][name]["Properties"]["Environment"]["Variables"]
        assert required <= set(env), name
        assert env["SPOTGUARD_RETRY_QUEUE_URL"] == {"Ref": "LaunchRetryQueue"}


def test_jobs_policy_is_least_privilege(cfn):
    statements = cfn["Resources"]["JobsPolicy"]["Properties"]["PolicyDocument"]["Statement"]
    by_sid = {s["Sid"]: s for s in statements}
    for s in statements:
        actions = s["Action"] if isinstance(s["Action"], list) else [s["Action"]]
        assert all("*" not in a.split(":")[1] for a in actions), s  # no action wildcards
    unscoped = {a for s in statements if s["Resource"] == "*" for a in s["Action"]}
    # Read-only calls without resource-level permissions only (PassRole is on listed roles: below).
    assert unscoped == {
        "ecs:DescribeTaskDefinition",
        "ec2:DescribeInstances",
        "ec2:DescribeInstanceTypes",
        "ec2:DescribeSpotPriceHistory",
        "ec2:DescribeVolumes",
        "ec2:DescribeSnapshots",
    }
    # the EBS volumes role goes to ECS only, and EC2 changes touch only what carries a job's tag
    assert by_sid["PassTheVolumesRoleToEcs"]["Resource"] == {"Fn::GetAtt": ["EbsVolumesRole", "Arn"]}
    for sid in ("SnapshotJobVolumes", "DeleteOnlyJobVolumesAndSnapshots"):
        assert by_sid[sid]["Condition"] == {"StringLike": {"aws:ResourceTag/spotguard:job-id": "*"}}
    assert by_sid["SnapshotsAreTaggedWithTheirJob"]["Condition"] == {
        "StringLike": {"aws:RequestTag/spotguard:job-id": "*"}
    }
    run = by_sid["StartJobTasksInWatchedClusters"]
    assert "ClusterNames" in json.dumps(run["Condition"]["ArnLike"]["ecs:cluster"])
    assert by_sid["TagJobTasksAtLaunch"]["Condition"]["StringEquals"]["ecs:CreateAction"] == "RunTask"
    for sid in ("FollowAndStopJobTasks", "WhereJobTasksRun"):
        assert by_sid[sid]["Condition"]["StringEquals"]["aws:ResourceAccount"] == {"Ref": "AWS::AccountId"}
    for name in ("TaskEventsFunctionRole", "JobsFunctionRole"):
        assert {"Ref": "JobsPolicy"} in cfn["Resources"][name]["Properties"]["ManagedPolicyArns"]


def test_reconcile_runs_on_a_schedule(cfn):
    (schedule,) = _of_type(cfn, "AWS::Scheduler::Schedule").values()
    assert schedule["Properties"]["ScheduleExpression"] == "rate(5 minutes)"
    assert schedule["Properties"]["Target"]["Arn"] == {"Fn::GetAtt": ["ReconcileFunction", "Arn"]}
    # no reserved concurrency but the interruption function's optional floor (see its own test): it fails
    # deploys in accounts at the minimum unreserved concurrency
    for name, fn in _of_type(cfn, "AWS::Lambda::Function").items():
        assert name == "InterruptionFunction" or "ReservedConcurrentExecutions" not in fn["Properties"]


# ------------------------------------------------------------------ issue 17: hardening, what it checks
def _resolve(cfn: dict[str, Any], value: Any, parameters: dict[str, str] | None = None) -> Any:
    """What CloudFormation makes of `value` with PARAMS (and `parameters` over them)."""
    return resolve(cfn, value, {**PARAMS, **(parameters or {})})


def _jobs_statements(cfn):
    return {s["Sid"]: s for s in cfn["Resources"]["JobsPolicy"]["Properties"]["PolicyDocument"]["Statement"]}


JOBS_PATH = ("TaskEventsFunction", "JobsFunction", "ReconcileFunction")


def test_pass_role_is_limited_to_the_listed_roles_and_to_ecs(sam, cfn):
    p = sam["Parameters"]["TaskRoleArns"]
    assert p["Type"] == "CommaDelimitedList" and p["Default"] == ""
    pattern = re.compile(p["AllowedPattern"])
    for ok in (
        "",
        "arn:aws:iam::123456789012:role/spotguard-tasks/*",
        "arn:aws:iam::123456789012:role/train",
    ):
        assert pattern.fullmatch(ok), ok
    for bad in ("*", "arn:aws:iam::*:role/*", "arn:aws:iam::123456789012:user/x", "role/train"):
        assert not pattern.fullmatch(bad), bad
    passes = [s for s in _jobs_statements(cfn).values() if "iam:PassRole" in s["Action"]]
    assert passes and all(s["Resource"] != "*" for s in passes)
    listed = _jobs_statements(cfn)["PassListedRolesToEcsOnly"]
    assert listed["Condition"] == {
        "StringEquals": {"iam:PassedToService": ["ecs-tasks.amazonaws.com", "ecs.amazonaws.com"]}
    }
    # the default: roles under the path /spotguard/ of the stack's own account
    assert _resolve(cfn, listed["Resource"]) == "arn:aws:iam::123456789012:role/spotguard/*"
    roles = "arn:aws:iam::123456789012:role/ml/*,arn:aws:iam::123456789012:role/ecsTaskExecutionRole"
    assert _resolve(cfn, listed["Resource"], {"TaskRoleArns": roles}) == roles.split(",")
    # the stack's EBS volumes role: to ECS (the service, for volumes) only
    ebs = _jobs_statements(cfn)["PassTheVolumesRoleToEcs"]
    assert ebs["Resource"] == {"Fn::GetAtt": ["EbsVolumesRole", "Arn"]}
    assert ebs["Condition"] == {"StringEquals": {"iam:PassedToService": "ecs.amazonaws.com"}}


def test_run_task_is_limited_to_the_listed_task_definition_families(sam, cfn):
    p = sam["Parameters"]["TaskDefinitionFamilies"]
    assert p["Type"] == "CommaDelimitedList" and p["Default"] == ""
    run = _jobs_statements(cfn)["StartJobTasksInWatchedClusters"]
    assert run["Action"] == ["ecs:RunTask"]
    assert _resolve(cfn, run["Resource"]) == "arn:aws:ecs:us-east-1:123456789012:task-definition/*"
    assert _resolve(cfn, run["Resource"], {"TaskDefinitionFamilies": "train,eval"}) == [
        "arn:*:ecs:*:*:task-definition/train:*",
        "arn:*:ecs:*:*:task-definition/eval:*",
    ]
    assert run["Condition"]["StringEquals"] == {
        "aws:RequestedRegion": {"Ref": "AWS::Region"},
        "aws:ResourceAccount": {"Ref": "AWS::AccountId"},
    }
    # the listed names below match a cluster of that name anywhere: this pins it to the stack's own
    assert _resolve(cfn, run["Condition"]["StringLike"]["ecs:cluster"]) == (
        "arn:aws:ecs:us-east-1:123456789012:cluster/*"
    )
    assert _resolve(cfn, run["Condition"]["ArnLike"]["ecs:cluster"]) == [
        "arn:*:ecs:*:*:cluster/gpu-spot",
        "arn:*:ecs:*:*:cluster/train-a100",
    ]


def test_the_jobs_path_reads_the_roles_and_families_it_may_use(cfn):
    roles = "arn:aws:iam::123456789012:role/ml/*,arn:aws:iam::123456789012:role/x"
    for name in JOBS_PATH:
        env = cfn["Resources"][name]["Properties"]["Environment"]["Variables"]
        assert _resolve(cfn, env["SPOTGUARD_PASS_ROLES"]) == "arn:aws:iam::123456789012:role/spotguard/*"
        assert _resolve(cfn, env["SPOTGUARD_TASK_FAMILIES"]) == ""
        given = {"TaskRoleArns": roles, "TaskDefinitionFamilies": "train,eval"}
        assert _resolve(cfn, env["SPOTGUARD_PASS_ROLES"], given) == roles
        assert _resolve(cfn, env["SPOTGUARD_TASK_FAMILIES"], given) == "train,eval"


def test_snapshots_are_tagged_only_as_they_are_created(cfn):
    statements = list(_jobs_statements(cfn).values())
    tagging = [s for s in statements if "ec2:CreateTags" in s["Action"]]
    assert tagging
    for s in tagging:
        assert s["Action"] == ["ec2:CreateTags"] and "::snapshot/*" in json.dumps(s["Resource"])
        assert s["Condition"]["StringEquals"] == {"ec2:CreateAction": "CreateSnapshot"}
        assert s["Condition"]["StringLike"] == {"aws:RequestTag/spotguard:job-id": "*"}
    # and what may be deleted carries a job's tag (which nothing but CreateSnapshot and ECS put on)
    deletes = [s for s in statements if {"ec2:DeleteVolume", "ec2:DeleteSnapshot"} & set(s["Action"])]
    assert deletes and all(
        s["Condition"] == {"StringLike": {"aws:ResourceTag/spotguard:job-id": "*"}} for s in deletes
    )


def _signal_document(cfn):
    return cfn["Resources"]["SignalDocument"]["Properties"]


def test_signals_go_only_through_spotguards_own_document(cfn):
    from spotguard.adapters.ssm import SIGNALS

    role = json.dumps(cfn["Resources"]["InterruptionFunctionRole"])
    assert "AWS-RunShellScript" not in role
    (send,) = [s for s in _statements(cfn, "InterruptionFunctionRole") if "ssm:SendCommand" in s["Action"]]
    assert _resolve(cfn, send["Resource"]) == [
        "arn:aws:ssm:us-east-1:123456789012:document/<SignalDocument>",
        "arn:aws:ec2:us-east-1:123456789012:instance/*",
    ]
    doc = _signal_document(cfn)
    assert doc["DocumentType"] == "Command"
    params = doc["Content"]["parameters"]
    assert set(params) == {"signal", "containerIds", "taskContainers"}
    assert set(params["signal"]["allowedValues"]) == set(SIGNALS)
    env = cfn["Resources"]["InterruptionFunction"]["Properties"]["Environment"]["Variables"]
    assert env["SPOTGUARD_SIGNAL_DOCUMENT"] == {"Ref": "SignalDocument"}


TASK_ARN = "arn:aws:ecs:us-east-1:123456789012:task/gpu-spot/0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize(
    ("parameter", "value", "allowed"),
    [
        ("containerIds", "", True),
        ("containerIds", "0123456789ab", True),
        ("containerIds", "a" * 64 + " " + "b" * 12, True),
        ("containerIds", "0123456789ab; reboot", False),
        ("containerIds", "$(reboot)", False),
        ("containerIds", "0123456789ab\nreboot", False),
        ("containerIds", "0123456789ab ", False),
        ("taskContainers", f"{TASK_ARN}=train", True),
        ("taskContainers", f"{TASK_ARN}=train {TASK_ARN}=log-router", True),
        (
            "taskContainers",
            "arn:aws:ecs:us-east-1:123456789012:task/0123abcd-0123-4567-89ab-0123456789ab=t",
            True,
        ),
        ("taskContainers", f"{TASK_ARN}=train;reboot", False),
        ("taskContainers", f"{TASK_ARN}=train' x", False),
        ("taskContainers", f"{TASK_ARN}=`id`", False),
        ("taskContainers", f"{TASK_ARN}", False),
    ],
)
def test_the_documents_parameters_admit_ids_and_nothing_a_shell_would_read(cfn, parameter, value, allowed):
    pattern = _signal_document(cfn)["Content"]["parameters"][parameter]["allowedPattern"]
    assert bool(re.fullmatch(pattern, value)) is allowed


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_documents_script_signals_exactly_the_named_containers(cfn, tmp_path: Path):
    """The document's commands, with its parameters put in as SSM does, run by bash against a fake docker
    that records what it is asked."""
    docker = tmp_path / "docker"
    docker.write_text(
        f'#!/bin/sh\necho "$*" >> {tmp_path}/calls\nif [ "$1" = ps ]; then echo cafe0000cafe; fi\n'
    )
    docker.chmod(0o755)
    values = {
        "signal": "SIGUSR1",
        "containerIds": "0123456789ab fedcba987654",
        "taskContainers": f"{TASK_ARN}=train",
    }
    step = _signal_document(cfn)["Content"]["mainSteps"][0]
    assert step["action"] == "aws:runShellScript"
    script = "\n".join(step["inputs"]["runCommand"])
    script = re.sub(r"\{\{ (\w+) \}\}", lambda m: values[m[1]], script)
    subprocess.run(["bash", "-c", script], check=True, env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, timeout=10)
    assert (tmp_path / "calls").read_text().splitlines() == [
        "kill --signal=SIGUSR1 0123456789ab",
        "kill --signal=SIGUSR1 fedcba987654",
        f"ps -q --filter label=com.amazonaws.ecs.task-arn={TASK_ARN}"
        " --filter label=com.amazonaws.ecs.container-name=train",
        "kill --signal=SIGUSR1 cafe0000cafe",
    ]
    (tmp_path / "calls").unlink()
    empty = re.sub(
        r"\{\{ (\w+) \}\}",
        lambda m: {**values, "containerIds": "", "taskContainers": ""}[m[1]],
        "\n".join(step["inputs"]["runCommand"]),
    )
    subprocess.run(["bash", "-c", empty], check=True, env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, timeout=10)
    assert not (tmp_path / "calls").exists()  # nothing named, nothing signalled


RULES_OF = {
    "InterruptionsQueue": {
        "SpotInterruptionRule",
        "InstanceStateRule",
        "LifecycleActionRule",
        "HealthEventRule",
        "ContainerInstanceRule",
    },
    "CheckpointsQueue": {"ManifestCommittedRule"},
    "TaskEventsQueue": {"TaskStateRule", "EbsSnapshotRule", "PoolLaunchFailureRule", "EarlyReplacementRule"},
}
JOBS_ROLES = {"TaskEventsFunctionRole", "JobsFunctionRole", "ReconcileFunctionRole"}
SENDERS = {  # queue -> (the rules that may send to it, the roles that may send to it)
    "InterruptionsQueue": (RULES_OF["InterruptionsQueue"], {"InterruptionFunctionRole"}),
    "InterruptionsDeadLetterQueue": (RULES_OF["InterruptionsQueue"], {"InterruptionFunctionRole"}),
    "CheckpointsQueue": (RULES_OF["CheckpointsQueue"], set()),
    "CheckpointsDeadLetterQueue": (RULES_OF["CheckpointsQueue"], {"CheckpointsFunctionRole"}),
    "TaskEventsQueue": (RULES_OF["TaskEventsQueue"], set()),
    "TaskEventsDeadLetterQueue": (RULES_OF["TaskEventsQueue"], JOBS_ROLES),
    "LaunchRetryQueue": (set(), JOBS_ROLES),
    "ReconcileDeadLetterQueue": (set(), {"ReconcileFunctionRole", "ReconcileScheduleRole"}),
}


def _names(values: Any) -> set[str]:
    """The resources named (a conditional one, `!If [C, X, AWS::NoValue]`, by its X)."""
    values = values if isinstance(values, list) else [values]
    values = [v["Fn::If"][1] if "Fn::If" in v else v for v in values]
    return {v["Fn::GetAtt"][0] for v in values}


def _deny_exemptions(cfn, queue: str) -> tuple[set[str], set[str]] | None:
    """The rules and roles a queue's Deny on sqs:SendMessage exempts (None: no such Deny)."""
    for policy in _of_type(cfn, "AWS::SQS::QueuePolicy").values():
        for s in policy["Properties"]["PolicyDocument"]["Statement"]:
            if s["Effect"] == "Deny" and s["Action"] == "sqs:SendMessage" and queue in _names(s["Resource"]):
                assert s["Principal"] == "*" and set(s["Condition"]) == {"ArnNotEquals"}, s
                keys = s["Condition"]["ArnNotEquals"]
                assert set(keys) <= {"aws:SourceArn", "aws:PrincipalArn"}, s
                return _names(keys.get("aws:SourceArn", [])), _names(keys.get("aws:PrincipalArn", []))
    return None


def _what_sends_to(cfn, queue: str) -> tuple[set[str], set[str]]:
    """Every rule that targets the queue (or dead-letters to it), and every role granted SendMessage on it."""
    arn = {"Fn::GetAtt": [queue, "Arn"]}
    rules = {
        name
        for name, r in _of_type(cfn, "AWS::Events::Rule").items()
        for t in r["Properties"]["Targets"]
        if arn in (t["Arn"], t.get("DeadLetterConfig", {}).get("Arn"))
    }
    roles = set()
    managed = {
        name: p["Properties"]["PolicyDocument"]
        for name, p in _of_type(cfn, "AWS::IAM::ManagedPolicy").items()
    }
    for name, role in _of_type(cfn, "AWS::IAM::Role").items():
        docs = [p["Fn::If"][1] if "Fn::If" in p else p for p in role["Properties"].get("Policies", [])]
        docs = [d["PolicyDocument"] for d in docs]
        docs += [managed[m["Ref"]] for m in role["Properties"].get("ManagedPolicyArns", []) if "Ref" in m]
        for doc in docs:
            for s in doc["Statement"]:
                actions = s["Action"] if isinstance(s["Action"], list) else [s["Action"]]
                resources = s.get("Resource", [])
                resources = resources if isinstance(resources, list) else [resources]
                if s["Effect"] == "Allow" and "sqs:SendMessage" in actions and arn in resources:
                    roles.add(name)
    return rules, roles


def test_queues_refuse_senders_other_than_the_stacks_rules_and_functions(cfn):
    queues = set(_of_type(cfn, "AWS::SQS::Queue"))
    assert queues == set(SENDERS)
    for queue, expected in SENDERS.items():
        assert _deny_exemptions(cfn, queue) == expected, queue
        # what the stack itself sends is exactly what the Deny lets through: no own sender refused
        assert _what_sends_to(cfn, queue) == expected, queue


def _alarm_on(cfn, namespace: str, metric: str, dimension: dict[str, Any]) -> dict[str, Any]:
    (alarm,) = [
        a["Properties"]
        for a in _of_type(cfn, "AWS::CloudWatch::Alarm").values()
        if (a["Properties"]["Namespace"], a["Properties"]["MetricName"]) == (namespace, metric)
        and a["Properties"]["Dimensions"] == [dimension]
    ]
    assert alarm["AlarmActions"] == [{"Ref": "NotificationsTopic"}]
    return alarm


def test_a_notice_waiting_in_its_queue_is_alarmed_well_inside_the_two_minutes(cfn):
    alarm = _alarm_on(
        cfn,
        "AWS/SQS",
        "ApproximateAgeOfOldestMessage",
        {"Name": "QueueName", "Value": {"Fn::GetAtt": ["InterruptionsQueue", "QueueName"]}},
    )
    assert alarm["Statistic"] == "Maximum" and alarm["ComparisonOperator"] == "GreaterThanThreshold"
    assert alarm["Threshold"] <= 30  # a quarter of the warning's two minutes
    assert alarm["Period"] * alarm["EvaluationPeriods"] <= 60


def test_every_function_has_error_and_throttle_alarms(cfn):
    functions = _of_type(cfn, "AWS::Lambda::Function")
    assert len(functions) == 5
    for name in functions:
        for metric in ("Errors", "Throttles"):
            alarm = _alarm_on(cfn, "AWS/Lambda", metric, {"Name": "FunctionName", "Value": {"Ref": name}})
            assert alarm["Statistic"] == "Sum" and alarm["Threshold"] == 0
            assert alarm["ComparisonOperator"] == "GreaterThanThreshold" and alarm["Period"] == 60


def test_every_dead_letter_queue_is_alarmed(cfn):
    dead = {q for q in _of_type(cfn, "AWS::SQS::Queue") if "DeadLetter" in q}
    assert dead == {
        "InterruptionsDeadLetterQueue",
        "CheckpointsDeadLetterQueue",
        "TaskEventsDeadLetterQueue",
        "ReconcileDeadLetterQueue",
    }
    for q in dead:
        alarm = _alarm_on(
            cfn,
            "AWS/SQS",
            "ApproximateNumberOfMessagesVisible",
            {"Name": "QueueName", "Value": {"Fn::GetAtt": [q, "QueueName"]}},
        )
        assert alarm["Threshold"] == 0 and alarm["ComparisonOperator"] == "GreaterThanThreshold"


def test_reconcile_failures_are_retried_dead_lettered_and_alarmed(cfn):
    dlq = {"Fn::GetAtt": ["ReconcileDeadLetterQueue", "Arn"]}
    (schedule,) = _of_type(cfn, "AWS::Scheduler::Schedule").values()
    target = schedule["Properties"]["Target"]
    assert target["RetryPolicy"]["MaximumRetryAttempts"] >= 1
    assert target["DeadLetterConfig"] == {"Arn": dlq}
    assert target["RoleArn"] == {"Fn::GetAtt": ["ReconcileScheduleRole", "Arn"]}
    assert (
        _resolve(cfn, schedule["Properties"]["Name"]) == "spotguard-reconcile"
    )  # the stack name, as deployed
    # the schedule invokes asynchronously: the function's own retries and dead-letter queue
    fn = cfn["Resources"]["ReconcileFunction"]["Properties"]
    assert fn["DeadLetterConfig"] == {"TargetArn": dlq}
    (invoke,) = _of_type(cfn, "AWS::Lambda::EventInvokeConfig").values()
    assert invoke["Properties"]["FunctionName"] == {"Ref": "ReconcileFunction"}
    assert invoke["Properties"]["MaximumRetryAttempts"] >= 1
    assert invoke["Properties"]["MaximumEventAgeInSeconds"] < 300  # done before the next sweep


def test_the_interruption_function_can_have_a_concurrency_floor(sam, cfn):
    p = sam["Parameters"]["InterruptionReservedConcurrency"]
    assert p["Default"] == "0"
    pattern = re.compile(p["AllowedPattern"])
    assert [v for v in ("0", "1", "2", "10", "999", "00", "01", "1000", "-1") if pattern.fullmatch(v)] == [
        "0",
        "2",
        "10",
        "999",
    ]
    fn = cfn["Resources"]["InterruptionFunction"]["Properties"]
    mapping = cfn["Resources"]["InterruptionFunctionInterruptions"]["Properties"]
    # none by default (a deploy at the minimum unreserved concurrency must not fail) ...
    assert _resolve(cfn, fn).get("ReservedConcurrentExecutions") is None
    assert "ScalingConfig" not in _resolve(cfn, mapping)
    # ... and when asked for, the poller never drives the function past it (throttled batches would
    # come back with their receive count up and reach the dead-letter queue)
    given = {"InterruptionReservedConcurrency": "20"}
    assert _resolve(cfn, fn, given)["ReservedConcurrentExecutions"] == "20"
    assert _resolve(cfn, mapping, given)["ScalingConfig"] == {"MaximumConcurrency": "20"}


def test_the_reconcile_function_checks_a_bucket_the_user_brought(cfn):
    from spotguard.runtime.bucket_check import BucketCheckEnv

    env = cfn["Resources"]["ReconcileFunction"]["Properties"]["Environment"]["Variables"]
    assert {f.alias for f in BucketCheckEnv.model_fields.values()} <= set(env)
    assert _resolve(cfn, env["SPOTGUARD_BUCKET_CHECK"]) == "off"  # the stack's own bucket
    assert _resolve(cfn, env["SPOTGUARD_BUCKET_CHECK"], {"CheckpointBucketName": "mine"}) == "on"
    (read,) = [
        s
        for s in _statements(cfn, "ReconcileFunctionRole")
        if s.get("Sid") == "ReadTheCheckpointBucketsSettings"
    ]
    # the calls S3BucketSettings makes, as IAM names them; on the bucket only, reading only
    assert set(read["Action"]) == {
        "s3:GetBucketVersioning",
        "s3:GetEncryptionConfiguration",
        "s3:GetBucketPublicAccessBlock",
        "s3:GetBucketNotification",
    }
    assert _resolve(cfn, read["Resource"], {"CheckpointBucketName": "mine"}) == "arn:aws:s3:::mine"


def test_a_function_fed_by_a_queue_reads_no_other_queue(cfn):
    """SAM attaches AWSLambdaSQSQueueExecutionRole (receive and delete on every queue of the account) to
    each function an SQS event source feeds: a Deny leaves each its own queues only."""
    mappings = _of_type(cfn, "AWS::Lambda::EventSourceMapping").values()
    fed = {}
    for m in mappings:
        fed.setdefault(m["Properties"]["FunctionName"]["Ref"], []).append(m["Properties"]["EventSourceArn"])
    assert set(fed) == {"InterruptionFunction", "CheckpointsFunction", "TaskEventsFunction"}
    for fn, queues in fed.items():
        role = cfn["Resources"][f"{fn}Role"]["Properties"]
        assert (
            "arn:aws:iam::aws:policy/service-role/AWSLambdaSQSQueueExecutionRole" in role["ManagedPolicyArns"]
        )
        (deny,) = [s for s in _statements(cfn, f"{fn}Role") if s.get("Sid") == "ReadNoQueueButItsOwn"]
        assert deny["Effect"] == "Deny" and "Resource" not in deny
        assert set(deny["Action"]) == {"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"}
        not_resource = deny["NotResource"] if isinstance(deny["NotResource"], list) else [deny["NotResource"]]
        assert sorted(map(json.dumps, not_resource)) == sorted(map(json.dumps, queues)), fn


def test_only_spotguards_own_lifecycle_hooks_reach_it(sam):
    """Every terminate lifecycle action in the account reached SpotGuard, which completed it: ECS managed
    draining's hook and other teams' were cut short. The rule now takes only hooks with SpotGuard's
    prefix, and the function is told the same prefix (it ignores any other that still arrives)."""
    rules = [
        r
        for r in sam["Resources"].values()
        if r["Type"] == "AWS::Events::Rule"
        and "EC2 Instance-terminate Lifecycle Action"
        in r["Properties"]["EventPattern"].get("detail-type", [])
    ]
    (rule,) = rules
    assert rule["Properties"]["EventPattern"]["detail"] == {
        "LifecycleHookName": [{"prefix": {"Ref": "LifecycleHookPrefix"}}]
    }
    assert sam["Parameters"]["LifecycleHookPrefix"]["Default"] == "spotguard-"
    env = sam["Resources"]["InterruptionFunction"]["Properties"]["Environment"]["Variables"]
    assert env["SPOTGUARD_LIFECYCLE_HOOK_PREFIX"] == {"Ref": "LifecycleHookPrefix"}


def test_the_layer_carries_every_library_the_core_imports():
    """Every module the core layer imports is the standard library's, the Lambda runtime's (boto3 and
    what comes with it) or pinned in the layer's requirements: a deployed function cannot import what
    only the developers' virtual environment has (numpy, for the capacity policy, was once missing)."""
    import ast
    import re
    import sys

    from spotguard_cli.emulator.template import REPO

    core = REPO / "layers" / "core"
    pinned = {
        re.split(r"[\[=<>~ ]", line.strip(), maxsplit=1)[0].replace("-", "_").lower()
        for line in (core / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    runtime = {"boto3", "botocore", "s3transfer", "jmespath", "dateutil", "urllib3", "six"}
    imported: dict[str, str] = {}
    for path in (core / "spotguard").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                imported.setdefault(name.split(".")[0], str(path.relative_to(core)))
    missing = {
        top: where
        for top, where in imported.items()
        if top not in sys.stdlib_module_names
        and top not in runtime
        and top != "spotguard"
        and top not in pinned
    }
    assert pinned >= {"aws_lambda_powertools", "pydantic", "numpy"}
    assert not missing, f"imported by the core layer but not in its requirements.txt: {missing}"


def test_every_statement_that_names_clusters_by_name_pins_the_stack_s_account_and_region(cfn):
    """Clusters are listed by name (`arn:*:ecs:*:*:cluster/NAME`, as CloudFormation cannot prefix each
    name of a list): every statement built that way must pin the account and region in its condition."""
    pinned = {"aws:ResourceAccount": {"Ref": "AWS::AccountId"}, "aws:RequestedRegion": {"Ref": "AWS::Region"}}
    found = 0
    for name, resource in cfn["Resources"].items():
        if resource["Type"] not in ("AWS::IAM::Role", "AWS::IAM::ManagedPolicy"):
            continue
        props = resource["Properties"]
        docs = [props["PolicyDocument"]] if "PolicyDocument" in props else []
        for policy in props.get("Policies", []):
            policy = policy["Fn::If"][1] if "Fn::If" in policy else policy
            docs.append(policy["PolicyDocument"])
        for doc in docs:
            for statement in doc["Statement"]:
                if statement.get("Effect") != "Allow" or "arn:*:ecs:*:*:" not in json.dumps(statement):
                    continue
                found += 1
                condition = statement.get("Condition", {}).get("StringEquals", {})
                assert {k: condition.get(k) for k in pinned} == pinned, (name, statement.get("Sid"))
    assert found >= 8


def test_failed_pool_discovery_is_alarmed_on_the_metric_reconcile_emits(cfn):
    alarm = cfn["Resources"]["PoolDiscoveryAlarm"]["Properties"]
    env = cfn["Resources"]["ReconcileFunction"]["Properties"]["Environment"]["Variables"]
    # reconcile's handler emits each count of its sweep as Reconcile<Count>; discovery_errors is one
    assert alarm["MetricName"] == "Reconcile" + "discovery_errors".title().replace("_", "")
    assert alarm["Namespace"] == env["POWERTOOLS_METRICS_NAMESPACE"]
    assert alarm["Dimensions"] == [{"Name": "service", "Value": env["POWERTOOLS_SERVICE_NAME"]}]
    assert alarm["EvaluationPeriods"] == alarm["DatapointsToAlarm"] == 2  # one bad sweep pages no one
    assert alarm["AlarmActions"] == [{"Ref": "NotificationsTopic"}]


def test_the_early_replacement_scales_only_the_listed_groups_and_is_off_without_them(cfn):
    """SpareCapacityGroups: the jobs path's three functions may raise and lower only the listed groups
    (SetDesiredCapacity, TerminateInstanceInAutoScalingGroup), list container instances only in the
    watched clusters, and the warnings reach them through their own rule; none of it without groups."""
    groups = {"SpareCapacityGroups": "gpu-spot-a-group,gpu-od-group"}
    assert cfn["Resources"]["SparesPolicy"]["Condition"] == "EarlyReplacement"
    assert cfn["Resources"]["EarlyReplacementRule"]["Condition"] == "EarlyReplacement"
    policy = _resolve(cfn, cfn["Resources"]["SparesPolicy"]["Properties"]["PolicyDocument"], groups)
    by_sid = {s["Sid"]: s for s in policy["Statement"]}
    scale = by_sid["SpareInstancesInListedGroupsOnly"]
    assert scale["Action"] == [
        "autoscaling:SetDesiredCapacity",
        "autoscaling:TerminateInstanceInAutoScalingGroup",
    ]
    assert scale["Resource"] == [
        "arn:*:autoscaling:*:*:autoScalingGroup:*:autoScalingGroupName/gpu-spot-a-group",
        "arn:*:autoscaling:*:*:autoScalingGroup:*:autoScalingGroupName/gpu-od-group",
    ]
    assert scale["Condition"]["StringEquals"]["aws:ResourceAccount"] == "123456789012"
    assert by_sid["SpareInstancesOfListedClusters"]["Resource"] == [
        "arn:*:ecs:*:*:cluster/gpu-spot",
        "arn:*:ecs:*:*:cluster/train-a100",
    ]
    unscoped = {a for s in policy["Statement"] if s["Resource"] == "*" for a in s["Action"]}
    assert unscoped == {"autoscaling:DescribeAutoScalingGroups"}
    for fn in JOBS_PATH:
        arns = cfn["Resources"][f"{fn}Role"]["Properties"]["ManagedPolicyArns"]
        assert "<SparesPolicy>" in _resolve(cfn, arns, groups), fn
        assert "<SparesPolicy>" not in _resolve(cfn, arns), fn
    interruption = json.dumps(cfn["Resources"]["InterruptionFunctionRole"])
    assert "SparesPolicy" not in interruption and "SetDesiredCapacity" not in interruption
    rule = _resolve(cfn, cfn["Resources"]["EarlyReplacementRule"]["Properties"], groups)
    assert rule["Targets"][0]["Arn"] == "<TaskEventsQueue.Arn>"
    patterns = rule["EventPattern"]["$or"]
    assert {p["detail-type"][0] for p in patterns} == {
        "EC2 Spot Instance Interruption Warning",
        "EC2 Instance-terminate Lifecycle Action",
    }
    early = _resolve(
        cfn, cfn["Resources"]["EarlyReplacementRule"]["Properties"], {**groups, "SpareOnRebalance": "true"}
    )
    assert "EC2 Instance Rebalance Recommendation" in {
        p["detail-type"][0] for p in early["EventPattern"]["$or"]
    }
    env = _resolve(cfn, cfn["Resources"]["TaskEventsFunction"]["Properties"]["Environment"], groups)
    assert env["Variables"]["SPOTGUARD_SPARE_GROUPS"] == "gpu-spot-a-group,gpu-od-group"
    assert (
        _resolve(cfn, cfn["Resources"]["TaskEventsFunction"]["Properties"]["Environment"])["Variables"][
            "SPOTGUARD_SPARE_GROUPS"
        ]
        == ""
    )
