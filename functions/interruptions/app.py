"""Interruption function: the urgent path. SQS batch of EventBridge events -> notices -> drain + checkpoint.

Per record: classify the event; a reject goes straight to the dead-letter queue (retrying bad input
never helps) and the batch goes on; an ignore is logged and counted; an act runs the use case, and any
exception there (throttling that outlived botocore's retries, the same notice in flight elsewhere) marks
only that record failed, so SQS delivers it again and, after maxReceiveCount, to the dead-letter queue.

The records of a batch are handled side by side (`ParallelBatchProcessor`): when many instances are
warned at once, the tenth notice of a batch must not wait for the nine before it.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.utilities.batch import EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from spotguard.adapters.metrics import count_decision, count_outcome, tracer
from spotguard.domain.interruption.classify import classify
from spotguard.domain.interruption.notices import Decision, planned_actions
from spotguard.runtime.config import InterruptionEnv
from spotguard.runtime.handling import Router
from spotguard.runtime.interruption import InterruptionRuntime, ParallelBatchProcessor, ThreadLogger

# A batch of ignored events has no metric to publish; that is normal, not worth a warning per batch.
warnings.filterwarnings("ignore", "No application metrics to publish")
logger: Logger = ThreadLogger()
metrics = Metrics()
_metrics_lock = threading.Lock()  # Powertools' metric set is one dict for the whole process
processor = ParallelBatchProcessor(event_type=EventType.SQS)
runtime = InterruptionRuntime(InterruptionEnv.load())
_tracer = tracer()
router = Router(logger, runtime.dead_letters)


def record_handler(record: SQSRecord) -> None:
    decision = classify(record.body, runtime.settings)
    with _metrics_lock:
        count_decision(metrics, decision)
    router.route(record, decision, act, ignored={"kind": decision.kind})


def act(decision: Decision) -> None:
    logger.info(
        "acting", extra={"kind": decision.kind, "actions": planned_actions(decision, runtime.settings)}
    )
    if decision.index_update is not None:
        applied = runtime.service.index(decision.index_update)
        logger.info("indexed" if applied else "stale index update dropped")
        return
    for notice in decision.notices:
        outcome = runtime.handle_notice(notice=notice)
        with _metrics_lock:
            count_outcome(metrics, outcome)
        logger.info("notice handled", extra={"outcome": outcome.model_dump(mode="json")})


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    runtime.register_context(context)
    return process_partial_response(
        event=event, record_handler=record_handler, processor=processor, context=context
    )


if _tracer is not None:  # optional X-Ray tracing (EnableTracing=true)
    lambda_handler = _tracer.capture_lambda_handler(lambda_handler)
