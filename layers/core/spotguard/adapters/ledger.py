"""The DynamoDB ledger: one table, keyed pk/sk, every state change a conditional write.

Items written by the interruption path:
  INSTANCE#<id> / CONTAINER_INSTANCE   the index: cluster, container instance, status, ECS version
  INSTANCE#<id> / NOTICE#<notice key>  each notice: when it came, what was done, the tasks signalled
  INSTANCE#<id> / CLAIM#STOP           which notice stopped the host's tasks (the first one to claim it)
  CHECKPOINTS#<uri> / NEWEST           a job's newest committed checkpoint (only ever moves forward)
  CHECKPOINTS#<uri> / SEQ#<sequence>   every committed checkpoint (for a job's status)
  HOST#<container instance> / TASK#<task arn>
                                       the tasks on a host as their events said (kept by the task-events
                                       function, so a notice needs no DescribeTasks); a stopped task
                                       stays a day as a tombstone so a late RUNNING event cannot revive it
Jobs live in the same table (see job_store.py).
Notices and claims expire (TTL) after RETENTION_DAYS; EC2 never reuses an instance id.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from boto3.dynamodb.types import TypeDeserializer
from botocore.exceptions import ClientError

from spotguard.domain.checkpoints import CheckpointRef
from spotguard.domain.notices import ContainerInstanceUpdate, Notice
from spotguard.domain.tasks import ContainerInstanceRef, TaskInfo

RETENTION_DAYS = 30
TOMBSTONE_HOURS = 24


def conditional_failed(exc: ClientError) -> bool:
    return exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException"


def _ttl(at: datetime) -> str:
    return str(int((at + timedelta(days=RETENTION_DAYS)).timestamp()))


class DynamoLedger:
    def __init__(self, client: Any, table: str) -> None:
        self.client = client
        self.table = table

    # ---------------------------------------------------------------------------------- the index
    def container_instance(self, instance_id: str) -> ContainerInstanceRef | None:
        item = self.client.get_item(
            TableName=self.table,
            Key={"pk": {"S": f"INSTANCE#{instance_id}"}, "sk": {"S": "CONTAINER_INSTANCE"}},
        ).get("Item")
        if not item or item.get("status", {}).get("S") in ("DEREGISTERING", "INACTIVE"):
            return None
        return ContainerInstanceRef(
            cluster_arn=item["cluster_arn"]["S"],
            container_instance_arn=item["container_instance_arn"]["S"],
            instance_id=instance_id,
            status=item.get("status", {}).get("S", "ACTIVE"),
        )

    def index_container_instance(self, update: ContainerInstanceUpdate) -> bool:
        """Apply an ECS container instance event unless a newer one (higher version) is in already."""
        try:
            self.client.update_item(
                TableName=self.table,
                Key={"pk": {"S": f"INSTANCE#{update.instance_id}"}, "sk": {"S": "CONTAINER_INSTANCE"}},
                UpdateExpression="SET cluster_arn = :c, container_instance_arn = :ci, #s = :s, "
                "version = :v, updated_at = :t",
                ConditionExpression="attribute_not_exists(version) OR version < :v",
                ExpressionAttributeNames={"#s": "status"},
                ExpressionAttributeValues={
                    ":c": {"S": update.cluster_arn},
                    ":ci": {"S": update.container_instance_arn},
                    ":s": {"S": update.status},
                    ":v": {"N": str(update.version)},
                    ":t": {"S": update.event_time.isoformat()},
                },
            )
        except ClientError as exc:
            if conditional_failed(exc):
                return False
            raise
        return True

    def remember_container_instance(self, ref: ContainerInstanceRef) -> None:
        """Store what a fallback lookup found, without overwriting anything an event wrote (version 0)."""
        try:
            self.client.put_item(
                TableName=self.table,
                Item={
                    "pk": {"S": f"INSTANCE#{ref.instance_id}"},
                    "sk": {"S": "CONTAINER_INSTANCE"},
                    "cluster_arn": {"S": ref.cluster_arn},
                    "container_instance_arn": {"S": ref.container_instance_arn},
                    "status": {"S": ref.status},
                    "version": {"N": "0"},
                },
                ConditionExpression="attribute_not_exists(pk)",
            )
        except ClientError as exc:
            if not conditional_failed(exc):
                raise

    # ------------------------------------------------------------------------------- the task index
    def index_task(self, info: TaskInfo, version: int, at: datetime) -> bool:
        """Record (or, for a stopped task, tombstone) a task on its host, unless a newer event is in."""
        assert info.container_instance_arn
        stopped = info.last_status == "STOPPED"
        expires = at + (timedelta(hours=TOMBSTONE_HOURS) if stopped else timedelta(days=RETENTION_DAYS))
        try:
            self.client.put_item(
                TableName=self.table,
                Item={
                    "pk": {"S": f"HOST#{info.container_instance_arn}"},
                    "sk": {"S": f"TASK#{info.task_arn}"},
                    "info": {"S": info.model_dump_json()},
                    "version": {"N": str(version)},
                    "stopped": {"BOOL": stopped},
                    "expires_at": {"N": str(int(expires.timestamp()))},
                },
                ConditionExpression="attribute_not_exists(version) OR version < :v",
                ExpressionAttributeValues={":v": {"N": str(version)}},
            )
        except ClientError as exc:
            if conditional_failed(exc):
                return False
            raise
        return True

    def indexed_tasks(self, container_instance_arn: str) -> dict[str, TaskInfo]:
        """The tasks the index holds for a host and believes running (one query for hundreds)."""
        found: dict[str, TaskInfo] = {}
        pages = self.client.get_paginator("query").paginate(
            TableName=self.table,
            KeyConditionExpression="pk = :p AND begins_with(sk, :t)",
            ExpressionAttributeValues={":p": {"S": f"HOST#{container_instance_arn}"}, ":t": {"S": "TASK#"}},
            ConsistentRead=True,
        )
        for page in pages:
            for item in page.get("Items", []):
                if not item.get("stopped", {}).get("BOOL", False):
                    info = TaskInfo.model_validate_json(item["info"]["S"])
                    found[info.task_arn] = info
        return found

    # ------------------------------------------------------------------------------------ notices
    def record_notice(self, notice: Notice, received: datetime) -> None:
        self.client.update_item(
            TableName=self.table,
            Key={"pk": {"S": f"INSTANCE#{notice.instance_id}"}, "sk": {"S": f"NOTICE#{notice.key}"}},
            UpdateExpression="SET kind = :k, event_id = :e, event_time = :et, deadline = :d, "
            "received_at = if_not_exists(received_at, :r), "
            "deliveries = if_not_exists(deliveries, :z) + :one, expires_at = :x",
            ExpressionAttributeValues={
                ":k": {"S": notice.kind},
                ":e": {"S": notice.event_id},
                ":et": {"S": notice.event_time.isoformat()},
                ":d": {"S": notice.deadline.isoformat()} if notice.deadline else {"NULL": True},
                ":r": {"S": received.isoformat()},
                ":z": {"N": "0"},
                ":one": {"N": "1"},
                ":x": {"N": _ttl(received)},
            },
        )

    def claim_host(self, instance_id: str, notice_key: str, at: datetime) -> str | None:
        """Claim the right to stop the host's tasks. None = ours (new, or ours from an earlier try);
        otherwise the key of the notice that holds it."""
        try:
            self.client.put_item(
                TableName=self.table,
                Item={
                    "pk": {"S": f"INSTANCE#{instance_id}"},
                    "sk": {"S": "CLAIM#STOP"},
                    "notice_key": {"S": notice_key},
                    "claimed_at": {"S": at.isoformat()},
                    "expires_at": {"N": _ttl(at)},
                },
                ConditionExpression="attribute_not_exists(pk) OR notice_key = :k",
                ExpressionAttributeValues={":k": {"S": notice_key}},
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            if conditional_failed(exc):
                old = exc.response.get("Item") or {}
                return str(old.get("notice_key", {}).get("S", "another notice"))
            raise
        return None

    def stop_claim(self, instance_id: str) -> str | None:
        """The key of the notice that stopped the host's tasks, if one did."""
        item = self.client.get_item(
            TableName=self.table,
            Key={"pk": {"S": f"INSTANCE#{instance_id}"}, "sk": {"S": "CLAIM#STOP"}},
        ).get("Item")
        return str(item["notice_key"]["S"]) if item else None

    def finish_notice(self, notice: Notice, outcome: dict[str, object]) -> None:
        signalled = [str(a) for a in outcome.get("signalled") or []]  # type: ignore[union-attr]
        values: dict[str, Any] = {
            ":o": {"S": _json(outcome)},
            ":tasks": {"L": [{"S": a} for a in signalled]},
            ":c": {"S": str(outcome.get("cluster_arn") or "")},
        }
        self.client.update_item(
            TableName=self.table,
            Key={"pk": {"S": f"INSTANCE#{notice.instance_id}"}, "sk": {"S": f"NOTICE#{notice.key}"}},
            UpdateExpression="SET outcome = :o, task_arns = :tasks, cluster_arn = :c",
            ExpressionAttributeValues=values,
        )

    def signalled_tasks(self, notice_key: str, instance_id: str) -> tuple[str, list[str]]:
        item = (
            self.client.get_item(
                TableName=self.table,
                Key={"pk": {"S": f"INSTANCE#{instance_id}"}, "sk": {"S": f"NOTICE#{notice_key}"}},
                ConsistentRead=True,
            ).get("Item")
            or {}
        )
        arns = [v["S"] for v in item.get("task_arns", {}).get("L", [])]
        return item.get("cluster_arn", {}).get("S", ""), arns

    # -------------------------------------------------------------------------------- checkpoints
    def record_checkpoint(self, ref: CheckpointRef) -> bool:
        """Record `ref`, and make it the newest checkpoint of its prefix unless a newer (or the same)
        one is in. Both writes are safe to repeat."""
        self.client.put_item(
            TableName=self.table,
            Item={
                "pk": {"S": f"CHECKPOINTS#{ref.prefix_uri}"},
                "sk": {"S": f"SEQ#{ref.sequence:020d}"},
                "ref": {"S": ref.model_dump_json()},
            },
        )
        try:
            self.client.put_item(
                TableName=self.table,
                Item={
                    "pk": {"S": f"CHECKPOINTS#{ref.prefix_uri}"},
                    "sk": {"S": "NEWEST"},
                    "sequence": {"N": str(ref.sequence)},
                    "ref": {"S": ref.model_dump_json()},
                },
                ConditionExpression="attribute_not_exists(#seq) OR #seq < :seq",
                ExpressionAttributeNames={"#seq": "sequence"},
                ExpressionAttributeValues={":seq": {"N": str(ref.sequence)}},
            )
        except ClientError as exc:
            if conditional_failed(exc):
                return False
            raise
        return True

    def newest_checkpoint(self, prefix_uri: str) -> CheckpointRef | None:
        item = self.client.get_item(
            TableName=self.table,
            Key={"pk": {"S": f"CHECKPOINTS#{prefix_uri}"}, "sk": {"S": "NEWEST"}},
            ConsistentRead=True,
        ).get("Item")
        return CheckpointRef.model_validate_json(item["ref"]["S"]) if item else None

    def notices(self, instance_id: str) -> list[dict[str, Any]]:
        """Every notice recorded for an instance (for `status`, the demo and tests)."""
        resp = self.client.query(
            TableName=self.table,
            KeyConditionExpression="pk = :p AND begins_with(sk, :n)",
            ExpressionAttributeValues={":p": {"S": f"INSTANCE#{instance_id}"}, ":n": {"S": "NOTICE#"}},
            ConsistentRead=True,
        )
        return [{k: _plain(v) for k, v in item.items()} for item in resp.get("Items", [])]


_DESERIALIZE = TypeDeserializer()


def _json(value: object) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _plain(v: dict[str, Any]) -> Any:
    return _DESERIALIZE.deserialize(v)
