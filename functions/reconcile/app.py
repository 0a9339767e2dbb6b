"""Reconcile function, on a schedule: nothing is lost even when an event is.

Repeats launches left half-done (the same client token returns the same task), launches due jobs whose
retry message was lost, and applies the stop of a job's task that stopped (or vanished from ECS)
without its event being seen. Safe to run at any time and any number of times. A checkpoint bucket
the user brought is checked first (at the first sweep, then once an hour): what it lacks is logged and
sent on the stack's topic, and the sweep goes on.
"""

from __future__ import annotations

import warnings
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit

from spotguard.adapters.job_metrics import LIVE_STATES, count_jobs_by_state
from spotguard.adapters.metrics import tracer
from spotguard.runtime.bucket_check import bucket_check
from spotguard.runtime.config import JobsEnv
from spotguard.runtime.jobs import JobsRuntime

warnings.filterwarnings("ignore", "No application metrics to publish")
logger = Logger()
metrics = Metrics()
runtime = JobsRuntime(JobsEnv.load())
bucket = bucket_check(clock=runtime.now)  # None for the bucket the stack created
_tracer = tracer()


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, int]:
    logger.set_correlation_id(event.get("id") if isinstance(event, dict) else None)
    if bucket is not None:
        bucket.run()  # never raises
    counts = runtime.reconciler.reconcile()
    for name, value in counts.metrics():
        metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)
    try:  # the dashboard's jobs by state, once a sweep
        count_jobs_by_state({state: runtime.jobs.count(state) for state in LIVE_STATES})
    except Exception:  # a metric lost, never the sweep
        logger.exception("could not count the jobs by state")
    answer = counts.answer()
    logger.info("reconciled", extra=answer)
    return answer


if _tracer is not None:
    lambda_handler = _tracer.capture_lambda_handler(lambda_handler)
