"""Jobs function, for manual invocation (`sam remote invoke JobsFunction --event '{...}'`, or the
`spotguard jobs` CLI): submit, resubmit, cancel, status and list.

The payload is validated by the pydantic models in spotguard.domain.jobs.commands; the answer is always a
JSON object `{"ok": true, ...}` or `{"ok": false, "error": {"type", "message"}}`, never a stack trace.
"""

from __future__ import annotations

import warnings
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit

from spotguard.adapters.metrics import tracer
from spotguard.domain.jobs.answers import JobSummary
from spotguard.domain.jobs.commands import (
    Answer,
    Cancel,
    CommandError,
    ErrorBody,
    ListJobs,
    Resubmit,
    Status,
    Submit,
    parse_command,
)
from spotguard.domain.jobs.model import UnreadableJob
from spotguard.runtime.config import JobsEnv
from spotguard.runtime.jobs import JobsRuntime

warnings.filterwarnings("ignore", "No application metrics to publish")
logger = Logger()
metrics = Metrics()
runtime = JobsRuntime(JobsEnv.load())
_tracer = tracer()


def handle(payload: Any) -> Answer:
    cmd = parse_command(payload)
    service = runtime.service
    if isinstance(cmd, Submit):
        job = runtime.submit(cmd=cmd)
        metrics.add_metric(name="JobsSubmitted", unit=MetricUnit.Count, value=1)
        return Answer(ok=True, action=cmd.action, job=job)
    if isinstance(cmd, Resubmit):
        return Answer(ok=True, action=cmd.action, job=JobSummary.of(service.resubmit(cmd)))
    if isinstance(cmd, Cancel):
        return Answer(ok=True, action=cmd.action, job=JobSummary.of(service.cancel(cmd)))
    if isinstance(cmd, Status):
        return Answer(ok=True, action=cmd.action, job=service.status(cmd))
    assert isinstance(cmd, ListJobs)
    return Answer(ok=True, action=cmd.action, jobs=service.list(cmd))


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def lambda_handler(event: Any, context: Any) -> dict[str, Any]:
    logger.set_correlation_id(getattr(context, "aws_request_id", None))
    runtime.register_context(context)
    action = event.get("action") if isinstance(event, dict) else None
    action = action if isinstance(action, str) else None  # {"action": 1} is answered, not raised on
    try:
        answer = handle(event)
    except (CommandError, UnreadableJob) as exc:
        logger.warning("refused", extra={"action": action, "type": exc.kind, "reason": str(exc)})
        answer = Answer(ok=False, action=action, error=ErrorBody(type=exc.kind, message=str(exc)))
    except Exception:
        logger.exception("failed", extra={"action": action})
        request_id = getattr(context, "aws_request_id", "-")
        answer = Answer(
            ok=False,
            action=action,
            error=ErrorBody(
                type="InternalError", message=f"SpotGuard failed; see its log for request {request_id}"
            ),
        )
    logger.info("answered", extra={"action": action, "ok": answer.ok})
    return answer.wire()


if _tracer is not None:
    lambda_handler = _tracer.capture_lambda_handler(lambda_handler)
