"""Task-events function: ECS task state changes (with SpotGuard's own Launch Due retries, Auto Scaling's
launch failures and successful launches, which say a pool has no capacity or has it again, in EBS mode
EBS snapshot notifications, and, with the early replacement on, spot warnings and terminate actions,
which ask a spare instance for the jobs on the warned host) -> jobs.

Per record: classify it; a reject goes straight to the dead-letter queue; an ignore is logged; a task
event moves its job through its states (stale and repeated events change nothing); a Launch Due message
tries RunTask again for a job that waits for capacity. Any other failure marks only its record failed,
so SQS delivers it again and, after maxReceiveCount, to the dead-letter queue (alarmed).
"""

from __future__ import annotations

import warnings
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from spotguard.adapters.metrics import tracer
from spotguard.domain.jobs.model import UnreadableJob
from spotguard.domain.jobs.task_events import (
    LaunchDueMessage,
    PoolEventMessage,
    SnapshotMessage,
    TaskMessage,
    TaskStateMessage,
    WarningMessage,
    classify_task_message,
)
from spotguard.runtime.config import JobsEnv
from spotguard.runtime.handling import Router
from spotguard.runtime.jobs import JobsRuntime

warnings.filterwarnings("ignore", "No application metrics to publish")
logger = Logger()
metrics = Metrics()
processor = BatchProcessor(event_type=EventType.SQS)
runtime = JobsRuntime(JobsEnv.load())
_tracer = tracer()
router = Router(logger, runtime.dead_letters, quiet_ignores=True)


def record_handler(record: SQSRecord) -> None:
    try:
        router.route(record, classify_task_message(record.body, runtime.settings, now=runtime.now()), act)
    except UnreadableJob as exc:  # no retry can mend the job's item: say so once, in the dead-letter queue
        router.reject(record, str(exc), "job cannot be read")


def act(msg: TaskMessage) -> None:
    if isinstance(msg, LaunchDueMessage):
        note = runtime.service.on_launch_due(msg.job_id, msg.launch_try)
        logger.info("launch due", extra={"job_id": msg.job_id, "note": note})
    elif isinstance(msg, SnapshotMessage):
        note = runtime.service.on_snapshot(msg.snapshot_id, msg.snapshot_ok)
        logger.info("snapshot", extra={"snapshot": msg.snapshot_id, "ok": msg.snapshot_ok, "note": note})
    elif isinstance(msg, PoolEventMessage):
        note = runtime.service.on_pool_event(msg.pool_event)
        if not msg.pool_event.available:  # a launch that succeeded is no failure to count
            metrics.add_metric(name="PoolLaunchFailures", unit=MetricUnit.Count, value=1)
        logger.info("pool event", extra={"group": msg.pool_event.group, "note": note})
    elif isinstance(msg, WarningMessage):
        note = runtime.service.on_warning(msg.notice)
        logger.info("warning", extra={"instance": msg.notice.instance_id, "note": note})
    elif isinstance(msg, TaskStateMessage):
        note = runtime.service.on_task_event(msg.task)
        metrics.add_metric(name="TaskEvents", unit=MetricUnit.Count, value=1)
        logger.info(
            "task event",
            extra={
                "task": msg.task.task_arn,
                "status": msg.task.last_status,
                "version": msg.task.version,
                "note": note,
            },
        )


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return process_partial_response(
        event=event, record_handler=record_handler, processor=processor, context=context
    )


if _tracer is not None:
    lambda_handler = _tracer.capture_lambda_handler(lambda_handler)
