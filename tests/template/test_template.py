"""template.yaml: cfn-lint clean, and its SAM translation wired the way SpotGuard needs."""

from __future__ import annotations

import json
from typing import Any

import pytest

from spotguard.config import InterruptionEnv
from spotguard.domain.notices import RebalanceMode
from spotguard.domain.tasks import ManageMode
from spotguard_cli.emulator.template import TEMPLATE, load, translate

PARAMS = {"ClusterNames": "gpu-spot,train-a100"}


@pytest.fixture(scope="module")
def sam() -> dict[str, Any]:
    return load()


@pytest.fixture(scope="module")
def cfn() -> dict[str, Any]:
    return translate(parameters=PARAMS)


def _of_type(cfn, kind):
    return {k: v for k, v in cfn["Resources"].items() if v["Type"] == kind}


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
    assert ssm and "AWS-RunShellScript" in json.dumps(ssm)


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
    from spotguard.config import CheckpointsEnv

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
    assert all(s["Resource"] != "*" for s in statements)
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
    from spotguard.config import JobsEnv

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
    # Read-only calls without resource-level permissions, and PassRole (conditioned below).
    assert unscoped == {
        "ecs:DescribeTaskDefinition",
        "ec2:DescribeInstances",
        "ec2:DescribeInstanceTypes",
        "ec2:DescribeSpotPriceHistory",
        "ec2:DescribeVolumes",
        "ec2:DescribeSnapshots",
        "iam:PassRole",
    }
    assert by_sid["PassTaskRolesToEcsOnly"]["Condition"] == {
        "StringEquals": {"iam:PassedToService": "ecs-tasks.amazonaws.com"}
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
    # no reserved concurrency anywhere: it fails deploys in accounts at the minimum unreserved concurrency
    for fn in _of_type(cfn, "AWS::Lambda::Function").values():
        assert "ReservedConcurrentExecutions" not in fn["Properties"]
