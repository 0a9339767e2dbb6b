"""`spotguard.domain.errors.one_line`: every error of a bad input named in one line, by the input's own
field names (not pydantic's union members or a tagged union's tag), with what is expected."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from spotguard.domain.errors import one_line
from spotguard.domain.interruption.classify import classify
from spotguard.domain.jobs.commands import CommandError, parse_command
from spotguard.domain.settings import Settings

REPO = Path(__file__).resolve().parents[2]


def _refusal(payload: dict[str, Any]) -> str:
    with pytest.raises(CommandError) as err:
        parse_command(payload)
    return str(err.value)


def test_every_error_is_named_not_counted():
    said = _refusal({"action": "submit", "request": {"cluster": 5}})
    assert said == "request.cluster: Input should be a valid string; request.taskDefinition: Field required"


def test_places_with_the_same_complaint_are_named_together():
    payload = json.loads((REPO / "events" / "jobs" / "submit.json").read_text())
    said = _refusal({"action": "submit", "request": payload})  # a whole payload given as the request
    assert said == (
        "request.cluster, request.taskDefinition: Field required; "
        "request.action, request.request, request.options: Extra inputs are not permitted"
    )


def test_a_bad_time_shows_an_example():
    said = _refusal(
        {
            "action": "submit",
            "request": {"cluster": "gpu-spot", "taskDefinition": "t"},
            "options": {"deadline": "tomorrow"},
        }
    )
    assert said == (
        "options.deadline: expected an ISO 8601 time with a time zone, e.g. 2027-06-01T18:00:00Z, "
        "not 'tomorrow'"
    )


def test_a_union_is_named_by_its_field():
    event = json.loads((REPO / "events" / "eventbridge" / "spot-interruption-warning.json").read_text())
    event["detail"] = "a string"
    decision = classify(event, Settings())
    assert decision.outcome == "reject" and decision.reason == "detail: Input should be a JSON object"


class _Many(BaseModel):
    values: list[int]


def test_a_flood_of_errors_stays_one_short_line():
    with pytest.raises(ValidationError) as err:
        _Many.model_validate({"values": ["x"] * 30})
    line = one_line(err.value)
    assert "\n" not in line and line.endswith("(and 22 more)") and line.startswith("values.0, values.1")


def test_a_key_holding_a_newline_stays_one_line_in_every_refusal():
    """Found by the random property profile in CI: a Launch Due message with an extra detail key '\\n' was
    dead-lettered with the reason 'detail.\\n: Extra inputs are not permitted', on two lines."""
    import json
    from datetime import UTC, datetime

    from spotguard.domain.jobs.task_events import classify_task_message
    from spotguard.domain.own_events import launch_due_message
    from spotguard.domain.settings import Settings

    body = json.loads(launch_due_message("job-1", 1, datetime.now(UTC)))
    body["detail"]["\n"] = None
    msg = classify_task_message(json.dumps(body), Settings())
    assert msg.outcome == "reject" and "\n" not in msg.reason and "\\n" in msg.reason, msg.reason
