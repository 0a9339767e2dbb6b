"""Build EventBridge events of every kind SpotGuard takes, from the samples in events/eventbridge.

The samples are the single source of what a real event looks like; this module only swaps in the
instance, the time and a fresh id. The demo, the local stack and the benchmarks inject what it builds.
"""

from __future__ import annotations

import copy
import json
import uuid
from datetime import datetime
from typing import Any

from spotguard.domain import clock
from spotguard.domain.tasks import cluster_arn_of
from spotguard_cli.emulator.template import REPO

SAMPLES = REPO / "events" / "eventbridge"

KINDS = {
    "spot-interruption": "spot-interruption-warning.json",
    "rebalance-recommendation": "rebalance-recommendation.json",
    "instance-state-change": "instance-state-shutting-down.json",
    "lifecycle-terminate": "asg-terminate-lifecycle-action.json",
    "health-maintenance": "health-scheduled-retirement.json",
    "container-instance-change": "ecs-container-instance-state-change.json",
    "checkpoint-manifest": "s3-manifest-created.json",
    "task-state-change": "ecs-task-state-change.json",
    "ebs-snapshot": "ebs-snapshot-notification.json",
    "launch-unsuccessful": "asg-launch-unsuccessful.json",
    "launch-successful": "asg-launch-successful.json",
}


def sample(kind: str) -> dict[str, Any]:
    if kind not in KINDS:
        raise ValueError(f"unknown event kind {kind!r}; one of: {', '.join(KINDS)}")
    return dict(json.loads((SAMPLES / KINDS[kind]).read_text()))


def make_event(
    kind: str,
    instance_id: str,
    *,
    at: datetime | None = None,
    region: str = "us-east-1",
    account: str = "123456789012",
    **detail: Any,
) -> dict[str, Any]:
    """An event of `kind` for `instance_id`; `detail` overrides fields of the sample's detail."""
    event = copy.deepcopy(sample(kind))
    when = at or clock.now()  # the wall clock, or the simulation's virtual one
    event["id"] = str(uuid.uuid4())
    event["time"] = when.strftime("%Y-%m-%dT%H:%M:%SZ")
    event["region"], event["account"] = region, account
    d = event["detail"]
    for key in ("instance-id", "EC2InstanceId", "ec2InstanceId"):
        if key in d:
            d[key] = instance_id
    if "affectedEntities" in d:
        d["affectedEntities"] = [{"entityValue": instance_id, "status": "PENDING"}]
    event["resources"] = [f"arn:aws:ec2:{region}:{account}:instance/{instance_id}"]
    d.update(detail)
    return event


def launch_unsuccessful(
    group: str,
    zone: str,
    at: datetime | None = None,
    region: str = "us-east-1",
    account: str = "123456789012",
) -> dict[str, Any]:
    """Auto Scaling's EC2 Instance Launch Unsuccessful for `group` in `zone`: no spot capacity there."""
    event = make_event("launch-unsuccessful", "", at=at, region=region, account=account)
    d = event["detail"]
    d["AutoScalingGroupName"], d["Details"] = group, {**d["Details"], "Availability Zone": zone}
    d["StatusMessage"] = (
        f"We currently do not have sufficient capacity in the Availability Zone you requested ({zone}). "
        "Launching EC2 instance failed."
    )
    d["EC2InstanceId"] = ""
    event["resources"] = [
        f"arn:aws:autoscaling:{region}:{account}:autoScalingGroup:local:autoScalingGroupName/{group}"
    ]
    return event


def launch_successful(
    group: str,
    zone: str,
    instance_id: str,
    at: datetime | None = None,
    region: str = "us-east-1",
    account: str = "123456789012",
) -> dict[str, Any]:
    """Auto Scaling's EC2 Instance Launch Successful for `group` in `zone`: it launched `instance_id`
    there (capacity is back)."""
    event = make_event("launch-successful", instance_id, at=at, region=region, account=account)
    d = event["detail"]
    d["AutoScalingGroupName"], d["Details"] = group, {**d["Details"], "Availability Zone": zone}
    d["Description"] = f"Launching a new EC2 instance: {instance_id}"
    event["resources"] = [
        f"arn:aws:autoscaling:{region}:{account}:autoScalingGroup:local:autoScalingGroupName/{group}",
        f"arn:aws:ec2:{region}:{account}:instance/{instance_id}",
    ]
    return event


def container_instance_event(description: dict[str, Any], at: datetime | None = None) -> dict[str, Any]:
    """The ECS Container Instance State Change that ECS would emit for a DescribeContainerInstances entry."""
    cluster_arn = description.get("clusterArn") or cluster_arn_of(description["containerInstanceArn"])
    if cluster_arn is None:
        raise ValueError("the container instance names no cluster")
    return make_event(
        "container-instance-change",
        description["ec2InstanceId"],
        at=at,
        region=cluster_arn.split(":")[3],
        account=cluster_arn.split(":")[4],
        clusterArn=cluster_arn,
        containerInstanceArn=description["containerInstanceArn"],
        status=description.get("status", "ACTIVE"),
        version=int(description.get("version", 1)),
    )


def task_event(
    task: dict[str, Any],
    version: int,
    *,
    exit_code: int | None = None,
    stop_code: str | None = None,
    at: datetime | None = None,
) -> dict[str, Any]:
    """The ECS Task State Change that ECS would emit for a DescribeTasks entry, at `version`. A
    stopped task's containers get `exit_code` (None: no exit code, as when the host vanished)."""
    when = at or clock.now()  # the wall clock, or the simulation's virtual one
    cluster_arn = task["clusterArn"]
    region, account = cluster_arn.split(":")[3], cluster_arn.split(":")[4]
    event = copy.deepcopy(sample("task-state-change"))
    event.update(
        id=str(uuid.uuid4()),
        time=when.strftime("%Y-%m-%dT%H:%M:%SZ"),
        region=region,
        account=account,
        resources=[task["taskArn"]],
    )
    stopped = task.get("lastStatus") == "STOPPED"
    containers = []
    for c in task.get("containers") or []:
        entry = {"name": c.get("name", ""), "lastStatus": task.get("lastStatus"), "taskArn": task["taskArn"]}
        if stopped and exit_code is not None:
            entry["exitCode"] = exit_code
        containers.append(entry)
    detail: dict[str, Any] = {
        "clusterArn": cluster_arn,
        "taskArn": task["taskArn"],
        "taskDefinitionArn": task.get("taskDefinitionArn", ""),
        "lastStatus": task.get("lastStatus", "RUNNING"),
        "desiredStatus": task.get("desiredStatus", "RUNNING"),
        "startedBy": task.get("startedBy", ""),
        "group": task.get("group", ""),
        "launchType": task.get("launchType") or "EC2",
        "containers": containers,
        "overrides": task.get("overrides") or {"containerOverrides": []},
        "createdAt": when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z",
        "updatedAt": when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z",
        "version": version,
    }
    if task.get("containerInstanceArn"):
        detail["containerInstanceArn"] = task["containerInstanceArn"]
    if task.get("lastStatus") in ("RUNNING", "STOPPED"):
        detail["startedAt"] = (task.get("startedAt") or when).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"
    if stopped:
        detail["stoppedAt"] = when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"
        detail["stoppedReason"] = task.get("stoppedReason") or "Essential container in task exited"
        if stop_code is not None:
            detail["stopCode"] = stop_code
    elif detail["desiredStatus"] == "STOPPED":
        # being stopped (StopTask): ECS says why at once, before the container has exited
        detail["stoppingAt"] = when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"
        if task.get("stoppedReason"):
            detail["stoppedReason"] = task["stoppedReason"]
        if stop_code is not None:
            detail["stopCode"] = stop_code
    event["detail"] = detail
    return event


def snapshot_event(
    snapshot_id: str, volume_id: str, ok: bool = True, region: str = "us-east-1"
) -> dict[str, Any]:
    """The EBS Snapshot Notification EC2 sends when a snapshot completes (or fails)."""
    event = copy.deepcopy(sample("ebs-snapshot"))
    event.update(id=str(uuid.uuid4()), time=clock.now().strftime("%Y-%m-%dT%H:%M:%SZ"), region=region)
    event["resources"] = [f"arn:aws:ec2::{region}:snapshot/{snapshot_id}"]
    event["detail"].update(
        result="succeeded" if ok else "failed",
        cause="" if ok else "Internal error",
        snapshot_id=f"arn:aws:ec2::{region}:snapshot/{snapshot_id}",
        source=f"arn:aws:ec2::{region}:volume/{volume_id}",
    )
    return event


def put_entry(event: dict[str, Any]) -> dict[str, Any]:
    """The PutEvents entry that puts `event` on the default bus."""
    return {
        "Source": event["source"],
        "DetailType": event["detail-type"],
        "Detail": json.dumps(event["detail"]),
        "Resources": event.get("resources", []),
        "Time": datetime.fromisoformat(event["time"].replace("Z", "+00:00")),
    }


SQS_SAMPLES = REPO / "events" / "sqs"
SAMPLE_QUEUE_ARN = "arn:aws:sqs:us-west-2:123456789012:spotguard-InterruptionsQueue-1A2B3C4D5E6F"


def sqs_envelope(bodies: list[str], queue_arn: str = SAMPLE_QUEUE_ARN) -> dict[str, Any]:
    """What Lambda's SQS event source hands the function for these message bodies."""
    records = []
    for i, body in enumerate(bodies):
        mid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{queue_arn}/{i}/{body}"))
        records.append(
            {
                "messageId": mid,
                "receiptHandle": f"AQEB{mid.replace('-', '')}",
                "body": body,
                "attributes": {
                    "ApproximateReceiveCount": "1",
                    "SentTimestamp": "1795275963000",
                    "SenderId": "AIDAIENQZJOLO23YVJ4VO",
                    "ApproximateFirstReceiveTimestamp": "1795275963010",
                },
                "messageAttributes": {},
                "md5OfBody": "",
                "eventSource": "aws:sqs",
                "eventSourceARN": queue_arn,
                "awsRegion": queue_arn.split(":")[3],
            }
        )
    return {"Records": records}


def sqs_samples() -> dict[str, dict[str, Any]]:
    """events/sqs/<name>.json for every events/eventbridge/<name>.json (for `sam local invoke -e`)."""
    out = {}
    for path in sorted(SAMPLES.glob("*.json")):
        out[path.name] = sqs_envelope([json.dumps(json.loads(path.read_text()), separators=(",", ":"))])
    return out


def write_sqs_samples() -> None:
    SQS_SAMPLES.mkdir(exist_ok=True)
    for name, envelope in sqs_samples().items():
        (SQS_SAMPLES / name).write_text(json.dumps(envelope, indent=2) + "\n")


if __name__ == "__main__":
    write_sqs_samples()
