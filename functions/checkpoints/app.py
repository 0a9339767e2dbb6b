"""Checkpoints function: S3 'Object Created' events for MANIFEST.json -> the job's newest checkpoint.

Per record: an event that is not an S3 event, or a manifest that is not valid, goes straight to the
dead-letter queue (retrying cannot fix it); objects that are not manifests are ignored; a manifest is
read, validated and recorded as its job's newest committed checkpoint only if its sequence is newer,
so repeated and out-of-order events change nothing. An AWS failure fails only its record (retried).
"""

from __future__ import annotations

import warnings
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from spotguard.domain.checkpoints import ManifestEvent, classify_object_created
from spotguard.runtime.checkpoints import CheckpointsRuntime
from spotguard.runtime.config import CheckpointsEnv
from spotguard.runtime.handling import Router
from spotguard.usecases.checkpoints import BadManifest, ManifestGone

warnings.filterwarnings("ignore", "No application metrics to publish")
logger = Logger()
metrics = Metrics()
processor = BatchProcessor(event_type=EventType.SQS)
runtime = CheckpointsRuntime(CheckpointsEnv.load())
router = Router(logger, runtime.dead_letters)


def record_handler(record: SQSRecord) -> None:
    event = classify_object_created(record.body)
    router.route(record, event, lambda e: record_checkpoint(record, e), ignored={"key": event.key})


def record_checkpoint(record: SQSRecord, event: ManifestEvent) -> None:
    try:
        ref, recorded = runtime.service.on_committed(event)
    except BadManifest as exc:
        metrics.add_metric(name="BadManifests", unit=MetricUnit.Count, value=1)
        router.reject(record, str(exc), "bad manifest")
        return
    except ManifestGone as exc:  # rotated away since, or a replayed event: nothing to record
        logger.info("ignored", extra={"reason": str(exc), "key": event.key})
        return
    if recorded.new:  # counted once a checkpoint, however often its event comes
        metrics.add_metric(name="CheckpointsCommitted", unit=MetricUnit.Count, value=1)
    if recorded.newest:
        said = "checkpoint recorded as its job's newest"
    else:  # an older one, or a retried delivery whose first try moved the newest already
        said = (
            "checkpoint recorded; the newest not moved by this delivery" if recorded.new else "repeated event"
        )
    logger.info(said, extra={"prefix": ref.prefix_uri, "sequence": ref.sequence, "step": ref.step})


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return process_partial_response(
        event=event, record_handler=record_handler, processor=processor, context=context
    )
