"""Inputs that hit a defect the properties found (in code this suite does not own). The property tests
leave them out (each has a strict xfail reproduction in test_defects.py, which fails once the defect is
fixed: then drop its predicate here, and the properties cover that input again)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

MANIFEST_KEY = re.compile(r"^(?:.+/)?checkpoints/\d{1,20}/MANIFEST\.json$")
TIMES = ("startedAt", "stoppingAt", "stoppedAt", "createdAt")


def _time(v: Any) -> datetime | None:
    if not isinstance(v, str):
        return None
    try:
        return datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError:
        return None


def _detail(event: Any) -> dict[str, Any]:
    d = event.get("detail") if isinstance(event, dict) else None
    return d if isinstance(d, dict) else {}


def _huge(v: Any) -> bool:
    if isinstance(v, str) and v.lstrip("-").isdigit():
        v = int(v)
    return isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10**38


def known_defect(event: Any, existing_keys: set[str], bucket: str) -> str | None:
    """The test_defects.py test an event reproduces, if it hits a known defect."""
    if not isinstance(event, dict):
        return None
    detail, kind = _detail(event), (event.get("source"), event.get("detail-type"))
    t = _time(event.get("time"))
    if (
        t is not None
        and t.tzinfo is not None
        and t >= datetime.max.replace(tzinfo=UTC) - timedelta(minutes=3)
    ):
        return "test_a_spot_warning_at_the_end_of_time_is_rejected_not_retried"
    eid = event.get("id")
    if isinstance(eid, str) and len(eid.encode("utf-8", "surrogatepass")) > 900:
        return "test_an_event_id_too_long_for_a_key_is_rejected_not_retried"
    if _huge(detail.get("version")):
        return "test_a_version_beyond_dynamodbs_numbers_is_rejected_not_retried"
    if kind == ("aws.ecs", "ECS Task State Change"):
        arn, host = detail.get("taskArn"), detail.get("containerInstanceArn")
        if (isinstance(arn, str) and len(arn.encode("utf-8", "surrogatepass")) > 1000) or (
            isinstance(host, str) and len(host.encode("utf-8", "surrogatepass")) > 2000
        ):
            return "test_a_task_event_with_an_arn_too_long_for_a_key_is_rejected_not_retried"
        for name in TIMES:
            d = _time(detail.get(name))
            if d is not None and d.tzinfo is None:
                return "test_a_task_event_time_without_a_zone_poisons_no_job"
    if kind == ("aws.s3", "Object Created"):
        name = (detail.get("bucket") or {}).get("name") if isinstance(detail.get("bucket"), dict) else None
        key = (detail.get("object") or {}).get("key") if isinstance(detail.get("object"), dict) else None
        manifest = isinstance(name, str) and isinstance(key, str) and MANIFEST_KEY.match(key)
        if manifest and (name != bucket or key not in existing_keys):
            return "test_a_manifest_event_for_no_manifest_is_not_retried"
    return None
