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
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from spotguard.adapters.dynamo import conditional, key, marshal, plain, written
from spotguard.domain.checkpoints import CheckpointRef
from spotguard.domain.notices import ContainerInstanceUpdate, Notice
from spotguard.domain.tasks import ContainerInstanceRef, TaskInfo

RETENTION_DAYS = 30
TOMBSTONE_HOURS = 24


def _ttl(at: datetime) -> int:
    return int((at + timedelta(days=RETENTION_DAYS)).timestamp())


class DynamoLedger:
    def __init__(self, client: Any, table: str) -> None:
        self.client = client
        self.table = table

    # ---------------------------------------------------------------------------------- the index
    def container_instance(self, instance_id: str) -> ContainerInstanceRef | None:
        item = plain(
            self.client.get_item(
                TableName=self.table, Key=key(f"INSTANCE#{instance_id}", "CONTAINER_INSTANCE")
            ).get("Item")
        )
        if not item or item.get("status") in ("DEREGISTERING", "INACTIVE"):
            return None
        return ContainerInstanceRef(
            cluster_arn=item["cluster_arn"],
            container_instance_arn=item["container_instance_arn"],
            instance_id=instance_id,
            status=item.get("status", "ACTIVE"),
        )

    def index_container_instance(self, update: ContainerInstanceUpdate) -> bool:
        """Apply an ECS container instance event unless a newer one (higher version) is in already."""
        return written(
            self.client.update_item,
            TableName=self.table,
            Key=key(f"INSTANCE#{update.instance_id}", "CONTAINER_INSTANCE"),
            UpdateExpression="SET cluster_arn = :c, container_instance_arn = :ci, #s = :s, "
            "version = :v, updated_at = :t",
            ConditionExpression="attribute_not_exists(version) OR version < :v",
            ExpressionAttributeNames={"#s": "status"},
            ExpressionAttributeValues=marshal(
                {
                    ":c": update.cluster_arn,
                    ":ci": update.container_instance_arn,
                    ":s": update.status,
                    ":v": update.version,
                    ":t": update.event_time.isoformat(),
                }
            ),
        )

    def remember_container_instance(self, ref: ContainerInstanceRef) -> None:
        """Store what a fallback lookup found, without overwriting anything an event wrote (version 0)."""
        written(
            self.client.put_item,
            TableName=self.table,
            Item=marshal(
                {
                    "pk": f"INSTANCE#{ref.instance_id}",
                    "sk": "CONTAINER_INSTANCE",
                    "cluster_arn": ref.cluster_arn,
                    "container_instance_arn": ref.container_instance_arn,
                    "status": ref.status,
                    "version": 0,
                }
            ),
            ConditionExpression="attribute_not_exists(pk)",
        )

    # ------------------------------------------------------------------------------- the task index
    def index_task(self, info: TaskInfo, version: int, at: datetime) -> bool:
        """Record (or, for a stopped task, tombstone) a task on its host, unless a newer event is in."""
        assert info.container_instance_arn
        stopped = info.last_status == "STOPPED"
        expires = at + (timedelta(hours=TOMBSTONE_HOURS) if stopped else timedelta(days=RETENTION_DAYS))
        return written(
            self.client.put_item,
            TableName=self.table,
            Item=marshal(
                {
                    "pk": f"HOST#{info.container_instance_arn}",
                    "sk": f"TASK#{info.task_arn}",
                    "info": info.model_dump_json(),
                    "version": version,
                    "stopped": stopped,
                    "expires_at": int(expires.timestamp()),
                }
            ),
            ConditionExpression="attribute_not_exists(version) OR version < :v",
            ExpressionAttributeValues=marshal({":v": version}),
        )

    def indexed_tasks(self, container_instance_arn: str) -> dict[str, TaskInfo]:
        """The tasks the index holds for a host and believes running (one query for hundreds)."""
        found: dict[str, TaskInfo] = {}
        pages = self.client.get_paginator("query").paginate(
            TableName=self.table,
            KeyConditionExpression="pk = :p AND begins_with(sk, :t)",
            ExpressionAttributeValues=marshal({":p": f"HOST#{container_instance_arn}", ":t": "TASK#"}),
            ConsistentRead=True,
        )
        for page in pages:
            for item in map(plain, page.get("Items", [])):
                if not item.get("stopped", False):
                    info = TaskInfo.model_validate_json(item["info"])
                    found[info.task_arn] = info
        return found

    # ------------------------------------------------------------------------------------ notices
    def record_notice(self, notice: Notice, received: datetime) -> None:
        self.client.update_item(
            TableName=self.table,
            Key=key(f"INSTANCE#{notice.instance_id}", f"NOTICE#{notice.key}"),
            UpdateExpression="SET kind = :k, event_id = :e, event_time = :et, deadline = :d, "
            "received_at = if_not_exists(received_at, :r), "
            "deliveries = if_not_exists(deliveries, :z) + :one, expires_at = :x",
            ExpressionAttributeValues=marshal(
                {
                    ":k": notice.kind,
                    ":e": notice.event_id,
                    ":et": notice.event_time.isoformat(),
                    ":d": notice.deadline.isoformat() if notice.deadline else None,
                    ":r": received.isoformat(),
                    ":z": 0,
                    ":one": 1,
                    ":x": _ttl(received),
                }
            ),
        )

    def claim_host(
        self, instance_id: str, notice_key: str, at: datetime, cluster_arn: str, task_arns: Sequence[str]
    ) -> tuple[str | None, list[str]]:
        """Claim the right to stop the host's tasks, naming the tasks about to be stopped, in one write.
        (None, every task this notice has claimed, on every try so far) when the claim is ours (new, or
        ours from an earlier try: a redelivery after a partial failure adds to, never replaces, what the
        first try stopped); otherwise (the key of the notice that holds it, the tasks it claimed), so
        that a lifecycle action waits for those even while that notice is still stopping them."""
        went_in, item = conditional(
            self.client.update_item,
            TableName=self.table,
            Key=key(f"INSTANCE#{instance_id}", "CLAIM#STOP"),
            UpdateExpression="SET notice_key = :k, claimed_at = if_not_exists(claimed_at, :t), "
            "cluster_arn = :c, expires_at = :x, "
            "task_arns = list_append(if_not_exists(task_arns, :none), :tasks)",
            ConditionExpression="attribute_not_exists(pk) OR notice_key = :k",
            ExpressionAttributeValues=marshal(
                {
                    ":k": notice_key,
                    ":t": at.isoformat(),
                    ":c": cluster_arn,
                    ":x": _ttl(at),
                    ":none": [],
                    ":tasks": list(task_arns),
                }
            ),
            ReturnValues="ALL_NEW",
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )
        tasks = list(dict.fromkeys(str(a) for a in item.get("task_arns") or []))
        return (None if went_in else str(item.get("notice_key", "another notice"))), tasks

    def claimed_tasks(self, instance_id: str) -> tuple[str, list[str]]:
        """(cluster, every task) the notice holding the host's claim stops: what a lifecycle action
        waits for. Written with the claim, before the stops, so it is never behind them."""
        item = plain(
            self.client.get_item(
                TableName=self.table, Key=key(f"INSTANCE#{instance_id}", "CLAIM#STOP"), ConsistentRead=True
            ).get("Item")
        )
        return str(item.get("cluster_arn", "")), list(
            dict.fromkeys(str(a) for a in item.get("task_arns") or [])
        )

    def stop_claim(self, instance_id: str) -> str | None:
        """The key of the notice that stopped the host's tasks, if one did."""
        item = plain(
            self.client.get_item(TableName=self.table, Key=key(f"INSTANCE#{instance_id}", "CLAIM#STOP")).get(
                "Item"
            )
        )
        return str(item["notice_key"]) if item else None

    def finish_notice(self, notice: Notice, outcome: dict[str, object]) -> None:
        signalled = [str(a) for a in outcome.get("signalled") or []]  # type: ignore[union-attr]
        self.client.update_item(
            TableName=self.table,
            Key=key(f"INSTANCE#{notice.instance_id}", f"NOTICE#{notice.key}"),
            UpdateExpression="SET outcome = :o, task_arns = :tasks, cluster_arn = :c",
            ExpressionAttributeValues=marshal(
                {":o": _json(outcome), ":tasks": signalled, ":c": str(outcome.get("cluster_arn") or "")}
            ),
        )

    def record_checkpoint(self, ref: CheckpointRef) -> bool:
        """Record `ref`, and make it the newest checkpoint of its prefix unless a newer (or the same)
        one is in. Both writes are safe to repeat."""
        item = {"pk": f"CHECKPOINTS#{ref.prefix_uri}", "ref": ref.model_dump_json()}
        self.client.put_item(TableName=self.table, Item=marshal({**item, "sk": f"SEQ#{ref.sequence:020d}"}))
        return written(
            self.client.put_item,
            TableName=self.table,
            Item=marshal({**item, "sk": "NEWEST", "sequence": ref.sequence}),
            ConditionExpression="attribute_not_exists(#seq) OR #seq < :seq",
            ExpressionAttributeNames={"#seq": "sequence"},
            ExpressionAttributeValues=marshal({":seq": ref.sequence}),
        )

    def newest_checkpoint(self, prefix_uri: str) -> CheckpointRef | None:
        item = plain(
            self.client.get_item(
                TableName=self.table, Key=key(f"CHECKPOINTS#{prefix_uri}", "NEWEST"), ConsistentRead=True
            ).get("Item")
        )
        return CheckpointRef.model_validate_json(item["ref"]) if item else None

    def notices(self, instance_id: str) -> list[dict[str, Any]]:
        """Every notice recorded for an instance (for `status`, the demo and tests)."""
        resp = self.client.query(
            TableName=self.table,
            KeyConditionExpression="pk = :p AND begins_with(sk, :n)",
            ExpressionAttributeValues=marshal({":p": f"INSTANCE#{instance_id}", ":n": "NOTICE#"}),
            ConsistentRead=True,
        )
        return [plain(item) for item in resp.get("Items", [])]


def _json(value: object) -> str:
    return json.dumps(value, sort_keys=True, default=str)
