"""The DynamoDB ledger: one table, keyed pk/sk, every state change a conditional write.

Items written by the interruption path:
  INSTANCE#<id> / CONTAINER_INSTANCE   the index: cluster, container instance, status, ECS version
  INSTANCE#<id> / NOTICE#<notice key>  each notice: when it came, what was done, the tasks signalled
                                       (written once the notice is done: its outcome makes a repeat of
                                       the notice a no-op)
  INSTANCE#<id> / CLAIM#STOP           which notice stops the host's tasks (the first one to claim it),
                                       the tasks it named, and the lease of the try that is stopping them
  CHECKPOINTS#<uri> / NEWEST           a job's newest committed checkpoint (only ever moves forward)
  CHECKPOINTS#<uri> / SEQ#<sequence>   every committed checkpoint (for a job's status)
  HOST#<container instance> / TASK#<task arn>
                                       the tasks on a host as their events said (kept by the task-events
                                       function, so a notice needs no DescribeTasks); a stopped task
                                       stays a day as a tombstone so a late RUNNING event cannot revive it
Jobs live in the same table (see job_store.py).
Notices and claims expire (TTL) after RETENTION_DAYS; EC2 never reuses an instance id.

The urgent path reads an instance's items in one query (`host`) and writes once before its signals (the
claim, which is also the lease that keeps two copies of a notice from stopping tasks side by side).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from spotguard.adapters.dynamo import conditional, key, marshal, plain, written
from spotguard.domain.interruption.notices import (
    ContainerInstanceUpdate,
    HostClaim,
    HostRecord,
    Notice,
    NoticeInProgress,
)
from spotguard.domain.tasks import ContainerInstanceRef, TaskInfo

if TYPE_CHECKING:  # the checkpoints function's types: imported when used, not on the urgent path
    from spotguard.domain.checkpoints import CheckpointRecorded, CheckpointRef

RETENTION_DAYS = 30
TOMBSTONE_HOURS = 24


def _ttl(at: datetime) -> int:
    return int((at + timedelta(days=RETENTION_DAYS)).timestamp())


def _ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)


def _ref(instance_id: str, item: dict[str, Any]) -> ContainerInstanceRef | None:
    if not item or item.get("status") in ("DEREGISTERING", "INACTIVE"):
        return None
    return ContainerInstanceRef(
        cluster_arn=item["cluster_arn"],
        container_instance_arn=item["container_instance_arn"],
        instance_id=instance_id,
        status=item.get("status", "ACTIVE"),
    )


def _tasks(item: dict[str, Any]) -> list[str]:
    return list(dict.fromkeys(str(a) for a in item.get("task_arns") or []))


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
        return _ref(instance_id, item)

    def host(self, instance_id: str, notice_key: str) -> HostRecord:
        """Everything the ledger holds for an instance, in one (consistent) query: its container
        instance, the stop claim, and this notice's outcome if it was handled already. An instance has a
        handful of items (the index, the claim, a notice per event about it)."""
        items: dict[str, dict[str, Any]] = {}
        pages = self.client.get_paginator("query").paginate(
            TableName=self.table,
            KeyConditionExpression="pk = :p",
            ExpressionAttributeValues=marshal({":p": f"INSTANCE#{instance_id}"}),
            ConsistentRead=True,
        )
        for page in pages:
            items.update({str(i["sk"]): i for i in map(plain, page.get("Items", []))})
        claim = items.get("CLAIM#STOP")
        notice = items.get(f"NOTICE#{notice_key}") or {}
        outcome = json.loads(notice["outcome"]) if notice.get("outcome") else None
        return HostRecord(
            container_instance=_ref(instance_id, items.get("CONTAINER_INSTANCE") or {}),
            claim=HostClaim(
                notice_key=str(claim.get("notice_key", "")),
                cluster_arn=str(claim.get("cluster_arn", "")),
                task_arns=tuple(_tasks(claim)),
            )
            if claim
            else None,
            outcome=outcome,
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
    def lease_notice(self, notice: Notice, owner: str, now: datetime, until: datetime) -> None:
        """Take the lease of a notice that claims no host (SIGUSR1 on a rebalance recommendation), so
        that two copies of it do not signal side by side. Raises NoticeInProgress when another try holds
        a live lease or has finished it (the repeat then finds the outcome)."""
        went_in, _ = conditional(
            self.client.update_item,
            TableName=self.table,
            Key=key(f"INSTANCE#{notice.instance_id}", f"NOTICE#{notice.key}"),
            UpdateExpression="SET lease_owner = :me, lease_until = :until, expires_at = :x",
            ConditionExpression="attribute_not_exists(outcome) AND (attribute_not_exists(lease_until) "
            "OR lease_until < :now OR lease_owner = :me)",
            ExpressionAttributeValues=marshal(
                {":me": owner, ":until": _ms(until), ":now": _ms(now), ":x": _ttl(now)}
            ),
        )
        if not went_in:
            raise NoticeInProgress(f"notice {notice.key} is being handled elsewhere")

    def claim_host(
        self,
        instance_id: str,
        notice_key: str,
        at: datetime,
        cluster_arn: str,
        task_arns: Sequence[str],
        owner: str,
        lease_until: datetime,
    ) -> tuple[str | None, list[str]]:
        """Claim the right to stop the host's tasks, naming the tasks about to be stopped, and take the
        lease of this try, in one conditional write (the one write before the signals).
        (None, every task this notice has claimed, on every try so far) when the claim is ours (new, or
        ours from an earlier try whose lease has run out: a redelivery after a partial failure adds to,
        never replaces, what the first try stopped); otherwise (the key of the notice that holds it, the
        tasks it claimed), so that a lifecycle action waits for those even while that notice is still
        stopping them. Raises NoticeInProgress when another try of this same notice holds a live lease
        (two copies of one notice never stop tasks side by side)."""
        went_in, item = conditional(
            self.client.update_item,
            TableName=self.table,
            Key=key(f"INSTANCE#{instance_id}", "CLAIM#STOP"),
            UpdateExpression="SET notice_key = :k, claimed_at = if_not_exists(claimed_at, :t), "
            "cluster_arn = :c, expires_at = :x, lease_owner = :me, lease_until = :until, "
            "task_arns = list_append(if_not_exists(task_arns, :none), :tasks)",
            ConditionExpression="attribute_not_exists(pk) OR (notice_key = :k AND "
            "(attribute_not_exists(lease_until) OR lease_until < :now OR lease_owner = :me))",
            ExpressionAttributeValues=marshal(
                {
                    ":k": notice_key,
                    ":t": at.isoformat(),
                    ":c": cluster_arn,
                    ":x": _ttl(at),
                    ":me": owner,
                    ":until": _ms(lease_until),
                    ":now": _ms(at),
                    ":none": [],
                    ":tasks": list(task_arns),
                }
            ),
            ReturnValues="ALL_NEW",
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )
        if went_in:
            return None, _tasks(item)
        holder = str(item.get("notice_key", "another notice"))
        if holder == notice_key:
            raise NoticeInProgress(f"notice {notice_key} is stopping the tasks of {instance_id} elsewhere")
        return holder, _tasks(item)

    def claimed_tasks(self, instance_id: str) -> tuple[str, list[str]]:
        """(cluster, every task) the notice holding the host's claim stops: what a lifecycle action
        waits for. Written with the claim, before the stops, so it is never behind them."""
        item = plain(
            self.client.get_item(
                TableName=self.table, Key=key(f"INSTANCE#{instance_id}", "CLAIM#STOP"), ConsistentRead=True
            ).get("Item")
        )
        return str(item.get("cluster_arn", "")), _tasks(item)

    def stop_claim(self, instance_id: str) -> str | None:
        """The key of the notice that stopped the host's tasks, if one did."""
        item = plain(
            self.client.get_item(TableName=self.table, Key=key(f"INSTANCE#{instance_id}", "CLAIM#STOP")).get(
                "Item"
            )
        )
        return str(item["notice_key"]) if item else None

    def finish_notice(self, notice: Notice, received: datetime, outcome: dict[str, object]) -> None:
        """The notice's record, written once, after its signals: when it came, how often, what was
        done. Its outcome makes a later copy of the notice return at once (see `host`)."""
        signalled = [str(a) for a in outcome.get("signalled") or []]  # type: ignore[union-attr]
        self.client.update_item(
            TableName=self.table,
            Key=key(f"INSTANCE#{notice.instance_id}", f"NOTICE#{notice.key}"),
            UpdateExpression="SET kind = :k, event_id = :e, event_time = :et, deadline = :d, "
            "received_at = if_not_exists(received_at, :r), expires_at = :x, outcome = :o, "
            "task_arns = :tasks, cluster_arn = :c",
            ExpressionAttributeValues=marshal(
                {
                    ":k": notice.kind,
                    ":e": notice.event_id,
                    ":et": notice.event_time.isoformat(),
                    ":d": notice.deadline.isoformat() if notice.deadline else None,
                    ":r": received.isoformat(),
                    ":x": _ttl(received),
                    ":o": _json(outcome),
                    ":tasks": signalled,
                    ":c": str(outcome.get("cluster_arn") or ""),
                }
            ),
        )

    def record_checkpoint(self, ref: CheckpointRef, count: bool = True) -> CheckpointRecorded:
        """Record `ref` among its prefix's checkpoints, then make it the newest unless a newer (or the
        same) one is in, then (`count`: the manifest's own event, not a lookup that found it by listing)
        mark it counted unless it is. Each write is conditional, so safe to repeat, and in that order: a
        checkpoint is listed before it is the newest, and a delivery that failed before the mark is
        `new` when retried."""
        from spotguard.domain.checkpoints import CheckpointRecorded  # imported when used (see above)

        item = {
            "pk": f"CHECKPOINTS#{ref.prefix_uri}",
            "sk": f"SEQ#{ref.sequence:020d}",
            "ref": ref.model_dump_json(),
        }
        written(
            self.client.put_item,
            TableName=self.table,
            Item=marshal(item),
            ConditionExpression="attribute_not_exists(pk)",
        )
        newest = written(
            self.client.put_item,
            TableName=self.table,
            Item=marshal({**item, "sk": "NEWEST", "sequence": ref.sequence}),
            ConditionExpression="attribute_not_exists(#seq) OR #seq < :seq",
            ExpressionAttributeNames={"#seq": "sequence"},
            ExpressionAttributeValues=marshal({":seq": ref.sequence}),
        )
        new = count and written(
            self.client.put_item,
            TableName=self.table,
            Item=marshal({**item, "counted": True}),
            ConditionExpression="attribute_not_exists(counted)",
        )
        return CheckpointRecorded(new=new, newest=newest)

    def newest_checkpoint(self, prefix_uri: str) -> CheckpointRef | None:
        item = plain(
            self.client.get_item(
                TableName=self.table, Key=key(f"CHECKPOINTS#{prefix_uri}", "NEWEST"), ConsistentRead=True
            ).get("Item")
        )
        from spotguard.domain.checkpoints import CheckpointRef  # imported when used (see above)

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
