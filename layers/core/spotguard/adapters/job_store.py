"""Jobs in the DynamoDB ledger (the same table as the interruption path's items).

  JOB#<job id> / JOB              the whole job (request, options, attempts) as JSON, with `rev` for
                                  compare-and-set and `job_state` / `updated_at` for the ByState index
  TASK#<task arn> / UNMANAGED     a task seen once and found not managed: its events are not described
                                  again (expires after a week)
  CHECKPOINTS#<uri> / SEQ#<n>     every committed checkpoint of a job (written by the checkpoints path)
Finished jobs expire (TTL) after JOB_RETENTION_DAYS.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError

from spotguard.adapters.dynamo import key, marshal, plain, written
from spotguard.domain.checkpoints import CheckpointRef
from spotguard.domain.errors import one_line
from spotguard.domain.jobs.model import Job, JobState, UnreadableJob

log = logging.getLogger(__name__)

BY_STATE_INDEX = "ByState"
JOB_RETENTION_DAYS = 90
UNMANAGED_MEMORY_DAYS = 7


def _job_key(job_id: str) -> dict[str, Any]:
    return key(f"JOB#{job_id}", "JOB")


class DynamoJobStore:
    def __init__(self, client: Any, table: str) -> None:
        self.client = client
        self.table = table

    def get(self, job_id: str) -> Job | None:
        item = plain(
            self.client.get_item(TableName=self.table, Key=_job_key(job_id), ConsistentRead=True).get("Item")
        )
        return _job(item) if item else None

    def _item(self, job: Job) -> dict[str, Any]:
        item: dict[str, Any] = {
            "pk": f"JOB#{job.job_id}",
            "sk": "JOB",
            "doc": job.model_dump_json(exclude_defaults=False),
            "rev": job.rev,
            "job_state": str(job.state),
            "updated_at": job.updated_at.isoformat(),
        }
        if job.state.terminal:
            item["expires_at"] = int((job.updated_at + timedelta(days=JOB_RETENTION_DAYS)).timestamp())
        return marshal(item)

    # --------------------------------------------------- a spare group's lease (ports.SpareGroupLeases)
    def hold_group(self, group: str, owner: str, now: datetime, until: datetime) -> bool:
        """Take the lease of Auto Scaling group `group` for `owner` until `until`: True when it is ours
        (nobody holds it, its holder's lease has run out, or we hold it already)."""
        return written(
            self.client.update_item,
            TableName=self.table,
            Key=key(f"SPAREGROUP#{group}", "LEASE"),
            UpdateExpression="SET lease_owner = :me, lease_until = :until, expires_at = :x",
            ConditionExpression="attribute_not_exists(lease_until) OR lease_until < :now "
            "OR lease_owner = :me",
            ExpressionAttributeValues=marshal(
                {
                    ":me": owner,
                    ":until": int(until.timestamp() * 1000),
                    ":now": int(now.timestamp() * 1000),
                    ":x": int((until + timedelta(days=1)).timestamp()),
                }
            ),
        )

    def let_go_group(self, group: str, owner: str) -> None:
        """Give the lease back, if `owner` still holds it (one run out and taken by another stays theirs)."""
        written(
            self.client.update_item,
            TableName=self.table,
            Key=key(f"SPAREGROUP#{group}", "LEASE"),
            UpdateExpression="SET lease_until = :zero",
            ConditionExpression="lease_owner = :me",
            ExpressionAttributeValues=marshal({":me": owner, ":zero": 0}),
        )

    def create(self, job: Job) -> bool:
        """Store a new job; False when a job with its id exists already."""
        return written(
            self.client.put_item,
            TableName=self.table,
            Item=self._item(job),
            ConditionExpression="attribute_not_exists(pk)",
        )

    def replace(self, job: Job, expected_rev: int) -> bool:
        """Compare-and-set: write `job` only if the stored one still has `expected_rev`."""
        return written(
            self.client.put_item,
            TableName=self.table,
            Item=self._item(job),
            ConditionExpression="rev = :r",
            ExpressionAttributeValues=marshal({":r": expected_rev}),
        )

    def list(
        self,
        state: JobState | None,
        limit: int,
        on_unreadable: Callable[[UnreadableJob], None] | None = None,
        oldest_first: bool = False,
    ) -> list[Job]:
        """Up to `limit` jobs per state asked for, newest first (or oldest first), following the index's
        pages. A job that cannot be read is left out (logged, and handed to `on_unreadable`), so that
        one bad item never hides every other job."""
        states = [state] if state else list(JobState)
        jobs: list[Job] = []
        for s in states:
            pages = self.client.get_paginator("query").paginate(
                TableName=self.table,
                IndexName=BY_STATE_INDEX,
                KeyConditionExpression="job_state = :s",
                ExpressionAttributeValues=marshal({":s": str(s)}),
                ScanIndexForward=oldest_first,
                PaginationConfig={"MaxItems": limit},
            )
            for page in pages:
                for i in page.get("Items", []):
                    try:
                        jobs.append(_job(plain(i)))
                    except UnreadableJob as exc:
                        log.warning("skipped a job that cannot be read: %s", exc)
                        if on_unreadable is not None:
                            on_unreadable(exc)
        jobs.sort(key=lambda j: j.updated_at, reverse=not oldest_first)
        return jobs[:limit]

    def count(self, state: JobState) -> int:
        """How many jobs are in `state` (the index's count: no job is read out or parsed)."""
        pages = self.client.get_paginator("query").paginate(
            TableName=self.table,
            IndexName=BY_STATE_INDEX,
            KeyConditionExpression="job_state = :s",
            ExpressionAttributeValues=marshal({":s": str(state)}),
            Select="COUNT",
        )
        return sum(int(page.get("Count", 0)) for page in pages)

    # ------------------------------------------------------------------------- tasks not managed
    def known_unmanaged(self, task_arn: str) -> bool:
        item = self.client.get_item(TableName=self.table, Key=key(f"TASK#{task_arn}", "UNMANAGED")).get(
            "Item"
        )
        return item is not None

    def remember_unmanaged(self, task_arn: str, at: datetime) -> None:
        self.client.put_item(
            TableName=self.table,
            Item=marshal(
                {
                    "pk": f"TASK#{task_arn}",
                    "sk": "UNMANAGED",
                    "expires_at": int((at + timedelta(days=UNMANAGED_MEMORY_DAYS)).timestamp()),
                }
            ),
        )

    # ------------------------------------------------------------------------------- checkpoints
    def checkpoints(self, prefix_uri: str) -> list[CheckpointRef]:
        """Every committed checkpoint recorded for a job's prefix, oldest first."""
        pages = self.client.get_paginator("query").paginate(
            TableName=self.table,
            KeyConditionExpression="pk = :p AND begins_with(sk, :s)",
            ExpressionAttributeValues=marshal({":p": f"CHECKPOINTS#{prefix_uri}", ":s": "SEQ#"}),
        )
        return [
            CheckpointRef.model_validate_json(plain(i)["ref"])
            for page in pages
            for i in page.get("Items", [])
        ]


def _job(item: dict[str, Any]) -> Job:
    try:
        return Job.model_validate_json(item["doc"])
    except (ValidationError, KeyError) as exc:
        job_id = str(item.get("pk", "")).removeprefix("JOB#")
        reason = one_line(exc) if isinstance(exc, ValidationError) else f"no {exc} attribute"
        raise UnreadableJob(job_id, reason) from None
