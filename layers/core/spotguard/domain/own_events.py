"""SpotGuard's own delayed messages, EventBridge-shaped so that they go through the same envelope checks
as every AWS event: Lifecycle Check (the interruptions queue: is the held instance's task stopped yet?)
and Launch Due (the retry queue: a job waiting for capacity is due for another RunTask). Pure, and
free of pydantic, so that the adapter that sends them costs the urgent function nothing at cold start."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

SOURCE = "spotguard"
LIFECYCLE_CHECK = "Lifecycle Check"
LAUNCH_DUE = "Launch Due"


def own_event(detail_type: str, detail: dict[str, Any], now: datetime) -> str:
    """The message body: an EventBridge event of source `spotguard`."""
    return json.dumps(
        {
            "version": "0",
            "id": str(uuid.uuid4()),
            "source": SOURCE,
            "detail-type": detail_type,
            "account": "000000000000",
            "time": now.isoformat(),
            "region": "",
            "resources": [],
            "detail": detail,
        }
    )


def launch_due_message(job_id: str, launch_try: int, now: datetime) -> str:
    return own_event(LAUNCH_DUE, {"job-id": job_id, "launch-try": launch_try}, now)
