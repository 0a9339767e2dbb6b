"""The EventBridge envelope and the guards every classifier applies to input from outside. Pure.

Every queue's classifier (notices, task events, checkpoints) starts with `envelope`: a record that is not
JSON, not an object, nested absurdly deep, missing what a decision reads, or holding a console sample's
placeholder (`<instance-id>`, `yyyy-mm-ddThh:mm:ssZ`) is refused in one line, never acted on. The field
types here (`InstanceId`, `EventTime`, `MAX_VERSION`) are the ones every event's detail uses:
- an instance is named by its id or by its EC2 instance ARN (AWS Health names affected instances so);
- an event's times are ISO 8601 strings with a zone, never numbers (a number is not read as 1970).
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Annotated, Any

from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)

from spotguard.domain.errors import MAX_DEPTH, one_line, printable, too_deep

MAX_VERSION = 2**53  # ECS versions are small counters; DynamoDB numbers hold 38 digits at most
_ID = r"i-(?:[0-9a-f]{8}|[0-9a-f]{17})"
INSTANCE_ID = re.compile(_ID)  # matched whole (fullmatch): "$" would let a trailing newline through
# An EC2 instance ARN, as AWS Health names affected instances: arn:aws:ec2:REGION:ACCOUNT:instance/ID.
# The spot warning's ARN may hold a zone where the region should be and no account field at all.
INSTANCE_ARN = re.compile(rf"arn:aws[a-z-]*:ec2:[a-z0-9-]*(?::[0-9]{{12}}|:)?:instance/({_ID})")
_PLACEHOLDER = re.compile(r"<[^<>]*>|\byyyy\b|\bhh:mm|\{\{|\$\{", re.IGNORECASE)


class Refused(BaseModel):
    """Why a record is no event SpotGuard can read (one line), and its id when it has one."""

    model_config = ConfigDict(frozen=True)
    reason: str
    event_id: str | None = None

    @classmethod
    def of(cls, reason: str, event_id: str | None = None) -> Refused:
        """The refusal, its reason on one line whatever the input put in it (a key or a value with a
        newline or another control character is shown escaped: `version.\\n`)."""
        return cls(reason=printable(reason), event_id=event_id)


def instance_id_of(value: str) -> str | None:
    """The instance an id or an EC2 instance ARN names (the id), or None when it names none."""
    if INSTANCE_ID.fullmatch(value):
        return value
    arn = INSTANCE_ARN.fullmatch(value)
    return arn.group(1) if arn else None


def _instance_id(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("must be a string")
    found = instance_id_of(value)
    if found is None:
        raise ValueError(f"{value!r} is not an EC2 instance id or instance ARN")
    return found


def time_text(value: Any) -> Any:
    """An event's times are ISO 8601 strings: a number is not read as seconds since 1970."""
    if not isinstance(value, str | datetime):
        raise ValueError("must be an ISO 8601 time string")
    return value


InstanceId = Annotated[str, BeforeValidator(_instance_id)]
EventTime = Annotated[AwareDatetime, BeforeValidator(time_text)]  # ISO 8601 with a zone, not a number


# Free text that may hold angle brackets in a real event: not searched for placeholders.
_FREE_TEXT = {"eventDescription", "latestDescription", "NotificationMetadata", "Description", "Cause"}


def find_placeholder(value: Any, path: str = "") -> str | None:
    """Where a console sample's placeholder (`<instance-id>`, `yyyy-mm-dd`...) sits in an event, if any."""
    if isinstance(value, str):
        return path or "event" if _PLACEHOLDER.search(value) else None
    if isinstance(value, dict):
        for k, v in value.items():
            if k in _FREE_TEXT:
                continue
            found = find_placeholder(v, f"{path}.{k}" if path else str(k))
            if found:
                return found
    if isinstance(value, list):
        for i, v in enumerate(value):
            found = find_placeholder(v, f"{path}[{i}]")
            if found:
                return found
    return None


class Envelope(EventBridgeModel):
    """The EventBridge envelope as SpotGuard needs it: what a decision reads (id, source, detail-type,
    time, detail) is required; what none reads may be missing (a real AWS Health event can come without
    `resources`: its instances are in detail.affectedEntities)."""

    version: str = "0"
    account: str = ""
    region: str = ""
    resources: list[str] = Field(default_factory=list)
    # EventBridge ids are UUIDs; the ledger keys notices by it, and a key has a bounded length
    id: str = Field(min_length=1, max_length=256)

    @field_validator("time", mode="before")
    @classmethod
    def _time_is_text(cls, v: Any) -> Any:
        return time_text(v)


def envelope(raw: str | bytes | dict[str, Any]) -> Envelope | Refused:
    """Parse the EventBridge envelope of one record, or say in one line why it is not one. Every queue's
    classifier starts here, so all of them refuse the same bad input the same way."""
    try:
        return _envelope(raw)
    except RecursionError:  # json.loads and the placeholder walk on absurdly deep nesting
        return Refused.of("nested too deeply to be an event")


def _envelope(raw: str | bytes | dict[str, Any]) -> Envelope | Refused:
    if isinstance(raw, (str, bytes)):
        try:
            raw = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            return Refused.of(f"not valid JSON: {exc}")
    if not isinstance(raw, dict):
        return Refused.of(f"not an EventBridge event: a JSON {type(raw).__name__}, not an object")
    if too_deep(raw):
        return Refused.of(
            f"nested too deeply to be an event (more than {MAX_DEPTH} levels)", _str(raw.get("id"))
        )
    missing = [k for k in ("id", "source", "detail-type", "detail", "time") if k not in raw]
    if missing:
        return Refused.of(f"not an EventBridge event: missing {', '.join(missing)}")
    placeholder = find_placeholder(raw)
    if placeholder:
        return Refused.of(f"{placeholder}: holds a placeholder, not a real value", _str(raw.get("id")))
    try:
        event = Envelope.model_validate(raw)
    except ValidationError as exc:
        return Refused.of(one_line(exc), _str(raw.get("id")))
    if not isinstance(event.detail, dict):
        return Refused.of("detail: must be an object", event.id)
    if event.time.tzinfo is None:
        return Refused.of("time: has no time zone", event.id)
    return event


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None
