"""Every event becomes exactly one decision: act (typed notices), ignore (with why) or reject (one line)."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta

import pytest

from spotguard.domain.interruption.classify import classify
from spotguard.domain.interruption.notices import Action, NoticeKind, RebalanceMode, Settings, planned_actions

WATCH = Settings(clusters=("gpu-spot",))


def test_spot_warning_is_a_notice_with_a_two_minute_deadline(event):
    d = classify(event("spot-interruption-warning.json"), WATCH)
    assert d.outcome == "act" and d.kind == NoticeKind.SPOT_INTERRUPTION
    (n,) = d.notices
    assert n.instance_id == "i-0b662ef9931388ba0"
    assert n.event_id == "1e5527d7-bb36-4607-3370-4164db56a40e"
    assert n.event_time == datetime(2026, 11, 21, 14, 46, 3, tzinfo=UTC)
    assert n.deadline == n.event_time + timedelta(seconds=120)
    assert planned_actions(d, WATCH) == [Action.RECORD, Action.DRAIN, Action.STOP_TASKS]


def test_ids_come_from_detail_not_from_the_odd_resource_arn(event):
    raw = event("spot-interruption-warning.json")
    # The warning's ARN holds an availability zone where the region should be, and no account.
    assert raw["resources"] == ["arn:aws:ec2:us-west-2a:instance/i-0b662ef9931388ba0"]
    raw["resources"] = ["arn:aws:ec2:us-west-2a:instance/i-00000000000000000"]
    assert classify(raw, WATCH).notices[0].instance_id == "i-0b662ef9931388ba0"
    raw["resources"] = []
    assert classify(raw, WATCH).notices[0].instance_id == "i-0b662ef9931388ba0"


def test_hibernation_has_no_warning_time(event):
    (n,) = classify(event("spot-interruption-hibernate.json"), WATCH).notices
    assert n.deadline == n.event_time


@pytest.mark.parametrize(
    ("mode", "outcome", "actions"),
    [
        (RebalanceMode.IGNORE, "ignore", []),
        (RebalanceMode.CHECKPOINT, "act", [Action.RECORD, Action.CHECKPOINT_TASKS, Action.POOL_FACT]),
        (
            RebalanceMode.DRAIN,
            "act",
            [Action.RECORD, Action.DRAIN, Action.STOP_TASKS, Action.POOL_FACT],
        ),
    ],
)
def test_rebalance_follows_the_stack_setting(event, mode, outcome, actions):
    settings = Settings(clusters=("gpu-spot",), rebalance=mode)
    d = classify(event("rebalance-recommendation.json"), settings)
    assert d.outcome == outcome
    assert planned_actions(d, settings) == actions
    if outcome == "act":
        assert d.notices[0].deadline is None  # a recommendation, not a countdown


@pytest.mark.parametrize("state", ["stopping", "stopped", "shutting-down", "terminated"])
def test_instance_going_away_states_act(event, state):
    raw = event("instance-state-shutting-down.json")
    raw["detail"]["state"] = state
    d = classify(raw, WATCH)
    assert d.outcome == "act" and d.notices[0].deadline == d.notices[0].event_time


@pytest.mark.parametrize("state", ["pending", "running"])
def test_other_instance_states_are_ignored_with_a_reason(event, state):
    raw = event("instance-state-running.json")
    raw["detail"]["state"] = state
    d = classify(raw, WATCH)
    assert d.outcome == "ignore" and state in d.reason


def test_lifecycle_action_carries_its_hook_and_token(event):
    d = classify(event("asg-terminate-lifecycle-action.json"), WATCH)
    (n,) = d.notices
    assert n.kind == NoticeKind.LIFECYCLE_TERMINATE and n.instance_id == "i-0b662ef9931388ba0"
    assert n.lifecycle is not None
    assert (n.lifecycle.group, n.lifecycle.hook, n.lifecycle.token) == (
        "gpu-spot-asg",
        "spotguard-drain",
        "87654321-4321-4321-4321-210987654321",
    )
    assert planned_actions(d, WATCH)[-2:] == [Action.HEARTBEAT, Action.COMPLETE_LIFECYCLE]


def test_lifecycle_launch_transition_is_ignored(event):
    raw = event("asg-terminate-lifecycle-action.json")
    raw["detail"]["LifecycleTransition"] = "autoscaling:EC2_INSTANCE_LAUNCHING"
    assert classify(raw, WATCH).outcome == "ignore"


def test_health_event_names_every_instance_and_parses_rfc1123_times(event):
    d = classify(event("health-scheduled-retirement.json"), WATCH)
    assert d.outcome == "act"
    assert d.instance_ids == ["i-0b662ef9931388ba0", "i-0d1e2f3a4b5c6d7e8"]
    assert all(n.deadline == datetime(2026, 11, 28, 12, 0, tzinfo=UTC) for n in d.notices)
    assert len({n.key for n in d.notices}) == 2  # one notice per instance, each with its own identity


def test_health_times_with_a_wrong_weekday_still_parse(event):
    raw = event("health-scheduled-retirement.json")
    raw["detail"]["startTime"] = "Fri, 28 Nov 2026 12:00:00 GMT"  # 2026-11-28 is a Saturday
    assert classify(raw, WATCH).notices[0].deadline == datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("change", "reason_part"),
    [
        ({"eventTypeCategory": "accountNotification"}, "does not affect instances"),
        ({"statusCode": "closed"}, "closed"),
        ({"service": "RDS"}, "not EC2"),
        ({"affectedEntities": [{"entityValue": "vol-0123456789abcdef0"}]}, "names no EC2 instance"),
        ({"affectedEntities": None}, "names no EC2 instance"),
    ],
)
def test_health_events_that_touch_no_instance_are_ignored(event, change, reason_part):
    raw = event("health-scheduled-retirement.json")
    raw["detail"].update(change)
    d = classify(raw, WATCH)
    assert d.outcome == "ignore" and reason_part in d.reason


def test_container_instance_change_updates_the_index_with_its_version(event):
    d = classify(event("ecs-container-instance-state-change.json"), WATCH)
    assert d.outcome == "act" and d.index_update is not None
    assert d.index_update.version == 14 and d.index_update.status == "ACTIVE"
    assert planned_actions(d, WATCH) == [Action.INDEX]


def test_container_instance_of_an_unwatched_cluster_is_ignored(event):
    d = classify(event("ecs-container-instance-state-change.json"), Settings(clusters=("other",)))
    assert d.outcome == "ignore" and "not watched" in d.reason


@pytest.mark.parametrize("fraction", ["", ".5", ".12", ".123"])
def test_ecs_times_with_zero_to_three_fractional_digits(event, fraction):
    raw = event("ecs-container-instance-state-change.json")
    raw["time"] = f"2026-11-21T12:01:47{fraction}Z"
    assert classify(raw, WATCH).outcome == "act"


def test_task_events_are_not_for_this_queue_but_name_the_task(event):
    d = classify(event("ecs-task-state-change.json"), WATCH)
    assert d.outcome == "ignore" and d.task_arn and d.task_arn.endswith("9f1e2d3c4b5a69788796a5b4c3d2e1f0")


def test_unknown_event_types_are_ignored(event):
    raw = event("spot-interruption-warning.json")
    raw["detail-type"] = "EC2 Fleet Instance Change"
    assert classify(raw, WATCH).outcome == "ignore"


def test_the_same_event_has_the_same_notice_key_and_another_event_another(event):
    raw = event("spot-interruption-warning.json")
    a, b = classify(raw, WATCH), classify(json.dumps(raw), WATCH)
    assert a.notices[0].key == b.notices[0].key
    other = copy.deepcopy(raw)
    other["id"] = "2e5527d7-bb36-4607-3370-4164db56a40e"
    assert classify(other, WATCH).notices[0].key != a.notices[0].key


# ------------------------------------------------------------------------------------------ rejects


def _mutate(raw, path, value):
    target = raw
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return raw


_DELETE = object()


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("{not json", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        ("[1, 2]", "not an EventBridge event: a JSON list"),
        ('"text"', "not an EventBridge event"),
        ("{}", "missing id, source, detail-type, detail, time"),
    ],
)
def test_rejects_what_is_not_an_event(body, reason):
    d = classify(body, WATCH)
    assert d.outcome == "reject" and reason in d.reason and "\n" not in d.reason


@pytest.mark.parametrize(
    ("name", "path", "value", "reason"),
    [
        ("spot-interruption-warning.json", ("detail", "instance-id"), "<instance-id>", "placeholder"),
        ("spot-interruption-warning.json", ("time",), "yyyy-mm-ddThh:mm:ssZ", "placeholder"),
        ("spot-interruption-warning.json", ("detail", "instance-id"), "i-123", "not an EC2 instance id"),
        ("spot-interruption-warning.json", ("detail", "instance-id"), 42, "must be a string"),
        ("spot-interruption-warning.json", ("detail", "instance-action"), "explode", "instance-action"),
        ("spot-interruption-warning.json", ("detail", "instance-id"), _DELETE, "instance-id"),
        ("spot-interruption-warning.json", ("time",), "yesterday", "time"),
        ("spot-interruption-warning.json", ("time",), "2026-11-21T14:46:03", "time zone"),
        ("spot-interruption-warning.json", ("detail",), "a string", "detail"),
        ("asg-terminate-lifecycle-action.json", ("detail", "LifecycleActionToken"), _DELETE, "Lifecycle"),
        ("asg-terminate-lifecycle-action.json", ("detail", "LifecycleActionToken"), "tok", "at least 36"),
        ("health-scheduled-retirement.json", ("detail", "startTime"), "soon", "startTime"),
        ("ecs-container-instance-state-change.json", ("detail", "version"), "fourteen", "version"),
        ("ecs-container-instance-state-change.json", ("detail", "clusterArn"), "gpu-spot", "clusterArn"),
    ],
)
def test_rejects_bad_fields_with_one_line(event, name, path, value, reason):
    raw = _mutate(event(name), path, value)
    d = classify(raw, WATCH)
    assert d.outcome == "reject", d
    assert reason in d.reason and "\n" not in d.reason
    assert not d.notices


def test_health_numbers_as_strings_are_accepted(event):
    raw = event("health-scheduled-retirement.json")
    assert raw["detail"]["page"] == "1"
    assert classify(raw, WATCH).outcome == "act"


def test_angle_brackets_in_free_text_are_not_placeholders(event):
    raw = event("health-scheduled-retirement.json")
    assert "<i-0b662ef9931388ba0>" in raw["detail"]["eventDescription"][0]["latestDescription"]
    assert classify(raw, WATCH).outcome == "act"


def _deep(depth: int) -> object:
    node: object = "leaf"
    for _ in range(depth):
        node = {"a": node}
    return node


def _nested(depth: int) -> str:
    return (
        '{"id": "x", "source": "aws.ec2", "detail-type": "d", "time": "t", "detail": '
        + ("[" * depth + "]" * depth)
        + "}"
    )


@pytest.mark.parametrize(
    "body", [_nested(100_000), json.loads(_nested(500)) | {"detail": {"a": _deep(5000)}}]
)
def test_deeply_nested_input_is_rejected_not_raised(body):
    """json.loads and a recursive walk raise RecursionError on deep nesting, which Lambda would retry
    as a failure (and `explain` print as a traceback): it is bad input, so it is rejected."""
    d = classify(body, WATCH)
    assert d.outcome == "reject" and "nested" in d.reason and "\n" not in d.reason


@pytest.mark.parametrize("missing", ["resources", "account", "region", "version"])
def test_a_health_event_without_envelope_fields_it_does_not_need_is_acted_on(event, missing):
    """The instances of a Health event are in detail.affectedEntities; an event that lacks the envelope's
    resources (or account, region, version) is still a real event, and the decision needs none of them."""
    raw = event("health-scheduled-retirement.json")
    del raw[missing]
    d = classify(raw, WATCH)
    assert d.outcome == "act" and d.notices, d


def test_placeholders_in_the_fields_acted_on_are_still_rejected_without_resources(event):
    raw = event("health-scheduled-retirement.json")
    del raw["resources"]
    raw["detail"]["affectedEntities"][0]["entityValue"] = "<instance-id>"
    assert classify(raw, WATCH).outcome == "reject"


def test_a_lifecycle_hook_that_is_not_spotguards_is_left_to_its_owner(event):
    """SpotGuard completed every terminate lifecycle action it saw: ECS managed draining's hook, other
    teams' hooks. It answers only hooks named with its prefix (LifecycleHookPrefix, `spotguard-`)."""
    raw = event("asg-terminate-lifecycle-action.json")
    raw["detail"]["LifecycleHookName"] = "ecs-managed-draining-termination-hook"
    d = classify(raw, WATCH)
    assert d.outcome == "ignore" and "ecs-managed-draining-termination-hook" in d.reason and not d.notices
    assert classify(event("asg-terminate-lifecycle-action.json"), WATCH).outcome == "act"
    every_hook = Settings(clusters=WATCH.clusters, lifecycle_hook_prefix="")
    assert classify(raw, every_hook).outcome == "act"


# AWS's own example of a scheduled retirement (AWS Health's EventBridge docs): no `resources`, and the
# affected instance named by its ARN, not by its id.
AWS_RETIREMENT_EXAMPLE = {
    "version": "0",
    "id": "7bf73129-1428-4cd3-a780-95db273d1602",
    "detail-type": "AWS Health Event",
    "source": "aws.health",
    "account": "123456789012",
    "time": "2023-01-27T01:43:21Z",
    "region": "us-east-1",
    "detail": {
        "eventArn": "arn:aws:health:us-east-1::event/EC2/AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED/"
        "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED_ab12cd34",
        "service": "EC2",
        "eventScopeCode": "ACCOUNT_SPECIFIC",
        "communicationId": "1234abc01232a4012345678-1",
        "lastUpdatedTime": "Fri, 27 Jan 2023 01:43:21 GMT",
        "statusCode": "upcoming",
        "eventRegion": "us-east-1",
        "eventTypeCode": "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
        "eventTypeCategory": "scheduledChange",
        "startTime": "Wed, 15 Feb 2023 02:00:00 GMT",
        "endTime": "Wed, 15 Feb 2023 04:00:00 GMT",
        "eventDescription": [
            {
                "language": "en_US",
                "latestDescription": "EC2 has detected degradation of the underlying hardware.",
            }
        ],
        "affectedEntities": [
            {
                "entityValue": "arn:aws:ec2:us-east-1:123456789012:instance/i-1234567890abcdef0",
                "lastUpdatedTime": "Fri, 27 Jan 2023 01:43:21 GMT",
                "status": "PENDING",
            }
        ],
        "affectedAccount": "123456789012",
        "page": "1",
        "totalPages": "1",
    },
}


def test_a_health_event_naming_its_instance_by_arn_is_acted_on():
    d = classify(copy.deepcopy(AWS_RETIREMENT_EXAMPLE), WATCH)
    assert d.outcome == "act", d.reason
    assert d.instance_ids == ["i-1234567890abcdef0"]
    assert d.notices[0].deadline == datetime(2023, 2, 15, 2, 0, tzinfo=UTC)
    assert planned_actions(d, WATCH) == [Action.RECORD, Action.DRAIN, Action.STOP_TASKS]


def test_a_health_event_naming_the_same_instance_by_id_and_by_arn_makes_one_notice():
    raw = copy.deepcopy(AWS_RETIREMENT_EXAMPLE)
    raw["detail"]["affectedEntities"].append({"entityValue": "i-1234567890abcdef0"})
    raw["detail"]["affectedEntities"].append(
        {"entityValue": "arn:aws:ec2:us-east-1:123456789012:volume/vol-1234567890abcdef0"}
    )
    assert classify(raw, WATCH).instance_ids == ["i-1234567890abcdef0"]


@pytest.mark.parametrize(
    ("sample", "field"),
    [
        ("spot-interruption-warning.json", "instance-id"),
        ("rebalance-recommendation.json", "instance-id"),
        ("asg-terminate-lifecycle-action.json", "EC2InstanceId"),
    ],
)
@pytest.mark.parametrize(
    "arn",
    [
        "arn:aws:ec2:us-west-2:123456789012:instance/i-0b662ef9931388ba0",
        "arn:aws:ec2:us-west-2a:instance/i-0b662ef9931388ba0",  # the spot warning's odd resource ARN
    ],
)
def test_an_instance_named_by_its_arn_is_read_as_its_id_everywhere(event, sample, field, arn):
    raw = event(sample)
    raw["detail"][field] = arn
    d = classify(raw, WATCH)
    assert d.outcome == "act", d.reason
    assert d.instance_ids == ["i-0b662ef9931388ba0"]


@pytest.mark.parametrize(
    "value",
    [
        "i-0123456789abcdef0\n",
        "i-0123456789abcdef0 ",
        "arn:aws:ec2:us-west-2:123456789012:instance/i-0123456789abcdef0\n",
        "arn:aws:ec2:us-west-2:123456789012:volume/vol-0123456789abcdef0",
        "arn:aws:ecs:us-west-2:123456789012:instance/i-0123456789abcdef0",
    ],
)
def test_what_only_looks_like_an_instance_is_rejected(event, value):
    raw = event("rebalance-recommendation.json")
    raw["detail"]["instance-id"] = value
    d = classify(raw, WATCH)
    assert d.outcome == "reject" and "instance-id" in d.reason


@pytest.mark.parametrize(
    ("cluster", "watched"),
    [
        ("gpu-spot", True),
        ("arn:aws:ecs:us-east-1:123456789012:cluster/gpu-spot", True),
        ("arn:aws:ecs:eu-west-1:123456789012:cluster/gpu-spot", False),  # the same name, another region
        ("arn:aws:ecs:us-east-1:210987654321:cluster/gpu-spot", False),  # another account
        ("arn:aws:ecs:us-east-1:123456789012:cluster/prod-web", False),
        ("arn:aws:ecs:cluster/gpu-spot", False),  # not an ARN
    ],
)
def test_a_watched_cluster_is_listed_and_in_the_stack_s_region_and_account(cluster, watched):
    pinned = Settings(clusters=("gpu-spot",), region="us-east-1", account="123456789012")
    assert pinned.watches(cluster) is watched
    every = Settings(region="us-east-1", account="123456789012")  # no list: every cluster, but only here
    assert every.watches(cluster) is (pinned.elsewhere(cluster) is None)


def test_a_container_instance_event_of_a_same_named_cluster_elsewhere_is_ignored(event):
    raw = event("ecs-container-instance-state-change.json")
    raw["detail"]["clusterArn"] = raw["detail"]["clusterArn"].replace(":123456789012:", ":210987654321:")
    pinned = Settings(clusters=("gpu-spot",), account="123456789012")
    assert classify(raw, pinned).outcome == "ignore"


def test_a_refusal_is_one_line_whatever_the_input_put_in_it():
    """Found by the random property profile: a key holding a newline made the dead-letter reason two lines
    ('version.\\n: holds a placeholder, ...'). The reason shows it escaped."""
    from spotguard.domain.envelope import envelope

    raw = {
        "version": {"\n": "<>"},
        "id": "1e5527d7-bb36-4607-3370-4164db56a40e",
        "detail-type": "EC2 Spot Instance Interruption Warning",
        "source": "aws.ec2",
        "detail": {},
        "time": "2026-11-21T14:00:00Z",
    }
    refused = envelope(raw)
    assert refused.reason == "version.\\n: holds a placeholder, not a real value"  # type: ignore[union-attr]
    assert "\n" not in refused.reason  # type: ignore[union-attr]
