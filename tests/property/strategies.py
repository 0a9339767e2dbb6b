"""Inputs for the properties: random JSON, text, and mutations of the real samples (a field dropped, its
type changed, huge, negative, empty, unicode, nested or placeholder values swapped in, keys added).

`malformed(name, event)` is the oracle: an independent statement (from docs/events.md and the event
formats, not from SpotGuard's parsers) of when an event of a sample's kind must not be acted on. It
names a reason, or returns None when the event may be acted on. It is deliberately partial: it only
flags what is clearly wrong, and leaves the rest to the properties that hold for every input.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any

from hypothesis import strategies as st

# What an SQS message body may hold (SQS refuses other characters).
SQS_TEXT = st.characters(
    codec="utf-8", exclude_categories=("Cs",), exclude_characters="\x00\ufffe\uffff"
).filter(lambda c: c in "\t\n\r" or ord(c) >= 0x20)

PLACEHOLDERS = [
    "<instance-id>",
    "yyyy-mm-ddThh:mm:ssZ",
    "{{resolve:x}}",
    "${InstanceId}",
    "<EC2 instance id>",
]
TIMES = [
    "9999-12-31T23:59:59Z",
    "0001-01-01T00:00:00Z",
    "2026-11-21T14:46:03",  # no zone
    "2026-11-21T14:46:03.1234567Z",
    "2026-11-21T14:46:03+14:00",
    "2026-11-21 14:46:03Z",
    "Sat, 21 Nov 2026 09:00:00 GMT",
    "Fri, 31 Dec 9999 23:59:59 GMT",
    "1795275963",
    "2026-02-30T00:00:00Z",
]
NUMBERS = [0, -1, 1, 2**31, 2**63 - 1, 2**63, 2**64, 10**38, 10**40, -(2**63), 255, 75]


def nested(depth: int) -> Any:
    node: Any = "leaf"
    for i in range(depth):
        node = {"n": node} if i % 2 else [node]
    return node


json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from(NUMBERS)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)  # any code point, lone surrogates too: dumped as \\u escapes
    | st.sampled_from(PLACEHOLDERS + TIMES + ["", " ", "\u200b", "i-", "arn:aws:ecs:", "STOPPED", "RUNNING"])
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
weird_values = st.one_of(
    json_values,
    st.integers(min_value=2, max_value=90).map(nested),
    st.sampled_from(["x" * 20_000, "é" * 5_000, "\U0001f600" * 1_000]),
    st.just({}),
    st.just([]),
)


def dumps(value: Any) -> str:
    """A message body: JSON in ASCII (escapes keep any code point SQS-safe); NaN and Infinity kept,
    as Python's json module (and so a careless sender) writes them."""
    return json.dumps(value, ensure_ascii=True)


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a node under `value` (not the root itself)."""
    out: list[tuple[Any, ...]] = []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        out.append((*prefix, k))
        out += paths(v, (*prefix, k))
    return out


def _get(value: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        value = value[k]
    return value


@st.composite
def mutated(
    draw: st.DrawFn, event: dict[str, Any], max_mutations: int = 3
) -> tuple[dict[str, Any], list[str]]:
    """`event` with 1 to `max_mutations` mutations; also what was done (for the failure message)."""
    event = json.loads(json.dumps(event))
    done: list[str] = []
    for _ in range(draw(st.integers(1, max_mutations))):
        candidates = paths(event)
        if not candidates:
            break
        path = draw(st.sampled_from(candidates))
        parent, key = _get(event, path[:-1]), path[-1]
        old = parent[key]
        op = draw(st.sampled_from(["drop", "set", "set", "set", "text", "add"]))
        if op == "drop":
            del parent[key]
        elif op == "text" and isinstance(old, str):
            parent[key] = draw(
                st.sampled_from(
                    [old + "\u00e9", old.upper(), old[:-1], " " + old, old + "\u200b", old * 50, old + "<x>"]
                )
            )
        elif op == "add" and isinstance(old, dict):
            parent[key] = {**old, draw(st.text(min_size=1, max_size=12)): draw(json_values)}
        else:
            parent[key] = draw(weird_values)
        done.append(f"{op} {'.'.join(map(str, path))}")
    return event, done


# ------------------------------------------------------------------------------------------- the oracle
INSTANCE_ID = re.compile(
    r"^(?:i-(?:[0-9a-f]{8}|[0-9a-f]{17})|arn:aws[a-z-]*:ec2:[a-z0-9-]*(?::[0-9]{12}|:)?:instance/"
    r"i-(?:[0-9a-f]{8}|[0-9a-f]{17}))\Z"
)  # an id, or an EC2 instance ARN (read as its id)
TASK_ARN = re.compile(r"^arn:aws[a-z-]*:ecs:[a-z0-9-]+:\d{12}:task/")
CLUSTER_ARN = re.compile(r"^arn:aws[a-z-]*:ecs:[a-z0-9-]+:\d{12}:cluster/")
ECS_ARN = re.compile(r"^arn:aws[\w-]*:ecs:")
PLACEHOLDER = re.compile(r"<[^<>]*>|\byyyy\b|\bhh:mm|\{\{|\$\{", re.IGNORECASE)
FREE_TEXT = {"eventDescription", "latestDescription", "NotificationMetadata", "Description", "Cause"}
KINDS = {  # sample -> (source, detail-type) the sample is
    "spot-interruption-warning": ("aws.ec2", "EC2 Spot Instance Interruption Warning"),
    "spot-interruption-hibernate": ("aws.ec2", "EC2 Spot Instance Interruption Warning"),
    "rebalance-recommendation": ("aws.ec2", "EC2 Instance Rebalance Recommendation"),
    "instance-state-shutting-down": ("aws.ec2", "EC2 Instance State-change Notification"),
    "instance-state-running": ("aws.ec2", "EC2 Instance State-change Notification"),
    "asg-terminate-lifecycle-action": ("aws.autoscaling", "EC2 Instance-terminate Lifecycle Action"),
    "health-scheduled-retirement": ("aws.health", "AWS Health Event"),
    "health-account-notification": ("aws.health", "AWS Health Event"),
    "ecs-container-instance-state-change": ("aws.ecs", "ECS Container Instance State Change"),
    "lifecycle-check": ("spotguard", "Lifecycle Check"),
    "ecs-task-state-change": ("aws.ecs", "ECS Task State Change"),
    "ebs-snapshot-notification": ("aws.ec2", "EBS Snapshot Notification"),
    "asg-launch-unsuccessful": ("aws.autoscaling", "EC2 Instance Launch Unsuccessful"),
    "asg-launch-successful": ("aws.autoscaling", "EC2 Instance Launch Successful"),
    "launch-due": ("spotguard", "Launch Due"),
    "s3-manifest-created": ("aws.s3", "Object Created"),
}
KNOWN_TYPES = set(KINDS.values())


def is_str(v: Any) -> bool:
    return isinstance(v, str)


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def iso_time(v: Any) -> bool:
    """An ISO 8601 time with its zone (or a Unix time in digits, which parsers read as UTC)."""
    if not isinstance(v, str):
        return False
    if v.isdigit():
        return True
    try:
        t = datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError:
        return False
    return t.tzinfo is not None


def any_time(v: Any) -> bool:
    """ISO 8601 with a zone, or RFC 1123 (AWS Health)."""
    if iso_time(v):
        return True
    if isinstance(v, str) and "," in v[:5]:
        try:
            return parsedate_to_datetime(v.split(",", 1)[1].strip()) is not None
        except (TypeError, ValueError):
            return False
    return False


def _depth(v: Any) -> int:
    if isinstance(v, dict):
        return 1 + max((_depth(x) for x in v.values()), default=0)
    if isinstance(v, list):
        return 1 + max((_depth(x) for x in v), default=0)
    return 0


def _placeholder(v: Any) -> bool:
    if isinstance(v, str):
        return bool(PLACEHOLDER.search(v))
    if isinstance(v, dict):
        return any(_placeholder(x) for k, x in v.items() if k not in FREE_TEXT)
    if isinstance(v, list):
        return any(_placeholder(x) for x in v)
    return False


def _version(v: Any) -> bool:
    """An ECS version: a non-negative integer (a Long)."""
    return is_int(v) and 0 <= v < 2**63


# per sample: (field in detail, required, check) of what SpotGuard reads
_ID = ("instance-id", True, lambda v: is_str(v) and bool(INSTANCE_ID.match(v)))
DETAIL_RULES: dict[str, list[tuple[str, bool, Any]]] = {
    "spot-interruption-warning": [
        _ID,
        ("instance-action", True, lambda v: v in ("terminate", "stop", "hibernate")),
    ],
    "rebalance-recommendation": [_ID],
    "instance-state-shutting-down": [_ID, ("state", True, is_str)],
    "asg-terminate-lifecycle-action": [
        ("EC2InstanceId", True, lambda v: is_str(v) and bool(INSTANCE_ID.match(v))),
        ("LifecycleActionToken", True, lambda v: is_str(v) and len(v) == 36),
        ("AutoScalingGroupName", True, lambda v: is_str(v) and v != ""),
        ("LifecycleHookName", True, lambda v: is_str(v) and v != ""),
        ("LifecycleTransition", True, is_str),
    ],
    "health-scheduled-retirement": [
        ("service", True, is_str),
        ("eventTypeCode", True, is_str),
        ("eventTypeCategory", True, is_str),
        ("startTime", False, lambda v: v is None or is_str(v)),  # read leniently: any time string
    ],
    "ecs-container-instance-state-change": [
        ("clusterArn", True, lambda v: is_str(v) and bool(ECS_ARN.match(v))),
        ("containerInstanceArn", True, lambda v: is_str(v) and bool(ECS_ARN.match(v))),
        ("ec2InstanceId", True, lambda v: is_str(v) and bool(INSTANCE_ID.match(v))),
        ("status", True, is_str),
        ("version", True, lambda v: _version(v) or (is_str(v) and v.isdigit() and int(v) < 2**63)),
    ],
    "lifecycle-check": [
        _ID,
        ("deadline", True, is_str),  # read leniently (see the report on issue 17: a naive one can raise)
        ("notice-key", True, is_str),
        ("lifecycle", True, lambda v: isinstance(v, dict)),
    ],
    "ecs-task-state-change": [
        ("taskArn", True, lambda v: is_str(v) and bool(TASK_ARN.match(v))),
        ("clusterArn", True, lambda v: is_str(v) and bool(CLUSTER_ARN.match(v))),
        ("lastStatus", True, lambda v: is_str(v) and v != ""),
        ("version", True, _version),
        *[
            (t, False, lambda v: v is None or iso_time(v))
            for t in ("startedAt", "stoppingAt", "stoppedAt", "createdAt")
        ],
        (
            "containers",
            False,
            lambda v: (
                isinstance(v, list)
                and all(
                    isinstance(c, dict) and (c.get("exitCode") is None or is_int(c["exitCode"])) for c in v
                )
            ),
        ),
    ],
    "ebs-snapshot-notification": [
        ("event", True, is_str),
        ("result", True, is_str),
        ("snapshot_id", True, lambda v: is_str(v) and v != ""),
    ],
    "launch-due": [("job-id", True, is_str), ("launch-try", True, lambda v: is_int(v) and v >= 0)],
    "asg-launch-unsuccessful": [
        ("AutoScalingGroupName", True, lambda v: is_str(v) and 1 <= len(v) <= 255),
        ("StatusMessage", False, lambda v: is_str(v) and len(v) <= 4000),
        ("Cause", False, lambda v: is_str(v) and len(v) <= 4000),
        ("Details", False, lambda v: isinstance(v, dict) and all(is_str(x) for x in v.values())),
    ],
}
DETAIL_RULES["asg-launch-successful"] = [
    *DETAIL_RULES["asg-launch-unsuccessful"],
    ("EC2InstanceId", False, lambda v: v is None or (is_str(v) and len(v) <= 100)),
]
DETAIL_RULES["spot-interruption-hibernate"] = DETAIL_RULES["spot-interruption-warning"]
DETAIL_RULES["instance-state-running"] = DETAIL_RULES["instance-state-shutting-down"]
DETAIL_RULES["health-account-notification"] = DETAIL_RULES["health-scheduled-retirement"]


def malformed(name: str, event: Any) -> str | None:
    """Why an event made from sample `name` must not be acted on, or None when it may be."""
    if not isinstance(event, dict):
        return "not an object"
    if name == "s3-manifest-created":  # the checkpoints function reads only the bucket and the key
        return _s3_malformed(event)
    if _depth(event) > 64:
        return "nested too deeply"
    for key in ("id", "source", "detail-type", "time"):
        if not is_str(event.get(key)):
            return f"{key}: missing or not a string"
    if not isinstance(event.get("detail"), dict):
        return "detail: missing or not an object"
    if not iso_time(event["time"]):
        return "time: not an ISO time with a zone"
    if _placeholder(event):
        return "holds a placeholder"
    if (event["source"], event["detail-type"]) != KINDS[name]:
        if (event["source"], event["detail-type"]) in KNOWN_TYPES:
            return None  # now another kind of event, whose detail may be valid for it
        return f"{event['source']} '{event['detail-type']}' is not a kind SpotGuard acts on"
    detail = event["detail"]
    for key, required, valid in DETAIL_RULES.get(name, []):
        if key not in detail:
            if required:
                return f"detail.{key}: missing"
            continue
        if not valid(detail[key]):
            return f"detail.{key}: {str(detail[key])[:40]!r} is not valid"
    return None


def _s3_malformed(event: dict[str, Any]) -> str | None:
    for key in ("id", "source", "detail-type"):
        if not is_str(event.get(key)):
            return f"{key}: missing or not a string"
    if (event["source"], event["detail-type"]) != KINDS["s3-manifest-created"]:
        return "not an S3 Object Created event"
    detail = event.get("detail")
    bucket = detail.get("bucket") if isinstance(detail, dict) else None
    obj = detail.get("object") if isinstance(detail, dict) else None
    if not (isinstance(bucket, dict) and is_str(bucket.get("name"))):
        return "detail.bucket.name: missing or not a string"
    if not (isinstance(obj, dict) and is_str(obj.get("key"))):
        return "detail.object.key: missing or not a string"
    return None
